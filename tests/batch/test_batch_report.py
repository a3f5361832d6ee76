"""``stanvi report`` (issue P2-2, "Report"): the tables computed from a runs directory of
synthetic records whose protocol figures are known, and the HTML page loaded in a real browser
(headless Chromium, skipped with the reason where it is not installed)."""

from __future__ import annotations

import csv
import shutil
import subprocess

import pytest

from stanvi.batch.report import write_report
from stanvi.batch.store import RunStore
from stanvi.batch.summary import config_of


def record(model, method, seed, final, iters, oracle, elbo, status="converged", dim=3, acc=None):
    rec = {"model": model, "source": "posteriordb", "method": method, "profile": None,
           "family": "meanfield", "seed": seed, "options": {}, "status": status,
           "message": "" if status == "converged" else "stan::variational: boom",
           "final_elbo": final if status != "failed" else None, "elbo": final, "elbo_se": 0.01,
           "iterations": iters[-1], "draw_evaluations": 1000 + seed, "run_time": 0.5,
           "compile_time": 0.1, "khat": 0.3, "verdict": "good", "oracle": {"oracle_scaled": oracle[-1]},
           "task_seconds": 60.0 * (seed + 1) * (2 if method == "advi" else 1),
           "trace_points": {"iteration": iters, "oracle": oracle, "draws": [10 * o for o in oracle],
                            "run_time": [0.01 * i for i in iters], "elbo": elbo}}
    if acc is not None:
        rec["accuracy"] = {"constrained": {"mean_error_sd_median": acc, "w1_sd_median": 2 * acc}}
    return rec


@pytest.fixture
def runs(tmp_path):
    store = RunStore(tmp_path / "runs")
    for seed, shift in enumerate((0.0, 0.2, -0.2)):
        # m1: TrustVI reaches the threshold (-11.8) at 20 oracle calls, ADVI at 1200: 60x; a tie
        store.put("fit", f"m1-t-{seed}", record("m1", "trustvi", seed, -10.0 + shift, [0, 5, 10, 20],
                                                [0, 10, 20, 40], [-100, -20, -10.5, -10], acc=0.05))
        store.put("fit", f"m1-a-{seed}", record("m1", "advi", seed, -10.8 + shift, [0, 50, 100, 300],
                                                [0, 100, 400, 1200], [-100, -50, -12, -10.8], acc=0.3))
        # m2: ADVI fails on every seed -> the pair is excluded; TrustVI 3 nats better is moot
        store.put("fit", f"m2-t-{seed}", record("m2", "trustvi", seed, -5.0, [0, 6, 12],
                                                [0, 5, 9], [-50, -6, -5]))
        store.put("fit", f"m2-a-{seed}", record("m2", "advi", seed, None, [0, 50], [0, 100],
                                                [-50, -8], status="failed"))
        # m3: both reach the threshold within 4 iterations -> excluded; TrustVI better by 2 nats
        store.put("fit", f"m3-t-{seed}", record("m3", "trustvi", seed, -1.0, [0, 2, 3], [0, 2, 3],
                                                [-30, -1.5, -1.0]))
        store.put("fit", f"m3-a-{seed}", record("m3", "advi", seed, -3.0, [0, 1, 2], [0, 4, 8],
                                                [-30, -3.5, -3.0]))
    for m in ("m1", "m2", "m3"):
        store.put("compile", m, {"model": m, "source": "posteriordb", "status": "ok", "dim": 3})
    store.put("compile", "m4", {"model": "m4", "source": "posteriordb", "status": "compile_failed",
                                "message": "Syntax error in 'm4.stan', line 2"})
    return tmp_path / "runs"


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_tables(runs):
    index = write_report(runs)
    out = index.parent
    proto = {r["model"]: r for r in rows(out / "protocol.csv")}
    assert float(proto["m1"]["ratio"]) == pytest.approx(60.0)
    assert float(proto["m1"]["threshold"]) == pytest.approx(-11.8)
    assert proto["m1"]["quality"] == "tie" and proto["m1"]["excluded"] == ""
    assert proto["m2"]["excluded"] == "a median run failed"
    assert proto["m3"]["excluded"] == "fewer than 5 iterations" and proto["m3"]["quality"] == "a_better"
    models = {(r["model"], r["config"]): r for r in rows(out / "models.csv")}
    t1 = models[("m1", "trustvi:default:meanfield")]
    assert float(t1["median_final_elbo"]) == pytest.approx(-10.0)
    assert float(t1["draws_to_1nat"]) == pytest.approx(200.0)   # the point at 20 oracle calls
    a1 = models[("m1", "advi:stan:meanfield")]
    assert float(a1["gap_to_best"]) == pytest.approx(0.8)
    assert float(a1["draws_to_1nat"]) == pytest.approx(12000.0)   # -10.8 >= best - 1 = -11
    assert float(a1["mean_error_sd"]) == pytest.approx(0.3)
    a2 = models[("m2", "advi:stan:meanfield")]
    assert a2["ok"] == "0" and "failed: stan::variational: boom" in a2["failures"]
    assert len(rows(out / "fits.csv")) == 18
    compiles = {r["model"]: r for r in rows(out / "compiles.csv")}
    assert compiles["m4"]["status"] == "compile_failed"
    page = index.read_text()
    # task time: seeds 0-2 take 1, 2, 3 minutes per TrustVI fit and twice that per ADVI fit
    # (3 models each); the compile records carry no task time
    assert "fits 0.90 h, compiles 0.00 h" in page
    # readable numbers with their raw values for sorting: ADVI's mean error 0.3 sd, W1 0.6 sd
    assert '<td data-v="0.3">0.3</td>' in page and '<td data-v="0.6">0.6</td>' in page
    for needle in ("TrustVI default (mean-field) vs ADVI stan (mean-field)", "m4",
                   "Syntax error", "accuracy.png", "traces.png", "evaluations.png",
                   "Which method to use",
                   "Mean error (sd)", "Run time per fit"):
        assert needle in page
    assert str(runs.parent) not in page   # no absolute path of the producing machine
    # each model's section can be linked to (index.html#model-m1 opens it)
    assert "<details id='model-m1'>" in page and "openHash" in page
    for img in ("accuracy.png", "traces.png", "evaluations.png"):
        assert (out / img).stat().st_size > 5000
    # one model's protocol ratio kept: no CDF of speed-ups (an empty-looking panel)
    assert not (out / "cdf_speedups.png").exists() and "cdf_speedups.png" not in page
    recs = {r["model"]: r for r in rows(out / "recommendations.csv")}
    # m1: TrustVI's mean error 0.05 and W1 0.1 on all seeds, ADVI's 0.3: TrustVI
    assert recs["m1"]["config"] == "trustvi:default:meanfield"
    assert recs["m1"]["level"] == "marginals" and "0.05" in recs["m1"]["why"]
    assert recs["m2"]["level"] == "unjudged"   # no accuracy figures


def test_no_accuracy_plot_without_reference_draws(runs, tmp_path):
    """example-models has no reference draws: the page says so instead of an empty scatter, and
    a report rewritten into a directory that had one does not keep the stale figure."""
    out = write_report(runs, tmp_path / "rep").parent
    assert (out / "accuracy.png").is_file()
    store = RunStore(runs)
    for path in (runs / "records" / "fit").glob("*.json"):   # the fixture's keys are file-safe
        rec = store.get("fit", path.stem)
        rec.pop("accuracy", None)
        store.put("fit", path.stem, rec)
    page = write_report(runs, out).read_text()
    assert not (out / "accuracy.png").exists() and "accuracy.png" not in page
    assert "No fit has accuracy figures (no reference draws)" in page
    assert (out / "traces.png").is_file()


def test_trace_panels_give_a_configuration_one_colour_and_one_legend(runs):
    """With no ADVI records on m2 (as when every ADVI run errored before a trace), TrustVI must
    keep on m2 the colour it has on m1, and the figure's one legend names both configurations."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from stanvi.batch.report import trace_figure  # noqa: PLC0415
    from stanvi.batch.summary import group_runs  # noqa: PLC0415

    grouped = group_runs(RunStore(runs).records("fit"))
    del grouped["m2"]["advi:stan:meanfield"]
    fig = trace_figure(plt, grouped, ["m2", "m1"])
    try:
        colours = [{line.get_label(): line.get_color() for line in ax.get_lines()}
                   for ax in fig.axes[:2]]
        assert set(colours[0]) == {"trustvi:default:meanfield"}
        assert set(colours[1]) == {"trustvi:default:meanfield", "advi:stan:meanfield"}
        assert colours[0]["trustvi:default:meanfield"] == colours[1]["trustvi:default:meanfield"]
        assert colours[1]["advi:stan:meanfield"] != colours[1]["trustvi:default:meanfield"]
        (legend,) = fig.legends
        assert sorted(t.get_text() for t in legend.get_texts()) == [
            "advi:stan:meanfield", "trustvi:default:meanfield"]
        assert all(ax.get_legend() is None for ax in fig.axes)
    finally:
        plt.close(fig)


def test_trace_panels_show_the_speed_ups_first_then_the_readable_gaps(runs):
    """m1's kept pair (ratio 60) comes first; m3 and m2 fill by ELBO gap (2 nats, then 0); a
    model whose gap is a run stuck at −1e300 is never chosen (its panel would flatten)."""
    from stanvi.batch.report import trace_models  # noqa: PLC0415
    from stanvi.batch.summary import group_runs, model_rows, protocol_pairs  # noqa: PLC0415

    grouped = group_runs(RunStore(runs).records("fit"))
    rows = model_rows(grouped, {})
    pairs = {"t vs a": protocol_pairs(grouped, "trustvi:default:meanfield",
                                      "advi:stan:meanfield")}
    assert trace_models(rows, pairs) == ["m1", "m3", "m2"]
    stuck = [{"model": "m9", "gap_to_best": 6e303}]
    assert trace_models(rows + stuck, pairs, n=2) == ["m1", "m3"]
    assert "m9" not in trace_models(rows + stuck, pairs)
    assert trace_models(rows, {}, n=1) == ["m3"]


def test_a_record_without_a_profile_is_labelled_with_the_profile_that_ran():
    """A record without a profile is labelled with the profile its method runs by default:
    ``--methods advi`` runs Stan's ADVI (``advi:stan``), not a profile called ``default``; HFSGVI's
    default is now its safeguarded ``default`` profile (T3-2 item 2), its paper's is ``paper``."""
    label = lambda method, profile=None, family="meanfield": config_of(  # noqa: E731
        {"method": method, "profile": profile, "family": family})
    assert label("hfsgvi") == "hfsgvi:default:meanfield"
    assert label("hfsgvi", "paper") == "hfsgvi:paper:meanfield"
    assert label("advi", family="fullrank") == "advi:stan:fullrank"
    assert label("trustvi") == "trustvi:default:meanfield"
    assert label("pathfinder", family="none") == "pathfinder:multi:none"
    assert label("nuts", family="none") == "nuts:diag:none"
    assert label("stan-advi") == "stan-advi:default:meanfield"


def test_report_of_one_family(runs, tmp_path):
    """``family=`` keeps that family's fits and those of family-free methods (Pathfinder): a
    full-rank fit in the same runs directory stays out of the mean-field report and is the only
    stanvi fit of the full-rank one."""
    store = RunStore(runs)
    full = record("m1", "trustvi", 0, -9.0, [0, 5, 10], [0, 10, 20], [-100, -20, -9.0])
    store.put("fit", "m1-t-0-full", {**full, "family": "fullrank"})
    path = record("m1", "pathfinder", 0, -9.5, [0], [0], [-9.5])
    store.put("fit", "m1-p-0", {**path, "family": "none", "trace_points": None})
    mean_out = write_report(runs, tmp_path / "mf", family="meanfield").parent
    configs = {r["config"] for r in rows(mean_out / "models.csv")}
    assert "trustvi:default:fullrank" not in configs and "pathfinder:multi:none" in configs
    assert len(rows(mean_out / "fits.csv")) == 19
    full_out = write_report(runs, tmp_path / "fr", family="fullrank").parent
    fits = rows(full_out / "fits.csv")
    assert sorted(r["family"] for r in fits) == ["fullrank", "none"]
    assert len(rows(write_report(runs, tmp_path / "all").parent / "fits.csv")) == 20


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(runs, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium); "
                    "the page's tables are checked by test_report_tables")
    index = write_report(runs)
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=5000", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([browser, *flags, "--dump-dom", index.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]   # no JavaScript error
    # the page's own script counts the images that decoded, once they have loaded: every <img>
    # on the page (this fixture has accuracy.png, evaluations.png and traces.png)
    images = index.read_text().count("<img ")
    assert images == 3, images
    assert f'data-images-loaded="{images}"' in dom.stdout, dom.stdout[:2000]
    # the summary, the methods' table, the failures, a table per model (3), the protocol and
    # the compile failures
    assert "id=\"summary\"" in dom.stdout and dom.stdout.count("<table") == 7
    assert "60×" in dom.stdout
    res = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1400,2400",
                          index.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-2000:]
    from PIL import Image  # matplotlib's dependency  # noqa: PLC0415

    with Image.open(shot) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50      # not a blank page


def test_incomplete_records_are_grouped_with_the_failures():
    """A fit kept from a partial record (docs/batch.md#partial-records) is counted among the
    failure reasons, its own status marked incomplete, with the stages it had done."""
    from stanvi.batch.report_page import failure_rows
    from stanvi.batch.runner import OK_STATUSES

    stopped = ("stopped after 300 s (the task's timeout); its process was killed after the "
               "stage(s) fit, elbo of its record; the figures of the later ones are missing")
    fits = [{**record(m, "trustvi", 0, -1.0, [0, 1], [0, 1], [-2, -1]),
             "incomplete": stopped, "evaluated": ["fit", "elbo"]} for m in ("m1", "m2")]
    fits.append(record("m3", "trustvi", 0, -1.0, [0, 1], [0, 1], [-2, -1]))   # complete
    fits.append(record("m4", "trustvi", 0, -1.0, [0, 1], [0, 1], [-2, -1], status="failed"))
    rows = failure_rows(fits, OK_STATUSES)
    assert len(rows) == 2
    assert rows[0]["status"] == "converged, record incomplete" and rows[0]["fits"] == 2
    assert rows[0]["reason"] == "Stopped after # s (the task's timeout) after: fit, elbo"
    assert rows[0]["models"] == "m1, m2"
    assert rows[1]["status"] == "failed" and rows[1]["models"] == "m4"
    # m4 has no other fit: no method fitted it; m1 and m2 did converge (incompletely)
    assert rows[1]["no_method_fit"] == 1 and rows[0]["no_method_fit"] == 0
    fits.append(record("m4", "advi", 0, -1.0, [0, 1], [0, 1], [-2, -1]))      # now one did
    assert failure_rows(fits, OK_STATUSES)[1]["no_method_fit"] == 0


def test_the_protocol_compares_trustvi_within_a_family_and_with_familyless_methods():
    from stanvi.batch.report import protocol_comparisons

    configs = ["advi:paper:meanfield", "advi:stan:fullrank", "hfsgvi:paper:none",
               "pathfinder:single:none", "trustvi:default:fullrank", "trustvi:paper:meanfield"]
    traced = {"advi:paper:meanfield", "advi:stan:fullrank", "hfsgvi:paper:none",
              "trustvi:default:fullrank", "trustvi:paper:meanfield"}   # not Stan's Pathfinder
    assert protocol_comparisons(configs, traced) == [
        ("trustvi:default:fullrank", "advi:stan:fullrank"),
        ("trustvi:default:fullrank", "hfsgvi:paper:none"),
        ("trustvi:paper:meanfield", "advi:paper:meanfield"),
        ("trustvi:paper:meanfield", "hfsgvi:paper:none")]


def test_the_protocol_summary_counts_every_model_once():
    from stanvi.batch.summary import pair_summary

    pairs = [{"quality": "a_better", "excluded": None, "ratio": 40.0},
             {"quality": "tie", "excluded": None, "ratio": 12.0},
             {"quality": "tie", "excluded": "fewer than 5 iterations", "ratio": 100.0},
             {"quality": "b_better", "excluded": None, "ratio": 0.5},
             {"quality": None, "excluded": "a median run failed"}]
    s = pair_summary(pairs)
    assert (s["models"], s["tested_better"], s["tie"], s["baseline_better"],
            s["not_judged"]) == (5, 1, 2, 1, 1)
    assert s["tested_better"] + s["tie"] + s["baseline_better"] + s["not_judged"] == s["models"]
    assert (s["kept"], s["faster"], s["ge_12x"], s["ge_36x"]) == (3, 2, 2, 1)
    assert s["median_ratio"] == 12.0 and s["ratios"] == [0.5, 12.0, 40.0]
