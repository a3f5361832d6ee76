"""stanvi.compare (issue T3-5 item 3; docs/choosing.md#compare): the recommendation rule on
rows whose figures are given, and one comparison end to end on a Stan model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import stanvi
from conftest import data_file, stan_file
from stanvi.evaluation.compare import AS_FAST, QUICK_ENOUGH, label, parse_method, recommend


def row(method, *, elbo=math.nan, me=math.nan, w1=math.nan, seconds=10.0, evaluations=100,
        verdict="good", status="converged", khat=0.4, means=None):
    return {"method": method, "elbo": elbo, "mean_error_sd": me, "w1_sd": w1,
            "seconds": seconds, "evaluations": evaluations, "verdict": verdict,
            "status": status, "khat": khat, "means": means}


def test_without_a_reference_the_fastest_within_a_nat_of_the_best_elbo():
    rows = [row("A", elbo=-10.0, seconds=10.0), row("B", elbo=-10.5, seconds=2.0),
            row("C", elbo=-12.0, seconds=0.1),                   # 2 nats below: out
            row("D", elbo=-9.9, seconds=0.5, verdict="unreliable"),    # unreliable: out
            row("NUTS", verdict="reference", seconds=0.01)]      # never the recommendation
    pick, reason = recommend(rows, with_reference=False)
    assert pick == "B" and "ELBO -10.5" in reason and "of the 2 that qualify" in reason
    assert "the fastest" in reason and "within 1 nat of the best (-10)" in reason
    # equally fast (within AS_FAST x): the higher ELBO is named
    rows[0]["seconds"] = 2.0 * AS_FAST * 0.99
    assert recommend(rows, with_reference=False)[0] == "A"
    # all under QUICK_ENOUGH seconds: equally fast, whatever the ratio
    rows[0]["seconds"], rows[1]["seconds"] = QUICK_ENOUGH, QUICK_ENOUGH / 50
    pick, reason = recommend(rows, with_reference=False)
    assert pick == "A" and "the highest ELBO of the 2 about as fast" in reason


def test_with_a_reference_accuracy_decides_and_pathfinder_without_khat_counts():
    rows = [row("TrustVI", me=0.05, w1=0.15, seconds=0.2),
            row("ADVI", me=0.3, w1=0.4, seconds=0.01),            # inaccurate: out
            row("Pathfinder (4 paths)", me=0.02, w1=0.1, seconds=0.02, verdict=None,
                status="converged", khat=math.nan)]
    pick, reason = recommend(rows, with_reference=True)   # both quick: the smaller W1
    assert pick == "Pathfinder (4 paths)" and "mean error 0.02 sd, W1 0.1 sd" in reason
    assert "no k-hat" in reason
    rows[2]["w1_sd"] = 0.25                                       # marginals too far: out
    pick, reason = recommend(rows, with_reference=True)
    assert pick == "TrustVI" and "the only one that qualifies" in reason
    rows[0]["status"] = "failed"
    pick, reason = recommend(rows, with_reference=True)
    assert pick == "NUTS" and "no approximation qualifies" in reason
    assert "means alone" not in reason
    # Stan's ADVI at its iteration limit is max_iters, as stanvi's is: it does not qualify
    # (it counted as "ok" before, whatever Stan said)
    rows[0]["status"] = "converged"
    rows.append(row("Stan's ADVI (mean-field)", me=0.01, w1=0.05, seconds=0.001,
                    status="max_iters"))
    assert recommend(rows, with_reference=True)[0] == "TrustVI"
    rows[-1]["status"] = "converged"
    assert recommend(rows, with_reference=True)[0] == "Stan's ADVI (mean-field)"


def test_with_none_qualifying_the_reason_names_the_fit_whose_means_alone_read_plausible():
    rows = [row("MF", me=0.04, w1=0.6, seconds=0.3, verdict="unreliable", means="plausible"),
            row("MF2", me=0.03, w1=0.6, seconds=0.9, verdict="unreliable", means="plausible"),
            row("ADVI", me=0.5, w1=0.7, seconds=0.1, verdict="unreliable", means="plausible"),
            row("FR", me=0.6, w1=0.7, seconds=0.1, verdict="unreliable", means="doubtful")]
    pick, reason = recommend(rows, with_reference=True)
    # ADVI reads plausible but is 0.5 sd off NUTS: with a reference its means do not count
    assert pick == "NUTS" and reason.endswith(
        "; for the posterior means alone, MF's read plausible (its sds and intervals do not hold)")
    pick, reason = recommend(rows, with_reference=False)
    assert pick == "NUTS" and "means alone, ADVI's read plausible" in reason


def test_method_specs_and_labels():
    assert parse_method("trustvi/fullrank") == ("trustvi", "fullrank", {})
    assert parse_method(("pathfinder", {"num_paths": 1})) == ("pathfinder", "meanfield",
                                                              {"num_paths": 1})
    assert label("trustvi", "fullrank", {}) == "TrustVI (full-rank)"
    assert label("pathfinder", "meanfield", {"num_paths": 1}) == "Pathfinder (1 path)"
    assert label("stan-advi", "meanfield", {}) == "Stan's ADVI (mean-field)"


@pytest.mark.slow
def test_compare_end_to_end_against_nuts(compiled):
    compiled("bernoulli")   # in the compile cache (shared with the other tests)
    result = stanvi.compare(stan_file("bernoulli"), data_file("bernoulli"),
                            methods=["trustvi", ("pathfinder", {"num_paths": 1}), "stan-advi"],
                            reference="nuts", progress=False)
    table = result.table()
    assert list(table.index) == ["TrustVI (mean-field)", "Pathfinder (1 path)",
                                 "Stan's ADVI (mean-field)"]
    # every approximation has a finite ELBO (a lower bound on log p(y) < 0), accuracy against
    # NUTS and its evaluations counted
    assert np.all(np.isfinite(table["elbo"])) and np.all(table["elbo"] < 0)
    assert np.all(table["mean_error_sd"] < 0.5) and np.all(table["evaluations"] > 0)
    # the same fit as stanvi.fit with the same seed
    again = stanvi.fit(stan_file("bernoulli"), data_file("bernoulli"), seed=0, progress=False)
    np.testing.assert_array_equal(result.fits["TrustVI (mean-field)"].draws["theta"],
                                  again.draws["theta"])
    text = str(result)
    assert text.splitlines()[0].startswith("bernoulli: 3 methods, seed 0, accuracy against NUTS")
    assert f"recommendation: {result.recommendation}: " in text
    assert result.recommendation in list(table.index) + ["NUTS"]
    with pytest.raises(ValueError, match="reference must be None or 'nuts'"):
        stanvi.compare(stan_file("bernoulli"), data_file("bernoulli"), reference="advi")


@pytest.mark.slow
def test_stan_s_advi_at_its_iteration_limit_is_max_iters_and_not_recommended(compiled):
    """Its row's status is what Stan said (it read "ok" whatever Stan said before), so an ADVI
    run stopped after 3 iterations is not recommended over a converged fit."""
    compiled("bernoulli")
    result = stanvi.compare(stan_file("bernoulli"), data_file("bernoulli"),
                            methods=["trustvi", ("stan-advi", {"iter": 3})], progress=False)
    statuses = {r["method"]: r["status"] for r in result.rows}
    assert statuses == {"TrustVI (mean-field)": "converged",
                        "Stan's ADVI (mean-field)": "max_iters"}
    assert result.recommendation == "TrustVI (mean-field)"


def test_when_no_approximation_is_sound_the_reason_says_so_without_a_best_elbo():
    rows = [row("TrustVI", elbo=-10.0, verdict="unreliable"),
            row("ADVI", elbo=-9.0, status="max_iters")]
    pick, reason = recommend(rows, with_reference=False)
    assert pick == "NUTS"
    assert "none converged with an ELBO and a k-hat that is not unreliable" in reason
    assert "inf" not in reason


@pytest.mark.slow
def test_stan_fits_past_what_1000_draws_identify_get_their_elbo_and_the_default_runs_draws(
        monkeypatch):
    """Full-rank Stan ADVI at D = 50 (1,275 unknowns) and single-path Pathfinder (1,327): before,
    compare stopped with "1000 draws cannot identify a 50-dimensional full-rank Gaussian"; now it
    asks Stan for enough draws (docs/diagnostics.md#stan) and shows the default run. The
    Gaussian is recovered, and the draws mapped, once per fit for both the ELBO and the verdict
    (before, twice: ~40 s a fit at D = 90)."""
    import stanvi.reference.advi as advi_module
    import stanvi.targets.labelled as labelled_module
    from stanvi.estimators.elbo import standard_normal
    from stanvi.estimators.keys import make_key
    from stanvi.evaluation.compare import ELBO_DRAWS
    from stanvi.reference import pathfinder, stan_advi
    from stanvi.stan.compiler import compile_model
    from stanvi.targets.stan_target import StanTarget

    calls = {"recover": 0, "map": 0}

    def counted(function, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(advi_module, "_least_squares_cholesky",
                        counted(advi_module._least_squares_cholesky, "recover"))
    monkeypatch.setattr(labelled_module, "reference_unconstrained",
                        counted(labelled_module.reference_unconstrained, "map"))

    model = Path(__file__).resolve().parents[2] / "stan_models" / "gaussian_diag" / "gaussian_diag.stan"
    d = 50
    rng = np.random.default_rng(0)
    data = {"D": d, "mu": rng.normal(size=d).tolist(), "sigma": rng.uniform(0.5, 2, d).tolist()}
    result = stanvi.compare(str(model), data, seed=3, progress=False,
                            methods=["stan-advi/fullrank", ("pathfinder", {"num_paths": 1})])
    table = result.table()
    assert np.all(np.isfinite(table["elbo"])) and np.all(np.isfinite(table["khat"]))
    assert calls == {"recover": 1, "map": 2}   # ADVI's q once; each Stan fit's draws once
    # the kept Gaussian gives the ELBO a recovery from scratch gives
    run = result.fits["Stan's ADVI (full-rank)"].recovery_run
    eps = np.asarray(standard_normal(make_key(3 + 1, host=True), ELBO_DRAWS, d))
    target = StanTarget(str(model), data, progress=False)
    advi_module.stan_advi_elbo(run, target, [eps])
    assert calls["recover"] == 1                   # the same draws: the kept one
    run.__dict__.pop("_advi_gaussian")
    fresh = advi_module.stan_advi_elbo(run, target, [eps])
    assert calls["recover"] == 2
    assert table.loc["Stan's ADVI (full-rank)", "elbo"] == fresh[0][0]
    compiled = compile_model(model, progress=False)
    defaults = {"Stan's ADVI (full-rank)": stan_advi(compiled, data, algorithm="fullrank", seed=3),
                "Pathfinder (1 path)": pathfinder(compiled, data, num_paths=1, seed=3)}
    for name, default in defaults.items():
        shown = result.fits[name]
        # the fit shown is the default run: its draws (ADVI's bit for bit, Pathfinder's to
        # rounding, 4e-16 here) and its counts
        assert shown.num_draws == 1000
        np.testing.assert_allclose(shown.draws["z"], default.draws["z"], rtol=1e-13, atol=1e-13,
                                   err_msg=name)
        np.testing.assert_allclose(shown.log_q, default.log_q, rtol=1e-13, err_msg=name)
        assert shown.density_evaluations == default.density_evaluations
        assert table.loc[name, "evaluations"] == (default.gradient_evaluations
                                                  + default.density_evaluations)
    # single-path Pathfinder's ELBO: the default run's draws' mean of log p - log q
    ratio = defaults["Pathfinder (1 path)"].log_p - defaults["Pathfinder (1 path)"].log_q
    assert table.loc["Pathfinder (1 path)", "elbo"] == pytest.approx(float(np.mean(ratio)))
