"""While a method fits a small problem, BLAS runs on one thread, and is restored after
(stanvi.methods.blas_threads; docs/algorithms.md#blas-threads)."""

from __future__ import annotations

import pytest
import threadpoolctl   # a dependency of stanvi (pyproject.toml): no skip when it is missing

import stanvi
from stanvi.methods import blas_threads
from stanvi.targets import JaxTarget


def _blas_threads() -> dict[str, int]:
    """Threads of each BLAS library loaded, by file."""
    return {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"}


def _restored(before: dict[str, int]) -> bool:
    """Every library loaded before has its threads back (a fit may load another: SciPy's)."""
    after = _blas_threads()
    return all(after[path] == n for path, n in before.items())


@pytest.fixture(autouse=True)
def two_blas_threads():
    """The suite runs with one BLAS thread (tests/conftest.py); these tests need a caller with
    more, or a limit to one thread would change nothing they could see."""
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        assert set(_blas_threads().values()) == {2}
        yield


def test_limit_applies_to_small_problems_only_and_is_restored(monkeypatch):
    before = _blas_threads()
    assert before, "no BLAS library found by threadpoolctl"
    with blas_threads.blas_limited(blas_threads.SMALL_DIM):
        assert set(_blas_threads().values()) == {1}
    assert _blas_threads() == before
    with blas_threads.blas_limited(blas_threads.SMALL_DIM + 1):
        assert _blas_threads() == before
    monkeypatch.setenv("STANVI_BLAS_THREADS", "keep")
    with blas_threads.blas_limited(3):
        assert _blas_threads() == before


def test_a_fit_runs_its_method_with_one_blas_thread(monkeypatch):
    """The method's run sees one BLAS thread; the caller's setting is back afterwards, also
    when the run raises."""
    import stanvi.methods.trustvi as trustvi  # noqa: PLC0415

    seen: list = []
    original = trustvi.run

    def run(*args, **kwargs):
        seen.append(_blas_threads())
        return original(*args, **kwargs)
    monkeypatch.setattr(trustvi, "run", run)
    before = _blas_threads()
    target = JaxTarget(lambda z: -0.5 * (z @ z), 2)
    stanvi.fit(target, method="trustvi", seed=0, progress=False, draws=10)
    assert seen and set(seen[0].values()) == {1}
    assert _restored(before)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(trustvi, "run", boom)
    with pytest.raises(RuntimeError, match="boom"):
        stanvi.fit(target, method="trustvi", seed=0, progress=False, draws=10)
    assert _restored(before)
