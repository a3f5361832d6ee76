"""The verdict's check against reference draws and across seeds (stanvi.batch.verdict_check)."""

import math

import pytest

from stanvi.batch.verdict_check import check, current_verdict, means_of, report_text, roc_auc


def test_roc_auc_exact_values():
    assert roc_auc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert roc_auc([0, 1, 2, 3], [True, True, False, False]) == 0.0
    # ties count a half: one positive tied with both negatives, the other above both
    assert roc_auc([1, 2, 1, 1], [True, True, False, False]) == pytest.approx(0.75)
    assert math.isnan(roc_auc([1, 2], [True, True]))


def _rec(model, seed, verdict, error, elbo, khat=0.3, method="trustvi", w1=0.1):
    return {"model": model, "method": method, "profile": "default", "family": "meanfield",
            "seed": seed, "verdict": verdict, "khat": khat, "elbo": elbo,
            "accuracy": {"constrained": {"mean_error_sd_median": error, "w1_sd_median": w1}}}


def test_check_counts_the_confusion_table_and_the_seeds_that_flip():
    records = [_rec("a", 0, "good", 0.05, -10.0), _rec("a", 1, "good", 0.06, -10.05),
               _rec("b", 0, "unreliable", 0.5, -3.0, 0.9), _rec("b", 1, "use with care", 0.4, -3.02, 0.6),
               _rec("c", 0, "unreliable", 0.1, -7.0, w1=0.5), _rec("c", 1, "good", 0.1, -7.5),
               {"model": "d", "verdict": "good", "seed": 0}]      # no reference: stability only
    figs = check(records)
    a = figs["all"]
    assert a["fits"] == 6 and a["off"] == 2
    assert a["confusion"]["good"] == {"off": 0, "not off": 3}
    assert a["confusion"]["use with care"] == {"off": 1, "not off": 0}
    assert a["confusion"]["unreliable"] == {"off": 1, "not off": 1}
    # off fits' scores (2, 1) against the others' (0, 0, 2, 0): 3 wins and a tie, then 3 wins
    assert a["auc_verdict"] == pytest.approx((3.5 + 3) / 8)
    # not usable: b's two (off) and c0 (W1 0.5 sd): all three judged worse than the rest
    assert a["unusable"] == 3 and a["auc_verdict_usable"] == 1.0
    assert a["confusion_usable"] == {"good": {"unusable": 0, "usable": 3},
                                     "use with care": {"unusable": 1, "usable": 0},
                                     "unreliable": {"unusable": 2, "usable": 0}}
    st = figs["stability"]
    assert st["pairs"] == 2 and st["same"] == 1        # c's ELBOs differ by 0.5: left out
    assert st["flipped"] == ["b trustvi:default:meanfield: unreliable, use with care"]
    text = report_text(figs)
    assert "same verdict on every seed: 1 of 2" in text and "trustvi:default:meanfield" in text


def test_a_borderline_good_record_is_read_as_use_with_care():
    record = {"verdict": "good", "verdict_figures": {"borderline": True}}
    assert current_verdict(record) == "use with care"
    assert current_verdict({"verdict": "good", "verdict_figures": {"borderline": False}}) == "good"
    assert current_verdict({"verdict": "unreliable", "verdict_figures": {"borderline": True}}) \
        == "unreliable"


def test_the_means_reading_is_scored_against_off_where_records_keep_it():
    def read(rec, means):
        # the figures today's rule decides on, consistent with the reading
        step = 0.1 if means != "doubtful" else 0.5
        return {**rec, "verdict_figures": {"means": means, "newton_step_upper": step,
                                           "newton_step_median": step, "newton_curvature": 1.0,
                                           "newton_curvature_se": 0.0}}
    records = [read(_rec("a", 0, "good", 0.05, -1.0), "hold"),
               read(_rec("a", 1, "good", 0.05, -1.02), "hold"),
               # unreliable with right means (a narrow mean-field q) and with means off
               read(_rec("b", 0, "unreliable", 0.1, -2.0, 0.9, w1=0.5), "plausible"),
               read(_rec("b", 1, "unreliable", 0.1, -2.05, 0.9, w1=0.5), "doubtful"),
               read(_rec("c", 0, "unreliable", 0.9, -3.0, 1.5), "doubtful"),
               read(_rec("c", 1, "unreliable", 0.3, -3.5, 1.2), "plausible"),
               _rec("e", 0, "unreliable", 0.7, -4.0, 1.1),          # written before the reading
               {**_rec("e", 1, "unreliable", 0.7, -4.5, 1.1),         # ... or before its rule
                "verdict_figures": {"means": "plausible", "newton_step_upper": 0.1}}]
    figs = check(records)
    a = figs["all"]
    assert a["fits"] == 8 and a["means_fits"] == 6 and a["means_off"] == 2
    assert a["confusion_means"] == {"hold": {"off": 0, "not off": 2},
                                    "plausible": {"off": 1, "not off": 1},
                                    "doubtful": {"off": 1, "not off": 1}}
    # off readings (2, 1) against (0, 0, 1, 2): c0 beats 3 and ties 1, c1 beats 2 and ties 1
    assert a["auc_means"] == pytest.approx((3.5 + 2.5) / 8)
    # the verdict alone puts the unreliable fits level: off (2, 2, 2, 2 for e) vs (0, 0, 2, 2)
    assert a["auc_verdict"] == pytest.approx((4 * 2 + 4 * 2 * 0.5) / 16)
    st = figs["stability"]
    assert st["pairs"] == 2 and st["same"] == 2          # a and b; c's ELBOs differ by 0.5
    assert st["means_pairs"] == 2 and st["same_with_means"] == 1
    assert st["flipped"] == ["b trustvi:default:meanfield: unreliable (means doubtful), "
                             "unreliable (means plausible)"]
    text = report_text(figs)
    assert "the means read apart" in text and "same verdict and reading of the means" in text


def test_fits_against_an_untrustworthy_reference_are_not_judged(tmp_path):
    from stanvi.batch.store import RunStore
    from stanvi.batch.verdict_check import fit_records

    store = RunStore(tmp_path / "runs")
    store.put("reference", "good", {"model": "good", "status": "ok", "trustworthy": True})
    store.put("reference", "bad", {"model": "bad", "status": "ok", "trustworthy": False,
                                   "message": "largest R-hat 1.5 > 1.01"})
    for model in ("good", "bad", "pdb"):      # pdb: no NUTS reference record (posteriordb's)
        for seed in (0, 1):
            store.put("fit", f"{model}-{seed}", _rec(model, seed, "good", 0.05, -1.0))
    figs = check(fit_records([tmp_path / "runs"]))
    assert figs["all"]["fits"] == 4                    # good's and pdb's: judged
    assert figs["stability"]["pairs"] == 3             # bad's seeds still count for stability


def test_a_reading_on_the_plain_bound_is_re_derived_on_the_curved_one():
    def rec(means, plain, kappa, median=None, **figures):
        return {**_rec("a", 0, "unreliable", 0.1, -1.0, 0.9),
                "verdict_figures": {"means": means, "newton_step_upper": plain,
                                    "newton_step_median": plain if median is None else median,
                                    "newton_curvature": kappa, "newton_curvature_se": 0.0,
                                    "threshold": 0.7, **figures}}
    # doubtful on the plain bound, the curvature shortens the step: plausible
    assert means_of(rec("doubtful", 0.6, 4.0)) == "plausible"
    # ... not where the step is beyond q's sd, or within its noise
    assert means_of(rec("doubtful", 1.2, 40.0)) == "doubtful"
    assert means_of(rec("doubtful", 0.6, 4.0, median=0.2)) == "doubtful"
    # plausible on the plain bound, longer along a flat direction: doubtful
    assert means_of(rec("plausible", 0.15, 0.5)) == "doubtful"
    # doubtful for another reason the record keeps: failed draws, or PSIS's shift where k-hat
    # trusts its weights
    assert means_of(rec("doubtful", 0.6, 4.0, failed_fraction=0.05)) == "doubtful"
    assert means_of({**rec("doubtful", 0.6, 4.0, mean_shift=0.3), "khat": 0.6}) == "doubtful"
    assert means_of({**rec("doubtful", 0.6, 4.0, mean_shift=0.3), "khat": 0.9}) == "plausible"
    # ... or one it does not keep (q collapsed): the step passed on the bound it was decided on
    # and on today's
    assert means_of(rec("doubtful", 0.1, 1.0)) == "doubtful"
    assert means_of(rec("doubtful", 0.6, 4.0, means_bound=0.15)) == "doubtful"
    # the verdict passes q: hold, whatever the step
    assert means_of({**rec("hold", 0.6, 0.6), "verdict": "use with care"}) == "hold"
    # written by today's code without a curvature (a low-rank q; no step at all: NaN)
    low_rank = {**_rec("a", 0, "unreliable", 0.1, -1.0),
                "verdict_figures": {"means": "doubtful", "newton_step_upper": 0.3,
                                    "newton_step_median": 0.3, "means_bound": 0.3}}
    assert means_of(low_rank) == "doubtful"
    assert means_of({**low_rank, "verdict_figures": {"means": "doubtful",
                                                     "means_bound": math.nan}}) == "doubtful"
    # no curvature and no bound kept: not read under today's rule
    assert means_of({**_rec("a", 0, "unreliable", 0.1, -1.0),
                     "verdict_figures": {"means": "plausible", "newton_step_upper": 0.1}}) is None


def test_a_reading_whose_figures_the_store_wrote_as_null_is_read_without_a_bound():
    """The store writes a non-finite figure as null (an infinite bound, an unknown curvature):
    such a record reads *doubtful*, where it used to stop the whole check with a TypeError
    (Stan's ADVI on BUGS salm2, whose step median was 1.5e298)."""
    base = _rec("a", 0, "unreliable", 0.1, -1.0, 0.9)
    no_step = {**base, "verdict_figures": {
        "means": "doubtful", "newton_step_upper": None, "newton_step_median": 1.5e298,
        "newton_curvature": None, "newton_curvature_se": None, "means_bound": None,
        "threshold": 0.7}}
    assert means_of(no_step) == "doubtful"
    # a finite step whose curvature may not be negative: the curved bound is infinite
    flat = {**base, "verdict_figures": {
        "means": "doubtful", "newton_step_upper": 0.87, "newton_step_median": 0.75,
        "newton_curvature": 0.2, "newton_curvature_se": 0.16, "means_bound": None,
        "threshold": 0.7}}
    assert means_of(flat) == "doubtful"
    # the same figures, finite, with a curvature that shortens the step: plausible
    assert means_of({**flat, "verdict_figures": {**flat["verdict_figures"],
                                                 "newton_curvature": 8.0,
                                                 "newton_curvature_se": 0.1,
                                                 "means_bound": 0.87}}) == "plausible"


def test_records_judged_on_their_own_seeds_draws_are_left_out_of_the_common_draws_figures():
    from stanvi.batch.verdict_check import drawn_in_common

    old0 = {**_rec("a", 0, "good", 0.05, -1.0), "finished": 100.0}     # seed 0: same draws
    old1 = {**_rec("a", 1, "unreliable", 0.05, -1.0), "finished": 100.0}
    new1 = {**_rec("b", 1, "good", 0.05, -1.0), "finished": 300.0}
    unknown = _rec("c", 2, "good", 0.05, -1.0)                          # no time: before
    kept = drawn_in_common([old0, old1, new1, unknown], since=200.0)
    assert kept == [old0, new1]
    # the pair a flips on all its records and is stable on the ones drawn in common
    assert check([old0, old1])["stability"]["same"] == 0
    assert check(kept)["stability"]["pairs"] == 0      # a has one seed left, b one: no pairs
