"""The per-model recommendation of ``stanvi report`` (stanvi.batch.recommend, issue T3-4 item 3):
the cheapest reliable configuration whose accuracy is acceptable, its caveats, and NUTS when
none is."""

from __future__ import annotations

from stanvi.batch.recommend import headline, label, recommend


def row(config, mean_error, w1, time, runs=3, ok=3, evals=1000, worst=None):
    worst_me, worst_w1 = worst if worst is not None else (mean_error, w1)
    return {"config": config, "mean_error_sd": mean_error, "w1_sd": w1, "runs": runs, "ok": ok,
            "median_run_time": time, "median_draw_evaluations": evals,
            "worst_mean_error_sd": worst_me, "worst_w1_sd": worst_w1}


NUTS = row("nuts:diag:none", None, None, 5.0)


def test_the_cheapest_accurate_method_wins():
    rows = [row("trustvi:default:fullrank", 0.02, 0.05, 0.05),
            row("pathfinder:single:none", 0.04, 0.12, 0.01),
            row("stan-advi:default:meanfield", 0.5, 0.7, 0.002), NUTS]
    rec = recommend(rows)
    assert rec["config"] == "pathfinder:single:none" and rec["level"] == "marginals"
    assert "the cheapest of 2 acceptable" in rec["why"]
    assert "next: TrustVI default (full-rank), 0.05 s" in rec["why"]


def test_a_method_that_failed_on_one_seed_is_not_recommended():
    rows = [row("pathfinder:single:none", 0.01, 0.05, 0.01, ok=2),
            row("trustvi:default:fullrank", 0.02, 0.05, 0.05), NUTS]
    assert recommend(rows)["config"] == "trustvi:default:fullrank"


def test_a_method_far_off_on_one_seed_is_not_recommended():
    # right on two seeds of three (the median) and 2 sd off on the third: ARM/Ch.3's
    # kidiq_interaction, single-path Pathfinder, seed 2
    rows = [row("pathfinder:single:none", 0.097, 0.11, 0.003, worst=(2.0, 2.1)),
            row("trustvi:default:fullrank", 0.033, 0.042, 0.41, worst=(0.04, 0.05)), NUTS]
    rec = recommend(rows)
    assert rec["config"] == "trustvi:default:fullrank"
    assert "(median over seeds; worst seed 0.04 and 0.05)" in rec["why"]
    assert "on each of 3 seeds" in rec["why"]
    # a seed without accuracy figures cannot count as accurate
    rows[1]["worst_w1_sd"] = float("inf")
    assert recommend(rows)["level"] == "means"


def test_means_only_and_nuts_fallbacks():
    rows = [row("trustvi:default:meanfield", 0.03, 0.5, 0.02), NUTS]
    rec = recommend(rows)
    assert rec["level"] == "means" and "only the means are acceptable" in rec["why"]
    bad = recommend([row("trustvi:default:meanfield", 0.4, 0.9, 0.02), NUTS],
                    reference_ok=False)
    assert bad["config"] == "nuts:diag:none" and bad["level"] == "nuts"
    assert "use NUTS" in bad["why"] and "failed its checks" in bad["why"]
    assert recommend([row("trustvi:default:meanfield", None, None, 0.02)])["level"] == "unjudged"


def test_a_model_where_no_fit_was_accurate_is_headed_nuts_even_without_a_nuts_fit():
    """T3-4's batches compute NUTS as the reference, not as a configuration: the 34 models whose
    recommendation is "use NUTS" were headed "not judged" in the report's list."""
    use_nuts = recommend([row("trustvi:default:meanfield", 0.4, 0.9, 0.02)])
    assert use_nuts["level"] == "nuts" and use_nuts["config"] is None
    assert headline(use_nuts) == "NUTS"
    assert headline(recommend([row("trustvi:default:meanfield", 0.4, 0.9, 0.02), NUTS])) == "NUTS"
    assert headline(recommend([row("trustvi:default:meanfield", None, None, 0.02)])) == (
        "not judged")
    assert headline(recommend([row("trustvi:default:meanfield", 0.03, 0.5, 0.02)])) == (
        "TrustVI default (mean-field) (means only)")
    assert headline(recommend([row("pathfinder:single:none", 0.03, 0.05, 0.02)])) == (
        "Pathfinder (1 path)")


def test_labels():
    assert label("trustvi:default:meanfield") == "TrustVI default (mean-field)"
    assert label("pathfinder:multi:none") == "Pathfinder (4 paths)"
    assert label("stan-advi:default:fullrank") == "Stan's ADVI (full-rank)"
    assert label("nuts:diag:none") == "NUTS"


def test_a_failure_reason_leaves_out_stans_progress_lines():
    # Stan's ADVI prints "info: Success! ..." before it stops with code 70; the report grouped
    # 37 example-models failures under that line instead of the reason after it
    from stanvi.batch.report_page import _reason

    msg = ("ReferenceRunError: Stan's ADVI (meanfield) failed on model 'ssm': Stan's ADVI "
           "(meanfield) failed with code 70:\ninfo: Success! Found best value [eta = 100] earlier "
           "than expected.\nstan::variational::normal_meanfield::calc_grad: The number of dropped "
           "evaluations has reached its maximum amount (10). Your model may be ill-conditioned.")
    reason = _reason(msg)
    assert "Success" not in reason and "dropped evaluations" in reason
    assert "(#)" in reason and "\n" not in reason
    # what the method and status columns say already is left out of the reason
    assert reason == "The number of dropped evaluations has reached its maximum amount (#)"


def test_a_failure_reason_reads_whole():
    """Stan's tags and the exception's class left out, cut at a word (not mid-word at 200
    characters as before: "... the initial val"), "i.e." not taken for a sentence's end, and a
    parenthesis the cut at ';' left open closed."""
    from stanvi.batch.report_page import REASON_CHARS, _reason

    assert _reason("ReferenceRunError: Stan's Pathfinder failed on model 'x': Stan's Pathfinder "
                   "(single) failed with code 70:\nwarn: Rejecting initial value:\n  warn: Log "
                   "probability evaluates to log(0), i.e. negative infinity.\n") == (
        "Rejecting initial value: Log probability evaluates to log(#), i.e. negative infinity")
    assert _reason("ModelEvaluationError: model 'wells': Initialization failed after 100 "
                   "attempts; last error: ...") == "Initialization failed after # attempts"
    assert _reason("the trust region collapsed on the fixed sample (no step improves its ELBO; "
                   "N = 64 draws)") == ("The trust region collapsed on the fixed sample (no step "
                                       "improves its ELBO)")
    long = _reason("Optimization terminated with error: " + "line search failed " * 20)
    assert long.endswith(" line …") and len(long) <= REASON_CHARS + 2
    assert _reason("failed_gradient at the certification") == (
        "failed_gradient at the certification")


def test_the_summary_counts_the_references_that_ran():
    """The report's opening paragraph: a model that did not compile has a reference record but
    no NUTS run (T3-4's summary said "401 computed" for 264 finished runs)."""
    from stanvi.batch.report_page import summary_text

    refs = {"a": {"status": "ok", "trustworthy": True}, "b": {"status": "ok"},
            "c": {"status": "timeout"}, "d": {"status": "not_compiled"},
            "e": {"status": "error"}}
    text = summary_text({}, 4, refs)
    assert text.startswith("4 models fitted. NUTS references: 2 of 4 run (1 timed out, 1 failed), "
                           "1 of them pass R-hat")


def test_the_trusted_table_counts_only_models_whose_reference_passed_its_checks():
    from stanvi.batch.report_page import trusted_methods_table

    rows = [{**row("trustvi:default:meanfield", 0.02, 0.05, 0.1), "model": "a"},
            {**row("trustvi:default:meanfield", 0.9, 1.5, 0.3), "model": "b"},
            {**row("trustvi:default:meanfield", 0.04, 0.07, 0.2), "model": "c"}]
    recs = {m: recommend([r]) for m, r in zip("abc", rows)}
    refs = {"a": {"trustworthy": True}, "b": {"trustworthy": False}, "c": {"trustworthy": True}}
    intro, table = trusted_methods_table(rows, recs, refs)
    assert "over the 2 models whose NUTS reference passed" in intro
    # the medians over a and c alone: mean error 0.03, W1 0.06, not b's 0.9 and 1.5
    assert ">0.03<" in table and ">0.06<" in table and "0.9" not in table
    assert ">2 / 2<" not in table and ">6 / 6<" in table       # fits ok / run over a and c
    # every reference trusted, or none: no second table
    assert trusted_methods_table(rows, recs, {m: {"trustworthy": True} for m in "abc"}) == []
    assert trusted_methods_table(rows, recs, {m: {"trustworthy": False} for m in "abc"}) == []
