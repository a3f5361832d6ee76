"""``stanvi bench local-optima`` (issue T3-1, target 5): how a TrustVI run is judged against
the peers of its family.  The bench itself needs posteriordb and example-models checkouts;
its verdicts are pure functions of the runs' figures, checked here."""

import math

import pytest

from stanvi.bench.local_optima import classify, example_models_case, verdicts


def test_classify_reads_one_nat_and_the_status():
    assert classify(-10.0, "converged", -9.5) == "ok"          # within a nat
    assert classify(-10.0, "converged", -9.0) == "unflagged"   # exactly a nat below: beaten
    assert classify(-10.0, "max_iters", -8.0) == "flagged"
    assert classify(-10.0, "converged", None) == "ok"          # no peer finished
    assert classify(-10.0, "converged", -math.inf) == "ok"
    assert classify(math.nan, "failed", -8.0) == "flagged"     # no ELBO: beaten, not claimed
    assert classify(-5.0, "converged", -8.0) == "ok"           # TrustVI ahead


def test_verdicts_compare_each_family_with_its_own_peers():
    """Mean-field TrustVI is compared with ADVI and its own seeds; full-rank with ADVI,
    Pathfinder (a dense Gaussian) and every TrustVI run, over every seed of the peers."""
    result = {"model": "m", "runs": {
        "trustvi": [{"status": "converged", "elbo": -10.0, "evaluations": 5},
                    {"status": "max_iters", "elbo": -12.0, "message": "not certified"}],
        "trustvi-fullrank": [{"status": "converged", "elbo": -8.5}],
        "stan-advi": [{"elbo": -9.8}, {"elbo": -11.0}],
        "pathfinder": [{"elbo": -7.0}, {"elbo": None}]}}
    rows = verdicts(result)
    assert [(r["method"], r["seed"], r["best_peer"], r["verdict"]) for r in rows] == [
        ("trustvi", 0, -9.8, "ok"), ("trustvi", 1, -9.8, "flagged"),
        ("trustvi-fullrank", 0, -7.0, "unflagged")]
    assert rows[1]["message"] == "not certified"


def test_a_run_is_also_judged_against_its_own_seeds_and_full_rank_against_mean_field():
    """electric_1b: mean-field seed 0 certified 303 nats below seeds 1 and 2 (no other method
    need reach that far); electric: full rank certified 439 nats below mean-field, whose every q
    it contains."""
    result = {"model": "m", "runs": {
        "trustvi": [{"status": "converged", "elbo": -977.0},
                    {"status": "converged", "elbo": -673.8}],
        "trustvi-fullrank": [{"status": "converged", "elbo": -1225.9},
                             {"status": "converged", "elbo": -673.0}],
        "stan-advi": [{"elbo": -2000.0}], "pathfinder": [{"elbo": -1500.0}]}}
    got = [(r["method"], r["seed"], r["best_peer"], r["verdict"]) for r in verdicts(result)]
    assert got == [("trustvi", 0, -673.8, "unflagged"), ("trustvi", 1, -673.8, "ok"),
                   ("trustvi-fullrank", 0, -673.0, "unflagged"),
                   ("trustvi-fullrank", 1, -673.0, "ok")]
    result["runs"]["trustvi-fullrank"] = [{"status": "converged", "elbo": -1225.9}]
    assert verdicts(result)[2]["best_peer"] == -673.8     # mean-field TrustVI as full rank's peer


def test_a_missing_example_models_checkout_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="example-models checkout"):
        example_models_case(tmp_path, "bugs_examples/vol2/stagnant")
