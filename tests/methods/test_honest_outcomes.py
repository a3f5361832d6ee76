"""Honest outcomes when the model misbehaves (issue P2-1c): TrustVI never calls a run
``converged`` when q ran away or when the model fails on much of q's mass."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from stanvi.families import FullRank, MeanField
from stanvi.estimators.elbo import standard_normal
from stanvi.methods.checks import divergence, improper_direction

# parameters { vector[2] x; } model { if (x[1] > 0) reject(...); x ~ std_normal(); }, also
# used by tests/diagnostics (one compile)
REJECT_HALF = Path(__file__).resolve().parents[1] / "models" / "reject_half.stan"


def flat(z):
    """parameters { real x; } model { }: ∫p = ∞, the ELBO grows without bound with q's sd."""
    return 0.0 * jnp.sum(z)


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_improper_posterior_fails_with_the_reason(family):
    fit = stanvi.fit(flat, dim=1, method="trustvi", family=family, seed=0, progress=False,
                     draws=10)
    assert fit.status == "failed"
    assert "improper" in fit.message and "grew without bound" in fit.message


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_model_failing_on_half_of_q_fails_with_the_stan_message(family):
    """Before: status 'converged' with no accepted step and 53% of q's draws rejected."""
    fit = stanvi.fit(str(REJECT_HALF), method="trustvi", family=family, seed=0, progress=False,
                     draws=10)
    assert fit.status == "failed", fit.message
    assert "x[1] must be <= 0" in fit.message
    assert "fails at" in fit.message and "% of q's draws" in fit.message
    assert 0.2 < fit.info["failing_fraction"] < 0.8


def _nan_curvature_target():
    """log p = −‖z‖²/2 with its gradient exact and every Hessian-vector product NaN (a custom
    JVP rule on the gradient): q's start is as good as any, but no TrustVI step can be assessed."""
    from stanvi.targets import JaxTarget

    @jax.custom_jvp
    def gradient(x):
        return x

    @gradient.defjvp
    def _gradient_jvp(primals, tangents):
        return gradient(primals[0]), jnp.nan * tangents[0]

    @jax.custom_jvp
    def half_square(x):
        return 0.5 * x ** 2

    @half_square.defjvp
    def _half_square_jvp(primals, tangents):
        return half_square(primals[0]), gradient(primals[0]) * tangents[0]

    return JaxTarget(lambda z: -jnp.sum(half_square(z)), 2)


@pytest.mark.parametrize("profile, remedy, options", [
    ("paper", "the default profile's Laplace warm start", {}),
    ("stochastic", "another init may", {}),
    ("default", "Laplace warm start", {"fixed_hessian": "hvp", "warm_start": "none"})])
def test_trustvi_whose_every_step_fails_is_failed_not_max_iters(profile, remedy, options):
    """Before: 'max_iters' ("raise the limit"), as on example-models' roaches and salm under the
    paper profile, where the Hessian-vector products overflow at q's start."""
    target = _nan_curvature_target()
    assert np.allclose(jax.grad(target.jax_log_density)(jnp.ones(2)), -1.0)
    fit = stanvi.fit(target, method="trustvi", profile=profile, seed=0, progress=False, draws=10,
                     **options)
    assert fit.status == "failed", fit.message
    assert fit.message.startswith("no step was ever accepted: every proposed step was rejected")
    assert remedy in fit.message and fit.info["accepted"] == 0
    assert fit.info["rejected_failure"] > 0


def test_default_profile_needs_no_curvature_from_the_model():
    """The same target under ``default``: its Stein model is built from gradients alone, so the
    non-finite Hessian-vector products never matter, and the answer is N(0, I)'s exactly."""
    fit = stanvi.fit(_nan_curvature_target(), method="trustvi", seed=0, progress=False, draws=10)
    assert fit.status == "converged", fit.message
    assert np.allclose(fit.params, 0.0, atol=1e-4)


def test_divergence_thresholds():
    mf = MeanField(2)
    assert divergence(mf, np.array([0.0, 0.0, 1.0, 2.0])) is None
    assert "grew without bound" in divergence(mf, np.array([0.0, 0.0, 1.0, 24.0]))
    assert "non-finite" in divergence(mf, np.array([np.nan, 0.0, 1.0, 2.0]))
    assert "mean ran away" in divergence(mf, np.array([2e15, 0.0, 1.0, 2.0]))
    fr = FullRank(2, diagonal="log")
    assert divergence(fr, np.array([0.0, 0.0, 0.0, 0.5, 0.0])) is None
    assert "grew without bound" in divergence(fr, np.array([0.0, 0.0, 0.0, 1e11, 0.0]))


# ------------------------------------------------------------------------------ errors a user can read (items 7, 8)

def gaussian2(z):
    return -0.5 * jnp.sum(z * z)


@pytest.mark.parametrize("options, words", [
    ({"max_iters": "abc"}, ["max_iters", "int", "'abc'"]),
    ({"delta0": "big"}, ["delta0", "float"]),
    ({"solver": 3}, ["solver", "str"]),
])
def test_option_values_are_type_checked(options, words):
    with pytest.raises(TypeError) as info:
        stanvi.fit(gaussian2, dim=2, progress=False, **options)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_numeric_option_given_as_int_is_accepted():
    fit = stanvi.fit(gaussian2, dim=2, progress=False, draws=5, delta0=1, max_iters=5)
    assert fit.options.delta0 == 1.0 and isinstance(fit.options.delta0, float)


@pytest.mark.parametrize("draws", [0, -5, 2.5, True])
def test_bad_draws_named(draws):
    with pytest.raises(ValueError, match="draws must be a positive integer"):
        stanvi.fit(gaussian2, dim=2, progress=False, draws=draws)


def test_bad_budget_named():
    with pytest.raises(ValueError, match="max_oracle_calls"):
        stanvi.fit(gaussian2, dim=2, progress=False, max_oracle_calls=-1)


def test_nan_init_blames_the_init():
    with pytest.raises(ValueError, match="init has non-finite unconstrained values"):
        stanvi.fit(gaussian2, dim=2, progress=False, init=np.array([np.nan, 0.0]))


def test_cli_names_a_bad_option_value_in_one_line():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from conftest import MODELS_DIR  # noqa: PLC0415

    stan = MODELS_DIR / "bernoulli" / "bernoulli.stan"
    res = subprocess.run([sys.executable, "-m", "stanvi.cli", "fit", str(stan), "--data",
                          str(stan.with_suffix(".data.json")), "--option", "max_iters=abc"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("stanvi: comp")]
    assert len(lines) == 1 and "max_iters must be int" in lines[0], res.stderr


# ------------------------------------------------------------------------------ same seed, same result (item 5)

def test_auto_hvp_choice_is_stored_once_per_library_and_data(eight_schools):
    """hvp_method='auto' no longer reads a clock per target: the choice made for a (library,
    data) pair is stored next to the library and every later load adopts it — so a fit under
    load and the same seed alone use the same HVP method, and give the same result."""
    first = stanvi.load(eight_schools.library_path, eight_schools.data_json, progress=False)
    assert first.hvp_method_used in ("exact", "finite_difference")  # decided at load
    path = eight_schools.library_path.parent / "hvp_choice.json"
    table = json.loads(path.read_text())
    key = hashlib.sha256(eight_schools.data_json.encode()).hexdigest()[:20]
    chosen = table[key]["method"]
    assert chosen == first.hvp_method_used
    # a stored choice is obeyed, whatever a new timing would say
    other = "exact" if chosen == "finite_difference" else "finite_difference"
    table[key]["method"] = other
    path.write_text(json.dumps(table))
    try:
        for _ in range(2):
            again = stanvi.load(eight_schools.library_path, eight_schools.data_json,
                                progress=False)
            assert again.hvp_method_used == other
    finally:
        table[key]["method"] = chosen
        path.write_text(json.dumps(table))


def test_fit_and_cli_set_the_hvp_method(eight_schools):
    from conftest import MODELS_DIR  # noqa: PLC0415

    stan = MODELS_DIR / "eight_schools" / "eight_schools_noncentered.stan"
    data = MODELS_DIR / "eight_schools" / "eight_schools.data.json"
    fit = stanvi.fit(str(stan), str(data), hvp_method="finite_difference", progress=False,
                     draws=5, max_iters=3)
    assert fit.info["hvp_method"] == "finite_difference"
    with pytest.raises(ValueError, match="stanvi.load"):
        stanvi.fit(eight_schools, hvp_method="exact", progress=False, draws=5)
    from stanvi.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["fit", str(stan), "--hvp-method", "exact"])
    assert args.hvp_method == "exact"


# ------------------------------------------------------------------------------ generated quantities that throw (item 4)

GQ_THROWS = """
parameters { real mu; }
model { mu ~ normal(15, 10); }
generated quantities { int k = poisson_log_rng(mu); }
"""


def test_throwing_generated_quantity_keeps_the_draw(tmp_path):
    """poisson_log_rng throws when mu > ~20.8: before, the whole draw became NaN and summary()
    reported mu's mean as 10.0 where q's was 13.9.  Now only k is NaN there, counted, warned."""
    path = tmp_path / "gq_throws.stan"
    path.write_text(GQ_THROWS)
    with pytest.warns(UserWarning, match="generated quantities could not be computed") as rec:
        fit = stanvi.fit(str(path), method="trustvi", seed=0, progress=False, draws=1000)
    assert "poisson_log_rng" in str(rec[0].message)
    mu, k = fit.draws["mu"], fit.draws["k"]
    assert np.all(np.isfinite(mu))                      # every draw's parameter is kept
    failed = np.isnan(k)
    assert fit.info["gq_failed_draws"] == failed.sum() > 50
    assert np.all(mu[failed] > 20.0) and np.all(mu[~failed] < 21.0)
    np.testing.assert_array_equal(mu, fit.unconstrained_draws[:, 0])  # real mu: identity
    summary = fit.summary()
    assert summary.loc["mu", "mean"] == pytest.approx(mu.mean(), rel=1e-12)
    assert abs(summary.loc["mu", "mean"] - fit.mean[0]) < 5 * fit.covariance[0, 0] ** 0.5 / 30


# ------------------------------------------------------------------------------ the command line (item 9)

def _cli(*args, env=None, timeout=300):
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "stanvi.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def test_cli_output_that_is_a_file_is_refused_before_the_fit(tmp_path):
    from conftest import MODELS_DIR  # noqa: PLC0415

    stan = MODELS_DIR / "bernoulli" / "bernoulli.stan"
    existing = tmp_path / "out.txt"
    existing.write_text("keep me")
    res = _cli("fit", str(stan), "--data", str(stan.with_suffix(".data.json")), "--output",
               str(existing))
    assert res.returncode == 1
    assert "is an existing file; give a directory" in res.stderr
    assert "Traceback" not in res.stderr and existing.read_text() == "keep me"


def test_cli_read_only_cache_dir_names_it_and_the_remedy(tmp_path):
    import os  # noqa: PLC0415

    if os.geteuid() == 0:
        pytest.skip("root can write into a read-only directory; the check cannot fail here")
    cache = tmp_path / "ro"
    cache.mkdir()
    cache.chmod(0o500)
    from conftest import MODELS_DIR  # noqa: PLC0415

    res = _cli("compile", str(MODELS_DIR / "bernoulli" / "bernoulli.stan"),
               env={"STANVI_CACHE_DIR": str(cache)})
    assert res.returncode == 1 and str(cache) in res.stderr and "STANVI_CACHE_DIR" in res.stderr


def test_cache_dir_check_names_the_directory(tmp_path, monkeypatch):
    """The check itself (runs as root too): an unwritable or uncreatable directory is a
    CacheDirError naming it and STANVI_CACHE_DIR."""
    from stanvi.errors import CacheDirError  # noqa: PLC0415
    from stanvi.stan import cache  # noqa: PLC0415

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("STANVI_CACHE_DIR", str(blocker / "sub"))
    with pytest.raises(CacheDirError, match="STANVI_CACHE_DIR") as info:
        cache.cache_root()
    assert str(blocker / "sub") in str(info.value)
    assert isinstance(info.value, PermissionError)  # optional users of the cache still cope
    monkeypatch.setattr(cache.os, "access", lambda *a: False)
    monkeypatch.setenv("STANVI_CACHE_DIR", str(tmp_path / "ok"))
    root = cache.cache_root()   # a read-only root is usable for what is built there ...
    with pytest.raises(CacheDirError, match="not writable"):   # ... a build needs to write
        cache.lock_for(root / "toolchain", "model")


def test_a_read_only_cache_that_holds_the_model_is_used(tmp_path, monkeypatch):
    """Issue T3-2 item 8: a read-only cache that already holds the built model was refused
    (CacheDirError); read-only site caches are common on clusters.  A cache with the model is
    used; building something new there is the clear CacheDirError."""
    import shutil  # noqa: PLC0415

    from conftest import MODELS_DIR  # noqa: PLC0415
    from stanvi.errors import CacheDirError  # noqa: PLC0415
    from stanvi.stan import cache  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    built = compile_model(MODELS_DIR / "bernoulli" / "bernoulli.stan", progress=False)
    entry = built.library.parent                    # <root>/<toolchain>/models/<entry>
    ro_root = tmp_path / "site-cache"
    shutil.copytree(entry, ro_root / entry.parent.parent.name / "models" / entry.name)
    monkeypatch.setenv("STANVI_CACHE_DIR", str(ro_root))
    # read-only as a non-root user sees it (root's os.access passes everywhere)
    monkeypatch.setattr(cache, "writable", lambda path: False)
    found = compile_model(MODELS_DIR / "bernoulli" / "bernoulli.stan", progress=False)
    assert found.library.parent.parent.parent.parent == ro_root
    fit = stanvi.fit(found, data=MODELS_DIR / "bernoulli" / "bernoulli.data.json",
                     progress=False, draws=10)
    assert fit.converged
    with pytest.raises(CacheDirError, match="not writable"):
        compile_model("parameters { real y; } model { y ~ normal(0, 1); }", name="new_one",
                      progress=False)


def test_cli_interrupt_prints_one_line_and_exits_130(tmp_path):
    """SIGINT during a fit: 'stanvi: interrupted', status 130, no traceback."""
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import time  # noqa: PLC0415

    from conftest import MODELS_DIR  # noqa: PLC0415

    stan = MODELS_DIR / "hierarchical_radon" / "hierarchical_radon.stan"
    proc = subprocess.Popen([sys.executable, "-m", "stanvi.cli", "fit", str(stan), "--data",
                             str(stan.with_suffix(".data.json")), "--method", "trustvi",
                             "--profile", "paper", "--option", "tol_model=null",
                             "--option", "max_iters=100000", "--option", "delta_min=1e-300",
                             "--output", str(tmp_path / "out")],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(12)  # inside the fit (imports and a cached model load take a few seconds)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stanvi: interrupted" in err and "Traceback" not in err


def test_hfsgvi_on_an_improper_posterior_fails_with_the_reason():
    """Before: status 'max_iters' with q's sd infinite and a summary mean of 5.7e214."""
    fit = stanvi.fit(flat, dim=1, method="hfsgvi", seed=0, progress=False, draws=10)
    assert fit.status == "failed"
    assert fit.message.startswith("overflow") and "may be improper" in fit.message
    assert np.all(np.isfinite(fit.params))


# ------------------------------------------------------------------------------ ADVI on an improper posterior (item 3)

@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_advi_on_an_improper_posterior_fails_with_the_reason(family):
    """Before: full-rank ADVI said 'converged' with an empty message (Stan's own rule: the ELBO
    grows like log σ, so its relative change falls below tol_rel_obj); mean-field failed with a
    bare NaN-gradient message."""
    fit = stanvi.fit(flat, dim=1, method="advi", family=family, seed=0, progress=False,
                     draws=10)
    assert fit.status == "failed"
    assert "may be improper" in fit.message, fit.message


def test_advi_improper_check_keeps_stans_status_and_can_be_turned_off():
    fit = stanvi.fit(flat, dim=1, method="advi", family="fullrank", seed=0, progress=False,
                     draws=10)
    assert fit.info["sgd_status"] == "converged"
    assert "keeps rising" in fit.message and "would report 'converged'" in fit.message
    stan = stanvi.fit(flat, dim=1, method="advi", family="fullrank", seed=0, progress=False,
                      draws=10, improper_check=False)
    assert stan.status == "converged"


class _LogDensityOnly:
    """A minimal target for the probe: log p of each row, every row evaluable."""

    def __init__(self, log_p):
        self.log_p = log_p

    def log_density(self, z):
        values = np.array([self.log_p(row) for row in np.asarray(z)])
        return type("Res", (), {"ok": np.isfinite(values), "log_density": values})()


PROPER = {   # proper densities, including a Cauchy whose tails decay only like 1/x^2
    "normal": lambda z: -0.5 * float(np.sum(z ** 2)),
    "cauchy": lambda z: -float(np.sum(np.log1p(z ** 2))),
    "wide normal": lambda z: -0.5 * float(np.sum((z / 1e6) ** 2)),
}


@pytest.mark.parametrize("name", sorted(PROPER))
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_improper_probe_passes_proper_posteriors_at_any_q_width(name, scale):
    mf = MeanField(3)
    params = np.concatenate([np.array([0.3, -0.2, 0.1]), np.full(3, np.log(scale))])
    eps = standard_normal(jax.random.key(1), 128, 3)
    assert improper_direction(_LogDensityOnly(PROPER[name]), mf, params, eps) is None


@pytest.mark.parametrize("log_p, coordinate", [
    (lambda z: -0.5 * float(z[0] ** 2 + z[2] ** 2), 2),              # z[1] flat: no prior, no data
    (lambda z: -0.5 * float(z[0] ** 2 + z[1] ** 2) - 0.5 * float(np.log(abs(z[2]))), 3),
    (lambda z: float(z[0]) - 0.5 * float(z[1] ** 2 + z[2] ** 2), 1),  # <lower=0> with no prior
])
def test_improper_probe_names_the_improper_direction(log_p, coordinate):
    """p decaying slower than 1/|x| along one coordinate (flat; |x|^-1/2; exp(u) from a
    positive parameter's Jacobian with no prior): the ELBO keeps rising as q widens there."""
    mf = MeanField(3)
    params = np.zeros(6)
    params[2 + coordinate] = 3.0            # q widest along the improper coordinate
    eps = standard_normal(jax.random.key(2), 128, 3)
    message = improper_direction(_LogDensityOnly(log_p), mf, params, eps)
    assert message is not None and f"coordinate {coordinate} " in message
    assert "may be improper" in message


def test_advi_runaway_is_blamed_on_the_steps_unless_the_probe_finds_an_improper_direction():
    """A q that ran away is not proof of an improper posterior: posteriordb's mesquite (proper)
    ran away under ADVI at eta = 100.  The probe from q0 along the runaway coordinates decides."""
    import jax as _jax

    from stanvi.methods import advi
    from stanvi.methods.base import OracleLedger
    from stanvi.targets import JaxTarget

    mf = MeanField(2)
    runaway = np.array([0.0, 0.0, 0.0, 200.0])          # sd e^200 along coordinate 2
    q0 = np.zeros(4)
    opts = advi.Options()
    key = _jax.random.PRNGKey(0)
    proper = JaxTarget(lambda z: -0.5 * jnp.sum(z ** 2), 2)
    msg = advi._runaway_message(proper, mf, runaway, q0, key, opts, OracleLedger(), 100.0, "m")
    assert msg.startswith("ADVI's steps diverged") and "eta = 100" in msg
    assert "may be improper" not in msg and msg.endswith("(m)")
    flat_in_2 = JaxTarget(lambda z: -0.5 * z[0] ** 2 + 0.0 * z[1], 2)
    msg = advi._runaway_message(flat_in_2, mf, runaway, q0, key, opts, OracleLedger(), 1.0, "m")
    assert "coordinate 2" in msg and "may be improper" in msg


def test_advi_steps_that_overflow_raise_diverged_error_with_the_methods_status():
    """eta = 1e308 takes q's mean past float64 in two steps: there is no q to draw from, so
    ``stanvi.fit`` raises DivergedError (a VIError) carrying the method's 'failed' and its reason,
    which ``stanvi batch`` records as a failed fit, not as an error of the call."""
    from stanvi.targets import JaxTarget

    target = JaxTarget(lambda z: -jnp.sum((z - 1.0) ** 2), 1)   # N(1, 1/2)
    with pytest.raises(stanvi.DivergedError) as caught:
        stanvi.fit(target, method="advi", eta=1e308, adapt_engaged=False, seed=1, progress=False)
    err = caught.value
    assert isinstance(err, stanvi.VIError) and err.method == "advi" and err.status == "failed"
    assert err.method_message.startswith("ADVI's steps diverged: the variational parameters "
                                         "became non-finite")
    assert "eta = 1e+308" in str(err)


# ------------------------------------------------------------------------------ issue 13 item 10

@pytest.mark.parametrize("method", ["trustvi", "advi"])
def test_improper_posterior_warns_with_the_hint_and_summaries_stay_finite(method):
    """A bad-input probe (``parameters { real x; } model { }``) got a Fit with ±inf draws and
    status 'failed' but no word of why when progress=False: the NotConvergedWarning now carries
    the method's hint, and the summary leaves non-finite draws out (NaN where none is finite)."""
    with pytest.warns(stanvi.NotConvergedWarning, match="may be improper"):
        fit = stanvi.fit(flat, dim=1, method=method, seed=0, progress=False, draws=50)
    assert fit.status == "failed"
    table = fit.summary()
    assert list(table.index) == ["z.1"] and not np.isinf(table.to_numpy()).any()
    draws = fit.draws["z.1"]
    finite = draws[np.isfinite(draws)]
    if finite.size > 1:
        assert table.loc["z.1", "mean"] == pytest.approx(finite.mean(), rel=1e-12)
    else:
        assert np.isnan(table.loc["z.1", "mean"])


@pytest.mark.parametrize("seed", [2**63, 2**32, -1, 1.5, "3", True])
def test_bad_seeds_are_named(seed):
    """seed=2**63 raised a raw OverflowError from deep inside; seeds are checked first."""
    with pytest.raises(ValueError, match=r"seed must be an integer from 0 to 4294967295"):
        stanvi.fit(flat, dim=1, seed=seed, progress=False)


def test_largest_seed_is_accepted():
    fit = stanvi.fit(lambda z: -0.5 * jnp.sum(z**2), dim=1, seed=2**32 - 1, progress=False,
                     draws=5)
    assert fit.seed == 2**32 - 1
