"""Issue T3-6's posteriordb targets from records (stanvi/bench/lowrank_posteriordb.py)."""

from __future__ import annotations

import csv

import pytest

from stanvi.bench import lowrank_posteriordb as lp


def _rec(model, method, family, seed, w1, err, evals, profile="default", status="converged"):
    return {"model": model, "method": method, "profile": profile, "family": family,
            "seed": seed, "status": status, "draw_evaluations": evals,
            "accuracy": {"constrained": {"w1_sd_median": w1, "mean_error_sd_median": err}}}


def test_targets_are_medians_over_posteriors_of_medians_over_seeds(tmp_path):
    records = []
    for p, scale in (("a", 1.0), ("b", 2.0), ("c", 4.0)):
        for seed, jitter in enumerate((0.9, 1.0, 1.1)):
            records.append(_rec(p, "trustvi", "lowrank", seed, 0.05 * scale * jitter, 0.01, 3000))
            records.append(_rec(p, "trustvi", "fullrank", seed, 0.04 * scale * jitter, 0.01, 600))
            records.append(_rec(p, "trustvi", "meanfield", seed, 0.5, 0.01, 1000 * scale))
        # a failed seed does not count
        records.append(_rec(p, "trustvi", "lowrank", 3, 99.0, 9.0, 10**6, status="error"))
    table = lp.per_posterior(records)
    assert table[lp.LOWRANK]["b"] == {"w1": pytest.approx(0.1), "mean_error": 0.01,
                                      "evaluations": 3000.0, "seeds": 3}
    # Pathfinder from a report's fits.csv (the configuration no store has)
    path = tmp_path / "fits.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, ["model", "method", "profile", "family", "seed", "status",
                                "mean_error_sd", "w1_sd", "draw_evaluations"])
        w.writeheader()
        for p in ("a", "b", "c"):
            w.writerow({"model": p, "method": "pathfinder", "profile": "multi", "family": "none",
                        "seed": 0, "status": "converged", "mean_error_sd": 0.05, "w1_sd": 0.08,
                        "draw_evaluations": 9000})
            # a TrustVI row in the CSV is ignored: the stores have that configuration
            w.writerow({"model": p, "method": "trustvi", "profile": "default",
                        "family": "meanfield", "seed": 0, "status": "converged",
                        "mean_error_sd": 0.9, "w1_sd": 0.9, "draw_evaluations": 10**6})
    records += [r for r in lp.csv_records(path) if lp.config(r) not in
                {lp.config(x) for x in records}]
    figures = lp.targets(lp.per_posterior(records))
    assert figures["posteriors"] == 3
    # W1 medians: low-rank 0.1, full rank 0.08 -> 1.25; Pathfinder 0.08 -> 1.25
    assert figures["w1_vs_fullrank"] == pytest.approx(1.25)
    assert figures["w1_vs_pathfinder"] == pytest.approx(1.25)
    # evaluations: 3000 against mean-field's median 2000 -> 1.5; within 2x on b and c only
    assert figures["evaluations_vs_meanfield"] == pytest.approx(1.5)
    # per posterior: 3000/1000, 3000/2000, 3000/4000 -> the median 1.5 (a, b, c: 3, 1.5, 0.75)
    assert figures["evaluations_vs_meanfield_per_posterior"] == pytest.approx(1.5)
    assert figures["posteriors_within_2x_meanfield_evaluations"] == 2
    assert figures["posteriors_within_1.5x_fullrank_w1"] == 3
    assert figures["posteriors_below_pathfinder_w1"] == 1   # a only (0.05 <= 0.08)


def test_the_two_readings_of_the_evaluations_target_differ():
    """The ratio of the medians (the target as the bench reads it) and the median of each
    posterior's own ratio, on posteriors where they differ: low rank 1,000, 1,200, 5,000
    against mean-field 100, 1,000, 4,000 -> 1,200 / 1,000 = 1.2, and the median of 10, 1.2,
    1.25 = 1.25."""
    records = []
    for p, lr, mf in (("a", 1000, 100), ("b", 1200, 1000), ("c", 5000, 4000)):
        records.append(_rec(p, "trustvi", "lowrank", 0, 0.05, 0.01, lr))
        records.append(_rec(p, "trustvi", "meanfield", 0, 0.5, 0.01, mf))
    figures = lp.targets(lp.per_posterior(records))
    assert figures["evaluations_vs_meanfield"] == pytest.approx(1.2)
    assert figures["evaluations_vs_meanfield_per_posterior"] == pytest.approx(1.25)
    assert "the median of the posteriors' own ratios: 1.25" in lp.report_text(
        lp.per_posterior(records), figures)
