"""JAX is imported when stanvi first uses it (stanvi/lazy_jax.py, docs/architecture.md#lazy-jax).

A new process that imports stanvi and fits a Stan model on the host path never imports JAX
(issue T3-1: ``import jax`` was most of such a process's second); whoever imports JAX first,
stanvi or the user, gets stanvi's settings (float64, partitionable threefry, the compilation
cache) before any array exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stanvi.lazy_jax import LazyModule, jit

from conftest import data_file

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_HOST_FIT = """
import json, sys
import stanvi
after_import = "jax" in sys.modules
statuses = []
for family in ("meanfield", "fullrank"):
    fit = stanvi.fit(sys.argv[1], data=sys.argv[2], method="trustvi", family=family, seed=3,
                     progress=False)
    statuses.append(fit.status)
    draws = fit.draws["theta"]
print(json.dumps({"after_import": after_import, "after_fits": "jax" in sys.modules,
                  "statuses": statuses, "shape": list(draws.shape)}))
"""


def test_import_and_host_path_fits_do_not_import_jax(compiled):
    library = compiled("eight_schools").library
    out = _python(_HOST_FIT, str(library), str(data_file("eight_schools")))
    assert out["after_import"] is False
    assert out["after_fits"] is False, "a host-path fit imported JAX"
    assert out["statuses"] == ["converged", "converged"]
    assert out["shape"][-1] == 8


_SETTINGS_AFTER = """
import json, sys
import stanvi
import jax, jax.numpy as jnp
print(json.dumps({"dtype": str(jnp.ones(2).dtype),
                  "partitionable": bool(jax.config.jax_threefry_partitionable),
                  "cache": jax.config.jax_compilation_cache_dir,
                  "min_time": jax.config.jax_persistent_cache_min_compile_time_secs,
                  "hook_left": any(type(f).__name__ == "_ConfigureOnImport" for f in sys.meta_path),
                  "loader": type(jax.__loader__).__name__}))
"""


def test_users_jax_imported_after_stanvi_gets_stanvis_settings(tmp_path):
    out = _python(_SETTINGS_AFTER, env={"STANVI_CACHE_DIR": str(tmp_path), "STANVI_JAX_CACHE": "1",
                                        "JAX_ENABLE_X64": "0"})
    assert out["dtype"] == "float64"
    assert out["partitionable"] is True
    assert out["cache"] == str(tmp_path / "jax")
    assert out["min_time"] == 0.0
    assert out["hook_left"] is False          # one shot: the finder leaves sys.meta_path
    assert out["loader"] == "SourceFileLoader"  # jax keeps its own loader


def test_jax_imported_before_stanvi_gets_stanvis_settings(tmp_path):
    code = _SETTINGS_AFTER.replace("import stanvi\nimport jax, jax.numpy as jnp",
                                   "import jax, jax.numpy as jnp\nimport stanvi")
    assert code != _SETTINGS_AFTER
    out = _python(code, env={"STANVI_CACHE_DIR": str(tmp_path), "STANVI_JAX_CACHE": "1"})
    assert out["dtype"] == "float64"
    assert out["cache"] == str(tmp_path / "jax")
    assert out["hook_left"] is False


def test_stand_in_reads_attributes_and_submodules():
    import jax  # noqa: PLC0415
    import jax.numpy  # noqa: PLC0415

    stand_in = LazyModule("jax")
    assert stand_in.numpy is jax.numpy
    assert stand_in.numpy.sum is jax.numpy.sum
    assert "numpy" in vars(stand_in)       # kept: the next read is a plain attribute
    assert stand_in.scipy.special.ndtr(0.0) == 0.5   # a submodule jax does not import itself
    with pytest.raises(AttributeError, match="no_such_name"):
        stand_in.no_such_name  # noqa: B018
    assert not hasattr(stand_in, "no_such_name")    # hasattr works on a stand-in


def test_lazy_jit_compiles_once_with_its_options():
    calls = []

    @jit(static_argnums=(1,))
    def power(x, n):
        calls.append(n)                  # runs while tracing only
        return x ** n

    assert "jitted" not in vars(power)
    np.testing.assert_allclose(power(np.float64(3.0), 2), 9.0)
    np.testing.assert_allclose(power(np.float64(2.0), 2), 4.0)   # same trace: no new call
    np.testing.assert_allclose(power(np.float64(2.0), 3), 8.0)   # static argument: new trace
    assert calls == [2, 3]
    assert power.__name__ == "power"
    assert "jitted" in vars(power)
