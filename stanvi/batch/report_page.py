"""The HTML of ``stanvi report`` for people (issue T3-4, item 3; docs/batch.md#the-report):
numbers rounded for reading, headers with units, sortable tables, a summary at the top that
says which method to use how often at what cost, failure reasons grouped, and per model the
recommendation of :mod:`stanvi.batch.recommend` with its figures.  The machines' view is the
CSV files beside the page."""

from __future__ import annotations

import html
import math
import re
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from stanvi.batch.recommend import MEAN_ERROR_OK, W1_OK, label
from stanvi.batch.summary import config_of

STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;"
         "line-height:1.4;color:#222}table{border-collapse:collapse;font-size:13px;"
         "margin:.5em 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;"
         "vertical-align:top}td[data-v]{text-align:right}th{background:#f3f3f3;cursor:pointer;"
         "user-select:none}th.sorted-asc::after{content:' ▲'}th.sorted-desc::after"
         "{content:' ▼'}img{max-width:100%;margin:.5em 0}details{margin:.3em 0}summary"
         "{cursor:pointer}.why{color:#444;font-size:14px}.warn{color:#a40}")
SORT_SCRIPT = (
    "document.querySelectorAll('table.sortable th').forEach((th, i) => th.addEventListener("
    "'click', () => { const tb = th.closest('table').tBodies[0]; const asc = !th.classList."
    "contains('sorted-asc'); th.parentNode.querySelectorAll('th').forEach(h => h.classList."
    "remove('sorted-asc', 'sorted-desc')); th.classList.add(asc ? 'sorted-asc' : 'sorted-desc');"
    " const key = r => { const c = r.cells[i]; const v = c.dataset.v; return v === undefined ?"
    " c.textContent : parseFloat(v); }; [...tb.rows].sort((a, b) => { const x = key(a), y = "
    "key(b); const d = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x)."
    "localeCompare(String(y)); return asc ? d : -d; }).forEach(r => tb.appendChild(r)); }));"
    "window.addEventListener('load', () => { document.body.dataset.imagesLoaded = "
    "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length; });"
    # a link to a model's section (index.html#model-...) opens it and scrolls to it
    "const openHash = () => { const d = location.hash && document.getElementById("
    "decodeURIComponent(location.hash.slice(1))); if (d && d.tagName === 'DETAILS') { d.open "
    "= true; d.scrollIntoView(); } }; window.addEventListener('hashchange', openHash); "
    "window.addEventListener('load', openHash);")


def model_anchor(model: str) -> str:
    """The id of a model's section on the page (``index.html#model-ARM-Ch.10-...`` opens it)."""
    return "model-" + re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-")


def seconds(v) -> str:
    """'4 ms', '0.31 s', '12 s', '3.2 min', '1.5 h'."""
    if v is None or not math.isfinite(v):
        return "–"
    if v < 1:
        return f"{v * 1000:.2g} ms" if v < 0.1 else f"{v:.2f} s"
    if v < 100:
        return f"{v:.3g} s"
    return f"{v / 60:.2g} min" if v < 5400 else f"{v / 3600:.2g} h"


def count(v) -> str:
    """'980', '12,300', '4.1 M'."""
    if v is None or not math.isfinite(v):
        return "–"
    if v >= 1e6:
        return f"{v / 1e6:.2g} M"
    return f"{int(round(float(f'{v:.3g}'))):,}"


def error(v) -> str:
    """An accuracy figure in posterior sds: two significant digits; beyond 100 sds '> 100'."""
    if v is None or not math.isfinite(v):
        return "–"
    return "> 100" if v > 100 else f"{v:.2g}"


def nats(v) -> str:
    """An ELBO gap in nats, to 0.1; beyond 10⁶ '> 10⁶' (a diverged fit)."""
    if v is None or not math.isfinite(v):
        return "–"
    return "> 10⁶" if abs(v) > 1e6 else f"{v:.1f}"


def table(rows: list[dict], columns: list[tuple[str, str, Any]], cls: str = "sortable") -> str:
    """``columns``: (header, key, formatter or None); numbers sort by their raw value."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in columns)
    body = []
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            v = r.get(key)
            text = fmt(v) if fmt is not None else ("" if v is None else str(v))
            raw = (f' data-v="{float(v):.10g}"' if isinstance(v, (int, float))
                   and not isinstance(v, bool) and math.isfinite(v) else "")
            cells.append(f"<td{raw}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            f"</tbody></table>")


def _median(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.median(vals)) if vals else None


def method_rows(rows: list[dict], recommendations: dict[str, dict]) -> list[dict]:
    """Per configuration over the models: models run, fits ok, medians of accuracy, run time
    and evaluations, and how often it is the recommendation."""
    chosen = Counter(rec["config"] for rec in recommendations.values() if rec["config"])
    by_config: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_config[r["config"]].append(r)
    out = []
    for config, rs in sorted(by_config.items()):
        out.append({"method": label(config), "models": len(rs),
                    "ok": f"{sum(r['ok'] for r in rs)} / {sum(r['runs'] for r in rs)}",
                    "mean_error": _median(r.get("mean_error_sd") for r in rs),
                    "w1": _median(r.get("w1_sd") for r in rs),
                    "time": _median(r.get("median_run_time") for r in rs),
                    "evaluations": _median(r.get("median_draw_evaluations") for r in rs),
                    "recommended": chosen.get(config, 0)})
    return out


METHOD_COLUMNS = [("Method", "method", None), ("Models", "models", None),
                  ("Fits ok / run", "ok", None), ("Mean error (sd)", "mean_error", error),
                  ("W1 (sd)", "w1", error), ("Run time per fit", "time", seconds),
                  ("Model evaluations per fit", "evaluations", count),
                  ("Recommended on (models)", "recommended", None)]


def trusted_methods_table(rows: list[dict], recommendations: dict[str, dict],
                          references: dict[str, dict]) -> list[str]:
    """The methods' table again over the models whose NUTS reference passed its checks
    (R-hat, ESS, divergences: docs/batch.md#nuts-references), where some reference did not:
    the accuracy a Stan user can rely on (docs/batch.md#the-report).  Empty without such a
    split."""
    trusted = {m for m, ref in references.items() if ref.get("trustworthy")}
    judged = {r["model"] for r in rows if r.get("mean_error_sd") is not None}
    if not trusted or judged <= trusted:
        return []
    kept = [r for r in rows if r["model"] in trusted]
    return [f"<p class='why' id='trusted'>The same over the {len(trusted & judged)} models "
            "whose NUTS reference passed its checks (R-hat ≤ 1.01, bulk and tail ESS ≥ 400, no "
            "divergences); the table above also counts accuracy against references that "
            "failed them.</p>",
            table(method_rows(kept, {m: rec for m, rec in recommendations.items()
                                     if m in trusted}), METHOD_COLUMNS)]


#: What a failure message says before its reason, which the table's columns already say: the
#: exception's class, "Stan's ADVI (meanfield) failed on model 'x': Stan's ADVI (meanfield)
#: failed with code 70:", "model 'x':", and Stan's "warn:" tags.
_WRAPPERS = re.compile(r"^\w*(Error|Exception): |Stan's [\w ]+(\([\w -]+\) )?failed (on model "
                       r"'[^']*'|with code -?\d+): ?|^model '[^']*': |\bwarn: ")
#: A reason longer than this is cut at a word, with an ellipsis.
REASON_CHARS = 160


def _reason(message: str) -> str:
    """A failure message reduced to its kind: what the method, status and models columns say
    already left out (``_WRAPPERS``), numbers, quoted values and paths blanked, cut at the first
    sentence and at a word, so that the same failure on different models groups together and
    reads whole.  Stan's progress lines in a message (``info: Success! Found best value
    [eta = 1] ...``, printed before its ADVI gives up with code 70) are not the reason and are
    left out."""
    lines = [ln for ln in (message or "").splitlines() if not ln.strip().startswith("info:")]
    text = re.sub(r"\s+", " ", " ".join(lines)).strip()
    while (shorter := _WRAPPERS.sub("", text, count=1)) != text:
        text = shorter.strip()
    text = re.sub(r"(/[\w.\-]+)+", "…", text)
    text = re.sub(r"-?\d[\d.,e+\-]*", "#", text)
    # quoted values ('x', "y"), not apostrophes (Stan's, q's)
    text = re.sub(r"(?<!\w)'[^']*'(?!\w)|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\b\w+(::\w+)+:\s*", "", text)     # C++ function names before Stan's messages
    text = re.split(r"(?<!\bi\.e)\. ", text.split(";")[0])[0].strip().rstrip(".")
    if len(text) > REASON_CHARS:
        text = text[:REASON_CHARS].rsplit(" ", 1)[0].rstrip(",:;") + " …"
    elif text.count("(") > text.count(")"):   # a parenthesis the cut at ';' left open
        text += ")"
    if re.match(r"[a-z]+\b", text):   # a sentence, not an identifier (failed_gradient)
        text = text[0].upper() + text[1:]
    return text or "(no message)"


def failure_rows(fits: list[dict], ok_statuses) -> list[dict]:
    """Failed fits grouped by configuration, status and the kind of message, with counts and
    up to three of the models; fits whose record is incomplete (the timeout or a crash stopped
    the evaluation after the fit, docs/batch.md#partial-records) are grouped with them, their
    status marked so and the reason saying after which stages.  ``no_method_fit``: how many of
    a group's fits are on models that no configuration fitted (a model whose data do not fit
    it, say, rather than the method)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    tried = {r["model"] for r in fits if r.get("status") not in ("skipped", "not_compiled")}
    unfit = tried - {r["model"] for r in fits if r.get("status") in ok_statuses}
    for r in fits:
        if r.get("status") in ("skipped", "not_compiled"):
            continue
        if r.get("status") in ok_statuses:
            if not r.get("incomplete"):
                continue
            key = (label(config_of(r)), f"{r.get('status')}, record incomplete",
                   f"{_reason(r['incomplete'])} after: {', '.join(r.get('evaluated') or [])}")
        else:
            key = (label(config_of(r)), r.get("status"), _reason(r.get("message")))
        groups[key].append(r["model"])
    return [{"method": m, "status": s, "reason": why, "fits": len(models),
             "no_method_fit": sum(model in unfit for model in models),
             "models": ", ".join(sorted(set(models))[:3]) + (" …" if len(set(models)) > 3
                                                              else "")}
            for (m, s, why), models in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


FAILURE_COLUMNS = [("Method", "method", None), ("Status", "status", None),
                   ("Reason", "reason", None), ("Fits", "fits", None),
                   ("Of them on models no method fitted", "no_method_fit", None),
                   ("Models", "models", None)]

MODEL_COLUMNS = [("Method", "method", None), ("Fits ok / run", "ok_runs", None),
                 ("Mean error (sd)", "mean_error_sd", error), ("W1 (sd)", "w1_sd", error),
                 ("ELBO below the best (nats)", "gap_to_best", nats),
                 ("Run time per fit", "median_run_time", seconds),
                 ("Model evaluations per fit", "median_draw_evaluations", count)]


def summary_text(recommendations: dict[str, dict], n_models: int,
                 references: dict[str, dict]) -> str:
    """The page's opening paragraph."""
    levels = Counter(rec["level"] for rec in recommendations.values())
    chosen = Counter(label(rec["config"]) for rec in recommendations.values()
                     if rec["config"] and rec["level"] in ("marginals", "means"))
    trusted = sum(bool(r.get("trustworthy")) for r in references.values())
    status = Counter(r.get("status") for r in references.values())
    parts = [f"{n_models} models fitted. "]
    if references:
        # the records of models that do not compile carry no reference: not counted as run
        ran = status["ok"] + status["timeout"] + status["error"]
        stopped = [f"{status[k]} {what}" for k, what in (("timeout", "timed out"),
                                                         ("error", "failed")) if status[k]]
        parts.append(f"NUTS references: {status['ok']} of {ran} run"
                     f"{' (' + ', '.join(stopped) + ')' if stopped else ''}, {trusted} of them "
                     f"pass R-hat ≤ 1.01, ESS ≥ 400 and no divergences. ")
    judged = sum(levels[k] for k in ("marginals", "means", "nuts"))
    if judged:
        top = ", ".join(f"{name} on {k}" for name, k in chosen.most_common(4))
        parts.append(
            f"On {judged} models with accuracy figures, a variational method gets the means within "
            f"{MEAN_ERROR_OK} sd and the marginals within W1 {W1_OK} sd on every seed for "
            f"{levels['marginals']}, the means only for {levels['means']}, and neither for "
            f"{levels['nuts']} (use NUTS there). The cheapest acceptable method: {top or 'none'}.")
    else:
        parts.append("No fit has accuracy figures (no reference draws): the tables below give "
                     "outcomes and costs only.")
    return "".join(parts)
