"""T3-7's summary from batch records (stanvi/bench/score_peers_records.py)."""

from __future__ import annotations

import pytest

from stanvi.bench import score_peers_records as sp


def _rec(model, method, seed, w1, evals, draws=None, elbo=None):
    rec = {"model": model, "method": method, "profile": "default", "family": "fullrank",
           "seed": seed, "status": "converged", "draw_evaluations": evals, "final_elbo": -1.0,
           "accuracy": {"constrained": {"w1_sd_median": w1, "mean_error_sd_median": w1 / 2}}}
    if draws is not None:
        rec["trace_points"] = {"iteration": list(range(len(draws))), "oracle": draws,
                               "draws": draws, "run_time": [0.0] * len(draws), "elbo": elbo}
    return rec


def test_evaluations_to_the_runs_own_final_accuracy():
    # the ELBO is within 0.1 nat of its last value (-1.0) from the point at 300 evaluations on,
    # although it was there once before (at 100) and left again
    rec = _rec("a", "bam", 0, 0.1, 1000, [50, 100, 200, 300, 1000],
               [-9.0, -1.05, -3.0, -1.08, -1.0])
    assert sp.evaluations_to_final(rec) == 300.0
    # no trace (Stan's Pathfinder): its total
    assert sp.evaluations_to_final(_rec("a", "pathfinder", 0, 0.1, 700)) == 700.0


def test_where_a_peer_beats_trustvi():
    records = []
    for seed in range(3):
        records += [_rec("p1", "trustvi", seed, 0.10, 5000), _rec("p1", "bam", seed, 0.05, 6000),
                    _rec("p2", "trustvi", seed, 0.10, 5000), _rec("p2", "bam", seed, 0.105, 4000),
                    _rec("p3", "trustvi", seed, 0.10, 5000), _rec("p3", "bam", seed, 0.20, 100)]
    tab = sp.table(records)
    assert tab["bam:default:fullrank"]["p2"]["w1"] == pytest.approx(0.105)
    text = sp.summary_text(tab)
    # p1: 50 % lower W1; p2: as accurate (within 10 %) for fewer evaluations; p3: neither
    assert ("bam:default:fullrank against trustvi:default:fullrank on 3 posteriors: W1/sd ≥ 10 % "
            "lower on 1, as accurate (within 10 %) for fewer evaluations on 1") in text
    assert "  p1: W1/sd 0.050 vs 0.100" in text and "  p2: W1/sd 0.105 vs 0.100" in text
    assert "  p3:" not in text


def test_pbam_is_compared_with_trustvi_lowrank_only():
    """BaM low-rank is set against TrustVI low-rank, not full-rank; a pair whose records are
    missing (no gsm here) prints nothing."""
    records = []
    for seed in range(3):
        records += [_rec("p1", "trustvi", seed, 0.10, 5000), _rec("p1", "bam", seed, 0.30, 900)]
        low = [_rec("p1", "trustvi", seed, 0.20, 3000), _rec("p1", "bam", seed, 0.15, 4000)]
        for r in low:
            r["family"] = "lowrank"
        records += low
    text = sp.summary_text(sp.table(records))
    assert ("bam:default:lowrank against trustvi:default:lowrank on 1 posteriors: W1/sd ≥ 10 % "
            "lower on 1") in text
    assert "bam:default:fullrank against trustvi:default:fullrank on 1 posteriors: W1/sd ≥ 10 % "\
           "lower on 0, as accurate (within 10 %) for fewer evaluations on 0" in text
    assert "gsm" not in text
