"""The compile cache: content-addressed, safe under concurrency, self-repairing.

Every test compiles its own program carrying a random comment, so no state left in the cache by
earlier runs can make a test pass (or fail).  The libraries these tests truncate are never loaded
in this process (truncating a mapped library would crash it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np
import pytest

import stanvi
from stanvi.stan.cache import file_sha256
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.usefixtures("compile_in_background")


def unique_program(mean: float = 1.5) -> str:
    return (f"// stanvi cache test {uuid.uuid4().hex}\n"
            "parameters {\n  real mu;\n}\n"
            f"model {{\n  mu ~ normal({mean}, 2);\n}}\n")


def normal_lpdf(x, mean, sd):
    return -0.5 * ((x - mean) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)


@pytest.fixture(scope="module")
def file_model(tmp_path_factory):
    """A `.stan` file with a unique program, compiled for the first time."""
    path = tmp_path_factory.mktemp("cache") / "cache_file_model.stan"
    path.write_text(unique_program(mean=0.5))
    return path, compile_model(path, progress=False)


def test_first_compile_builds(file_model):
    path, first = file_model
    assert first.cached is False
    assert first.compile_seconds > 0
    assert first.name == "cache_file_model"
    assert first.library.is_file()
    record = json.loads((first.library.parent / "build.json").read_text())
    assert record["sha256"] == file_sha256(first.library)
    assert record["hvp_exact"] is True and first.hvp_exact is True
    assert first.stan_file.read_text() == path.read_text()


def test_the_services_library_links_the_kept_model_object(file_model):
    """The model library's build keeps its model object in the cache entry; the services
    library (Stan's algorithms) links it instead of compiling the model's C++ again."""
    from stanvi.stan.compiler import model_object  # noqa: PLC0415
    from stanvi.stan.services_build import services_library  # noqa: PLC0415

    _, first = file_model
    entry = first.library.parent
    kept = model_object(entry, exact=True)
    assert kept.is_file() and not list(entry.glob(".model*.o"))   # no stray temporaries
    before = kept.stat().st_mtime_ns
    services_library(first, progress=False)
    record = json.loads((entry / "services.json").read_text())
    assert record["model_object_seconds"] < 1.0       # linked, not compiled (~10-30 s)
    assert kept.stat().st_mtime_ns == before and not list(entry.glob(".model_services*"))


def test_second_compile_is_cached_and_fast(file_model, tmp_path):
    path, first = file_model
    for again_from in (path, str(path)):
        start = time.perf_counter()
        again = compile_model(again_from, progress=False)
        elapsed = time.perf_counter() - start
        assert again.cached is True
        assert again.library == first.library
        assert again.hvp_exact == first.hvp_exact
        assert again.compile_seconds == 0.0
        # a cache hit reads build.json and hashes a ~10 MB library: milliseconds, not seconds
        assert elapsed < 1.0, elapsed
    assert stanvi.compile(path, progress=False) == first.library
    # the same name and content elsewhere: the same library
    (tmp_path / path.name).write_text(path.read_text())
    assert compile_model(tmp_path / path.name, progress=False).library == first.library


def test_edited_program_gets_new_library(file_model, tmp_path):
    path, first = file_model
    old_sha = file_sha256(first.library)
    edited_path = tmp_path / path.name                       # same file name, edited content
    edited_path.write_text(path.read_text().replace("normal(0.5, 2)", "normal(-0.5, 2)"))
    edited = compile_model(edited_path, progress=False)
    assert edited.cached is False
    assert edited.library != first.library
    assert file_sha256(first.library) == old_sha              # the old library is untouched
    t = stanvi.load(edited)
    np.testing.assert_allclose(t.log_density_at(np.array([0.25])), normal_lpdf(0.25, -0.5, 2),
                               rtol=1e-14)
    assert compile_model(path, progress=False).library == first.library


def test_broken_cache_entries_are_rebuilt(capsys):
    code = unique_program(mean=3.0)
    first = compile_model(code, progress=False)
    assert first.cached is False
    entry = first.library.parent
    # 1. a truncated library (e.g. a crash while copying) no longer matches build.json's hash
    size = first.library.stat().st_size
    with open(first.library, "r+b") as fh:
        fh.truncate(size // 2)
    rebuilt = compile_model(code, progress=False)
    assert rebuilt.cached is False
    assert rebuilt.library == first.library
    assert rebuilt.library.stat().st_size > size // 2
    # 2. a missing build.json (an interrupted build) means the entry is incomplete
    (entry / "build.json").unlink()
    capsys.readouterr()
    rebuilt = compile_model(code, progress=True)
    assert rebuilt.cached is False
    assert (entry / "build.json").is_file()
    assert "compiling" in capsys.readouterr().err           # progress shown while compiling
    assert compile_model(code, progress=False).cached is True
    t = stanvi.load(rebuilt)
    np.testing.assert_allclose(t.log_density_at(np.array([1.0])), normal_lpdf(1.0, 3.0, 2),
                               rtol=1e-14)


def test_concurrent_compiles_of_a_new_model():
    code = unique_program(mean=-2.0)
    barrier = threading.Barrier(2)
    results, errors = [None, None], []

    def worker(i):
        try:
            barrier.wait()
            results[i] = compile_model(code, progress=False)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors[0]
    a, b = results
    assert a.library == b.library
    # one thread built it; the other waited on the lock and found it built
    assert sorted([a.cached, b.cached]) == [False, True]
    assert file_sha256(a.library) == json.loads(
        (a.library.parent / "build.json").read_text())["sha256"]
    t = stanvi.load(a)
    np.testing.assert_allclose(t.log_density_at(np.array([0.0])), normal_lpdf(0.0, -2.0, 2),
                               rtol=1e-14)


def test_a_very_long_model_file_name_compiles(tmp_path):
    """Issue T3-2 item 9: a 240-character file name gave a raw OSError [Errno 36] from the
    cache's lock file; the name in the cache's paths is cut to MAX_NAME characters."""
    from stanvi.stan.compiler import MAX_NAME, compile_model

    path = tmp_path / ("m" * 240 + ".stan")
    path.write_text("parameters { real y; } model { y ~ normal(0, 1); } // long name "
                    + uuid.uuid4().hex)
    compiled = compile_model(path, progress=False)
    assert compiled.library.is_file() and len(compiled.name) == MAX_NAME
    assert all(len(part) < 200 for part in compiled.library.parts)
