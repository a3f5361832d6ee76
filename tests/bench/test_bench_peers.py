"""``stanvi bench peers`` (stanvi.bench.peers, peers_report): TrustVI's ratios to single-path
Pathfinder are per-model ratios of medians, the overall table takes medians over models, the
plot is written, and a real run on one model with reference draws gives every figure."""

from __future__ import annotations

import json

import numpy as np
import pytest

import stanvi

from stanvi.bench import peers, peers_report


def _result(model: str, tv: dict, pf: dict) -> dict:
    return {"model": model, "dim": 3, "medians": {"trustvi": tv, "pathfinder": pf}}


def test_ratios_are_per_model_and_the_overall_median_over_models():
    results = [
        _result("a", {"evaluations": 100, "wall": 0.02}, {"evaluations": 1000, "wall": 0.01}),
        _result("b", {"evaluations": 300, "wall": 0.03}, {"evaluations": 100, "wall": 0.01}),
        _result("c", {"evaluations": 500, "wall": None}, {"evaluations": 250, "wall": 0.01}),
        _result("d", {"evaluations": 50, "wall": 0.01}, {"evaluations": None, "wall": None}),
    ]
    assert peers_report.ratios(results, "trustvi", "evaluations") == pytest.approx([0.1, 3.0, 2.0])
    assert peers_report.ratios(results, "trustvi", "wall") == pytest.approx([2.0, 3.0])
    table = peers_report.overall(results)
    assert table["trustvi"]["ratio_evaluations"] == pytest.approx(2.0)
    assert table["trustvi"]["ratio_evaluations_models"] == 3
    assert table["trustvi"]["evaluations"] == pytest.approx(np.median([100, 300, 500, 50]))
    assert table["pathfinder"]["models"] == 4


def test_the_new_process_with_the_verdict_is_divided_by_pathfinders_new_process():
    """Pathfinder computes no k-hat verdict, so stanvi's process that also computes one is
    divided by Pathfinder's plain new process."""
    results = [_result("a", {"new_process": 0.6, "new_process_verdict": 0.9},
                       {"new_process": 0.4}),
               _result("b", {"new_process": 0.5, "new_process_verdict": 1.5},
                       {"new_process": 0.5})]
    assert peers_report.ratios(results, "trustvi", "new_process_verdict") == pytest.approx(
        [2.25, 3.0])
    table = peers_report.overall(results)
    assert table["trustvi"]["ratio_new_process"] == pytest.approx(1.25)
    assert table["trustvi"]["ratio_new_process_verdict"] == pytest.approx(2.625)


def test_plot_is_written(tmp_path):
    results = [_result(m, {"evaluations": e, "w1_sd": 0.1, "mean_error_sd": 0.01},
                       {"evaluations": 2 * e, "w1_sd": 0.2, "mean_error_sd": 0.05})
               for m, e in (("a", 100), ("b", 400))]
    path = tmp_path / "acc.png"
    peers_report.plot_accuracy(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_run_on_a_model_with_reference_draws(load_target, tmp_path):
    """One model, reference draws given (posteriordb's way): TrustVI and single-path Pathfinder
    run, every figure is there, and the JSON output holds the runs."""
    # gaussian_diag: its services library is built by tests/reference/test_reference_stan.py anyway
    target = load_target("gaussian_diag")
    rng = np.random.default_rng(0)
    reference = {f"z[{i}]": rng.normal(size=400) for i in (1, 2, 3)}
    from stanvi.evaluation.models import discover_models  # noqa: PLC0415
    from stanvi.evaluation.optima import MODELS_DIR  # noqa: PLC0415

    (name, stan, data), = [m for m in discover_models(MODELS_DIR) if m[0] == "gaussian_diag"]
    case = peers.PeerCase(name, stan, str(data), reference)
    out = tmp_path / "peers.json"
    results = peers.run([case], seeds=2, methods=("trustvi", "pathfinder"), output=out)
    med = results[0]["medians"]
    for method in ("trustvi", "pathfinder"):
        assert med[method]["failed"] == 0
        assert med[method]["evaluations"] > 0 and med[method]["wall"] > 0
        assert med[method]["mean_error_sd"] is not None
    assert med["trustvi"]["statuses"] == ["converged"]
    assert med["trustvi"]["diagnostic_evaluations"] >= peers.OUTPUT_DRAWS
    assert med["trustvi"]["verdict_wall"] > 0
    assert json.loads(out.read_text())[0]["model"] == "gaussian_diag"
    assert target.dim == results[0]["dim"]


def test_diagnostic_evaluations_count_every_draw_of_the_verdict(compiled):
    """bernoulli's k-hat stays undecided past the first S_diag draws, so the verdict adds
    draws: the bench counts all of them (it used to count the first S_diag only)."""
    from stanvi.bench.coldstart import DEFAULT_MODELS_DIR  # noqa: PLC0415
    from stanvi.diagnostics.draws import diagnostic_draw_count  # noqa: PLC0415

    compiled("bernoulli")
    stan = DEFAULT_MODELS_DIR / "bernoulli" / "bernoulli.stan"
    data = DEFAULT_MODELS_DIR / "bernoulli" / "bernoulli.data.json"
    case = peers.PeerCase("bernoulli", stan, str(data), {"theta": np.full(400, 0.25)})
    run = peers.run([case], seeds=1, methods=("trustvi",))[0]["runs"]["trustvi"][0]
    fit = stanvi.fit(str(stan), data=str(data), method="trustvi", seed=0, progress=False,
                     draws=peers.OUTPUT_DRAWS)
    used = fit.diagnostics().n_draws
    assert used > diagnostic_draw_count(1, peers.OUTPUT_DRAWS)   # draws were added
    assert run["diagnostic_evaluations"] == peers.OUTPUT_DRAWS + used
