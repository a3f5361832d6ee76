"""The core install fits without Dask or netCDF4, and what needs them says which extra to install
(issue T3-5 item 6; docs/quickstart.md#extras).

Each check runs in a subprocess whose imports of the optional packages fail, as they would on a
machine where they are not installed (the suite's environment has them all).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = """
import sys
# as if not installed: importing them raises ModuleNotFoundError, importlib.util.find_spec
# returns None
for name in ("dask", "distributed", "netCDF4", "h5netcdf"):
    sys.modules[name] = None
"""


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)


def test_a_fit_needs_neither_dask_nor_netcdf_and_saving_names_the_extra(tmp_path):
    proc = run_without_extras(f"""
        import sys
        from pathlib import Path
        import jax.numpy as jnp
        import stanvi
        fit = stanvi.fit(lambda z: -0.5 * jnp.sum(z ** 2), dim=2, progress=False, draws=100)
        assert fit.converged, fit.message
        fit.summary(); fit.diagnostics(); fit.to_arviz()
        loaded = sorted(m for m, mod in sys.modules.items() if mod is not None
                        and m.split(".")[0] in ("dask", "distributed", "netCDF4", "h5netcdf"))
        assert not loaded, loaded
        out = Path({str(tmp_path / "out")!r})
        try:
            fit.save(out)
        except stanvi.MissingExtraError as exc:
            assert isinstance(exc, ImportError)
            print("SAVE:", exc)
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
        from stanvi.batch.runner import run_batch
        try:
            run_batch([], {str(tmp_path / "runs")!r})
        except stanvi.MissingExtraError as exc:
            print("BATCH:", exc)
    """)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert "pip install 'stanvi[netcdf]'" in lines["SAVE"] and "netCDF4" in lines["SAVE"]
    assert "pip install 'stanvi[batch]'" in lines["BATCH"] and "Dask" in lines["BATCH"]


def test_stanvi_batch_without_dask_fails_before_reading_models(tmp_path):
    proc = run_without_extras(f"""
        import sys
        from stanvi.cli import main
        sys.exit(main(["batch", {str(tmp_path / "no_such_source")!r}, "--methods", "trustvi",
                       "--out", {str(tmp_path / "runs")!r}]))
    """)
    assert proc.returncode == 1, proc.stderr
    assert "pip install 'stanvi[batch]'" in proc.stderr
    assert "no_such_source" not in proc.stderr      # the missing extra is the first thing said
    assert not (tmp_path / "runs").exists()
