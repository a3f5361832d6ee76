"""Fit -> ArviZ DataTree (issue P1-3): groups, dims named from the Stan program, sample stats,
data groups, attrs, the NetCDF round trip, and arviz-stats / arviz-plots working on it unchanged.
"""

from __future__ import annotations

import json
import warnings

import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

import stanvi
from stanvi.output.arviz_io import load_datatree, save_netcdf
from stanvi.stan.declarations import declarations, observed_names, parse_declaration

from conftest import data_dict, data_file

matplotlib.use("Agg")

pytestmark = pytest.mark.usefixtures("compile_in_background")


@pytest.fixture(scope="module")
def tp_gq_fit(compiled):
    """A fit of the model with transformed parameters, generated quantities and data."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stanvi.fit(compiled("tp_gq"), data_file("tp_gq"), method="advi", seed=2,
                          draws=400, progress=False)


@pytest.fixture(scope="module")
def tree(tp_gq_fit):
    return tp_gq_fit.to_arviz()


def test_groups_and_sample_dims(tree, tp_gq_fit):
    assert {"posterior", "sample_stats", "observed_data", "constant_data", "vi_trace",
            "vi_approximation"} <= set(tree.children)
    post = tree["posterior"]
    assert set(post.data_vars) == {"alpha", "beta", "sigma", "mu", "y_rep", "log_lik"}
    n = data_dict("tp_gq")["N"]
    assert post["alpha"].dims == ("chain", "draw") and post["alpha"].shape == (1, 400)
    # dims named from the declarations `vector[N] mu`, `array[N] real y_rep`
    assert post["mu"].dims == ("chain", "draw", "N") and post["mu"].shape == (1, 400, n)
    assert post["y_rep"].dims == ("chain", "draw", "N")
    for name, draws in tp_gq_fit.draws.items():
        np.testing.assert_array_equal(post[name].values[0], draws)


def test_sample_stats(tree, tp_gq_fit):
    ss = tree["sample_stats"]
    np.testing.assert_array_equal(ss["lp"].values[0], tp_gq_fit.log_p)
    np.testing.assert_array_equal(ss["lp_approx"].values[0], tp_gq_fit.log_q)
    np.testing.assert_allclose(ss["log_weight"].values[0], tp_gq_fit.log_p - tp_gq_fit.log_q)
    # Stan's log_g__ = −½‖ε‖² with ε = (z − μ)/σ for the mean-field family
    mu, sd = tp_gq_fit.mean, np.sqrt(np.diag(tp_gq_fit.covariance))
    eps = (tp_gq_fit.unconstrained_draws - mu) / sd
    np.testing.assert_allclose(ss["log_g"].values[0], -0.5 * np.sum(eps**2, axis=1), atol=1e-8)


def test_data_groups(tree):
    data = data_dict("tp_gq")
    obs, const = tree["observed_data"], tree["constant_data"]
    assert set(obs.data_vars) == {"y"}  # the model block has `y ~ normal(mu, sigma)`
    # N is a size (`vector[N] x`): the length of dim N in every group, kept in the attrs
    assert set(const.data_vars) == {"x"} and json.loads(const.attrs["sizes"]) == {"N": data["N"]}
    assert obs["y"].dims == const["x"].dims == ("N",)
    np.testing.assert_array_equal(obs["y"].values, data["y"])
    np.testing.assert_array_equal(const["x"].values, data["x"])


def test_attrs(tree, tp_gq_fit):
    a = tree.attrs
    assert a["inference_library"] == "stanvi" and a["stanvi_version"] == stanvi.__version__
    assert a["method"] == "advi" and a["family"] == "meanfield" and a["profile"] == tp_gq_fit.profile
    assert a["seed"] == 2 and a["status"] == tp_gq_fit.status
    assert json.loads(a["options"])["eta"] == tp_gq_fit.options.eta
    assert a["oracle_scaled"] == pytest.approx(tp_gq_fit.oracle["oracle_scaled"])
    assert a["wall_time"] == pytest.approx(tp_gq_fit.wall_time)
    assert a["pareto_k"] == pytest.approx(tp_gq_fit.diagnostics().khat)
    assert a["verdict"] == tp_gq_fit.diagnostics().verdict
    assert tree["posterior"].attrs["inference_library"] == "stanvi"


def test_vi_trace_group(tree, tp_gq_fit):
    tr = tree["vi_trace"]
    assert tr.sizes["iteration"] == len(tp_gq_fit.trace)
    np.testing.assert_allclose(tr["oracle_scaled"].values, tp_gq_fit.trace.column("oracle_scaled"))
    np.testing.assert_allclose(tr["elbo"].values, tp_gq_fit.trace.column("elbo"), equal_nan=True)
    approx = tree["vi_approximation"]
    np.testing.assert_allclose(approx["mean"].values, tp_gq_fit.mean)
    assert list(approx["unconstrained_parameter"].values) == ["alpha", "beta", "sigma"]


def test_netcdf_round_trip(tree, tmp_path):
    path = save_netcdf(tree, tmp_path / "fit.nc")
    back = load_datatree(path)
    assert set(back.children) == set(tree.children)
    for group in tree.children:
        a, b = tree[group].to_dataset(), back[group].to_dataset()
        assert set(a.data_vars) == set(b.data_vars), group
        for v in a.data_vars:
            assert a[v].dims == b[v].dims, (group, v)
            np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=f"{group}/{v}")
    for key in ("method", "family", "options", "seed", "status", "oracle_scaled", "pareto_k"):
        assert back.attrs[key] == tree.attrs[key], key


def test_arviz_stats_summary_matches_numpy(tree, tp_gq_fit):
    import arviz_stats  # noqa: PLC0415

    table = arviz_stats.summary(tree, kind="stats", round_to="none")
    assert table.loc["alpha", "mean"] == pytest.approx(tp_gq_fit.draws["alpha"].mean(), rel=1e-12)
    assert table.loc["sigma", "sd"] == pytest.approx(tp_gq_fit.draws["sigma"].std(ddof=1), rel=2e-3)
    mu = tp_gq_fit.draws["mu"].mean(axis=0)
    for i in (1, 8, len(mu)):        # Stan's 1-based coordinates: mu[1] is Stan's mu[1]
        assert table.loc[f"mu[{i}]", "mean"] == pytest.approx(mu[i - 1], rel=1e-12)
    assert f"mu[{len(mu)}]" in table.index and "mu[0]" not in table.index
    # the fit's own summary has the same labels and values (issue 13 item 4)
    own = tp_gq_fit.summary()
    assert list(own.index) == list(table.index)
    assert own.loc["mu[8]", "mean"] == pytest.approx(table.loc["mu[8]", "mean"], rel=1e-12)
    # ArviZ's 0-based numbering on request
    zero = arviz_stats.summary(tp_gq_fit.to_arviz(index_origin=0), kind="stats", round_to="none")
    assert zero.loc["mu[0]", "mean"] == pytest.approx(mu[0], rel=1e-12)
    assert list(tree["posterior"]["N"].values) == list(range(1, len(mu) + 1))
    assert tree["posterior"]["draw"].values[0] == 0     # chain and draw keep ArviZ's numbering


def test_arviz_plots_work_unchanged(tree, tmp_path):
    import arviz_plots  # noqa: PLC0415

    pc = arviz_plots.plot_dist(tree, var_names=["alpha", "sigma", "mu"], coords={"N": [1, 2]})
    pc.savefig(tmp_path / "dist.png")
    pc = arviz_plots.plot_forest(tree, var_names=["mu"])
    pc.savefig(tmp_path / "forest.png")
    assert (tmp_path / "dist.png").stat().st_size > 0 and (tmp_path / "forest.png").stat().st_size > 0


def test_log_likelihood_and_predictive_groups(tp_gq_fit):
    import arviz_stats  # noqa: PLC0415

    t = tp_gq_fit.to_arviz(log_likelihood={"y": "log_lik"}, posterior_predictive={"y": "y_rep"})
    assert "log_lik" not in t["posterior"].data_vars and "y_rep" not in t["posterior"].data_vars
    assert t["log_likelihood"]["y"].dims == ("chain", "draw", "N")
    np.testing.assert_array_equal(t["posterior_predictive"]["y"].values[0], tp_gq_fit.draws["y_rep"])
    # PSIS-LOO for an approximate posterior (arviz-stats), straight from the tree
    loo = arviz_stats.loo_approximate_posterior(t, log_p=t["sample_stats"]["lp"],
                                                log_q=t["sample_stats"]["lp_approx"])
    assert np.isfinite(loo.elpd)
    with pytest.raises(KeyError, match="nope"):
        tp_gq_fit.to_arviz(log_likelihood="nope")


def test_jax_target_tree():
    target = stanvi.JaxTarget(lambda z: -0.5 * jnp.sum(z**2), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(target, method="advi", seed=0, draws=200, progress=False,
                         max_iterations=300)
    t = fit.to_arviz()
    # a JAX target's coordinates z.1..z.3 become one vector variable
    assert t["posterior"]["z"].dims == ("chain", "draw", "z_dim_0")
    np.testing.assert_array_equal(t["posterior"]["z"].values[0], fit.unconstrained_draws)
    assert "constant_data" not in t.children and "observed_data" not in t.children


# ------------------------------------------------------------------ reading the Stan program
def test_declaration_dims():
    code = """
    data { int<lower=0> N; int K; array[N] vector[K] y; matrix[N, K] X; }
    parameters {
      real<lower=0> sigma;                  // comment: vector[N] not_this;
      vector<offset=0, multiplier=fmax(1, 2)>[K] beta;
      cholesky_factor_corr[K] L;
      ordered[K - 1] c;
      array[N, 2] real z;
    }
    transformed parameters { vector[N] mu = X * beta; }
    model { for (n in 1:N) { vector[K] local; } y ~ multi_normal_cholesky(beta, L); }
    generated quantities { real y_rep[N]; }
    """
    d = {k: v.dims for k, v in declarations(code).items()}
    assert d["y"] == ("N", "K") and d["X"] == ("N", "K") and d["sigma"] == ()
    assert d["beta"] == ("K",) and d["L"] == ("K", "K") and d["c"] == (None,)
    assert d["z"] == ("N", None) and d["mu"] == ("N",) and d["y_rep"] == ("N",)
    assert "local" not in d and "not_this" not in d
    assert observed_names(code, ["N", "K", "y", "X"]) == ["y"]
    assert observed_names("model { target += normal_lpdf(w | 0, 1); }", ["w", "v"]) == ["w"]
    assert parse_declaration("y ~ normal(0, 1)") is None


def test_duplicate_and_clashing_dims_fall_back(compiled):
    # constrained_params: `cholesky_factor_corr[D] L_Omega` -> (D, L_Omega_dim_1), and data `D`
    # in constant_data cannot also be a dim name there.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(compiled("constrained_params"), data_file("constrained_params"),
                         method="advi", seed=0, draws=100, progress=False, max_iterations=200)
    t = fit.to_arviz()
    assert t["posterior"]["L_Omega"].dims == ("chain", "draw", "D", "L_Omega_dim_1")
    assert t["posterior"]["Omega"].dims == ("chain", "draw", "D", "Omega_dim_1")
    assert t["posterior"]["c"].dims == ("chain", "draw", "c_dim_0")  # ordered[K_ord - 1]
    assert set(t["observed_data"].data_vars) == {"y_ord", "counts", "y_mvn"}
    assert "D" in json.loads(t["constant_data"].attrs["sizes"])


def test_one_dim_rule_in_every_group_and_attributes_once(compiled, tmp_path):
    # eight schools: `array[J] real y` (observed), `array[J] real<lower=0> sigma` (constant)
    # and `vector[J] theta_tilde` all get dim J; J itself is the dim's length (issue T3-5
    # item 4: constant_data said sigma_dim_0); the fit's attributes are on the root only.
    fit = stanvi.fit(compiled("eight_schools"), data_file("eight_schools"), method="trustvi",
                     seed=0, draws=100, progress=False)
    t = fit.to_arviz()
    assert t["posterior"]["theta_tilde"].dims == ("chain", "draw", "J")
    assert t["observed_data"]["y"].dims == ("J",) and t["constant_data"]["sigma"].dims == ("J",)
    assert list(t["constant_data"]["sigma"].coords["J"].values) == list(range(1, 9))
    assert json.loads(t["constant_data"].attrs["sizes"]) == {"J": 8}
    assert "J" not in t["constant_data"].data_vars
    assert t.attrs["method"] == "trustvi" and "pareto_k" in t.attrs
    for group in ("posterior", "sample_stats", "observed_data", "constant_data"):
        own = {k for k in t[group].attrs if not k.startswith(("created", "creation", "sample_dims"))}
        assert own <= {"inference_library", "sizes"}, (group, own)
    fit.save(tmp_path / "es.nc")   # the size comes back as data
    assert int(stanvi.read(tmp_path / "es.nc").target.data_dict()["J"]) == 8
