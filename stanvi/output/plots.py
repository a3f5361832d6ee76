"""Plots of variational fits (matplotlib).

* :func:`plot_elbo`: ELBO trace against oracle calls and against wall time, for one or several
  fits, on log x axes like the TrustVI paper's figures (Regier et al. 2017, Fig. 1–3).
* :func:`plot_marginals`: marginal densities of the VI draws, optionally against reference draws
  (e.g. NUTS) and with the PSIS-reweighted VI density.
* :func:`plot_khat`: Pareto k-hat of one or several fits against the verdict bands, with the
  distribution of the log importance weights.

Every function returns a :class:`matplotlib.figure.Figure` and writes a PNG when given ``path``.
The figures are built without pyplot, so they render with the Agg backend and need no display;
in Jupyter a returned figure shows inline (once).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.stan.names import element_labels

_BAND_COLORS = {"good": "#d9f0d3", "use with care": "#fff3c4", "unreliable": "#f8d0cc"}


def _figure(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    ip = sys.modules.get("IPython")
    if ip is not None and getattr(ip, "get_ipython", lambda: None)() is not None:
        import matplotlib.pyplot  # noqa: F401, PLC0415  (registers Jupyter's figure display)
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=figsize or (5.0 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, axes


def _finish(fig, path) -> Any:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def _as_list(fits) -> list:
    if isinstance(fits, Mapping):
        return list(fits.values())
    if isinstance(fits, Sequence) and not isinstance(fits, str):
        return list(fits)
    return [fits]


def _labels(fits, labels) -> list[str]:
    if labels is not None:
        return list(labels)
    if isinstance(fits, Mapping):
        return [str(k) for k in fits]
    out = []
    for f in _as_list(fits):
        label = f"{getattr(f, 'method', 'fit')} ({getattr(f, 'family_name', '')})"
        out.append(label if label not in out else f"{label} #{len(out) + 1}")
    return out


# ------------------------------------------------------------------------------ ELBO traces
def _robust_ylim(values: np.ndarray) -> tuple[float, float] | None:
    """A y range showing the approach to the optimum: from the 5th percentile of the ELBO
    estimates, but no lower than 10 × (best − median) below the best, so that a few wild
    estimates (early iterations, ADVI's step-size search) do not flatten the rest."""
    v = values[np.isfinite(values)]
    if v.size < 2:
        return None
    hi, med = float(v.max()), float(np.median(v))
    lo = max(float(np.percentile(v, 5)), hi - 10.0 * max(hi - med, 1.0))
    pad = 0.05 * max(hi - lo, 1e-6)
    return lo - pad, hi + pad


def _log_ticks(axis, lim) -> None:
    """Plain numbers (0.5, 20, 1000) on a log axis; minor labels only on a short range."""
    from matplotlib import ticker  # noqa: PLC0415

    def minor(v, _):
        mantissa = v / 10 ** math.floor(math.log10(v)) if v > 0 else 0
        return f"{v:g}" if round(mantissa, 6) in (2.0, 5.0) else ""

    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    lo, hi = lim
    short = lo > 0 and hi / lo < 30
    axis.set_minor_formatter(ticker.FuncFormatter(minor) if short else ticker.NullFormatter())


ORACLE_LABEL = "cost in gradient evaluations (1 = one 256-draw gradient)"
TIME_LABEL = "wall time without JAX compilation (s)"


def plot_elbo(fits, *, labels: Sequence[str] | None = None, x: str = "both", gap: bool = False,
              reference_elbo: float | None = None, path=None, title: str | None = None):
    """ELBO against cost and/or wall time, log x axes.  Cost is in oracle calls, the TrustVI
    paper's unit: 1 = one stochastic gradient over 256 draws (an HVP over 85 draws costs 2;
    docs/algorithms.md#oracle-calls).  Wall time excludes the time spent compiling JAX
    functions (one-off per model and batch size; the panel's title says how much it was).

    Args:
        fits: a Fit, a list of fits, or a dict ``{label: fit}``.
        x: 'oracle', 'time' or 'both' (two panels).
        gap: plot ``best − ELBO`` on a log y axis (best = ``reference_elbo`` or the highest ELBO
            seen), which separates methods near convergence; default: the ELBO itself, with the
            y range cut at the 5th percentile so the first iterations do not flatten the rest.
        reference_elbo: a known optimum (e.g. from a long run) for ``gap``.
        path: write a PNG here.
    """
    fit_list, names = _as_list(fits), _labels(fits, labels)
    panels = {"both": ["oracle", "time"], "oracle": ["oracle"], "time": ["time"]}[x]
    fig, axes = _figure(1, len(panels))
    series, compiled = [], []
    for f in fit_list:
        t = f.trace
        elbo = t.column("elbo")
        ok = np.isfinite(elbo)
        wall = t.column("wall_time")
        compile_s = t.column("compile_time")   # JAX compilation so far (NaN: not recorded)
        compile_s = np.where(np.isfinite(compile_s), compile_s, 0.0)
        compiled.append(float(compile_s[-1]) if compile_s.size else 0.0)
        series.append((t.column("oracle_scaled")[ok], (wall - compile_s)[ok], elbo[ok]))
    all_elbo = np.concatenate([s[2] for s in series]) if series else np.array([])
    best = reference_elbo if reference_elbo is not None else (
        float(all_elbo.max()) if all_elbo.size else 0.0)
    for ax, panel in zip(axes[0], panels):
        for (oracle, wall, elbo), name in zip(series, names):
            xs = oracle if panel == "oracle" else wall
            # A log axis has no 0: the initial iterate (0 oracle calls, t ~ 0 s) is left out.
            keep = xs > 0 if panel == "oracle" else xs > 1e-3
            ys = (best - elbo + 1e-3) if gap else elbo
            ax.plot(xs[keep], ys[keep], marker="o", markersize=2.5, linewidth=1.2, label=name)
        ax.set_xscale("log")
        ax.set_xlabel(ORACLE_LABEL if panel == "oracle" else TIME_LABEL)
        if panel == "time" and any(c > 0 for c in compiled):
            ax.set_title("JAX compilation excluded: " + ", ".join(
                f"{name} {c:.1f} s" for name, c in zip(names, compiled) if c > 0),
                fontsize="small")
        if gap:
            ax.set_yscale("log")
            ax.set_ylabel("ELBO gap to best (nats)")
        else:
            ax.set_ylabel("ELBO")
            ylim = _robust_ylim(all_elbo)
            if ylim is not None:
                ax.set_ylim(*ylim)
        _log_ticks(ax.xaxis, ax.get_xlim())
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return _finish(fig, path)


# ------------------------------------------------------------------------------ marginals
def _draws_of(obj) -> dict[str, np.ndarray]:
    """Draws by variable name (n, *shape) from a Fit, a DataTree/InferenceData, or a dict."""
    if obj is None:
        return {}
    if hasattr(obj, "draws") and isinstance(obj.draws, Mapping):
        return {k: np.asarray(v) for k, v in obj.draws.items()}
    try:
        post = obj["posterior"]
    except (KeyError, TypeError, IndexError):
        post = None
    if post is not None and hasattr(post, "data_vars"):
        out = {}
        for k in post.data_vars:
            arr = np.asarray(post[k].values)
            out[k] = arr.reshape(arr.shape[0] * arr.shape[1], *arr.shape[2:])
        return out
    return {k: np.asarray(v) for k, v in dict(obj).items()}


def _scalar_columns(draws: Mapping[str, np.ndarray], var_names) -> list[tuple[str, str, np.ndarray]]:
    cols = []
    for name in var_names or draws:
        if name not in draws:
            raise KeyError(f"no variable {name!r}; variables: {list(draws)}")
        arr = np.asarray(draws[name], dtype=float)
        flat = arr.reshape(arr.shape[0], -1, order="F")
        for j, label in enumerate(element_labels(name, arr.shape[1:])):
            cols.append((name, label, flat[:, j]))
    return cols


def _kde_line(ax, values, **kwargs):
    """A marginal density by arviz-stats' KDE (linear, boundary-corrected at the range of the
    draws, so a ``<lower=0>`` variable's density does not leak below its smallest draw)."""
    from arviz_stats.base import array_stats  # noqa: PLC0415

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2 or np.ptp(v) == 0:
        if v.size:
            ax.axvline(v[0], **kwargs)
        return
    grid, pdf, _ = array_stats.kde(v, grid_len=256)
    ax.plot(np.asarray(grid), np.asarray(pdf), **kwargs)


def plot_marginals(fit, reference=None, *, var_names: Sequence[str] | None = None,
                   max_panels: int = 16, psis: bool = False, ncols: int = 4, path=None,
                   labels: tuple[str, str] = ("VI", "reference")):
    """Marginal densities (arviz-stats' boundary-corrected KDE) of each scalar of the VI draws,
    with reference draws over them.

    Args:
        fit: a Fit (or a DataTree / dict of draws).
        reference: reference draws (a dict name -> (n, *shape), a DataTree with a posterior
            group such as ``arviz_base.from_cmdstanpy(nuts_fit)``, or another Fit).
        var_names: variables to show (default: all, up to ``max_panels`` scalars).
        psis: also draw the PSIS-reweighted VI density (dashed; the KDE of the PSIS-resampled
            draws, ``fit.diagnostics(resample=True)``).
        path: write a PNG here.
    """
    draws = _draws_of(fit)
    ref = _draws_of(reference)
    cols = _scalar_columns(draws, var_names)[:max_panels]
    if not cols:
        raise ValueError("nothing to plot: the fit has no draws")
    ncols = max(1, min(ncols, len(cols)))
    nrows = math.ceil(len(cols) / ncols)
    fig, axes = _figure(nrows, ncols, figsize=(3.2 * ncols, 2.4 * nrows))
    resampled = {}
    if psis and hasattr(fit, "diagnostics"):   # PSIS-resampled draws (stratified by weight)
        resampled = {label: values for _, label, values in _scalar_columns(
            fit.diagnostics(resample=True).resampled or {},
            list(dict.fromkeys(c[0] for c in cols)))}
    ref_cols = {label: values for _, label, values in _scalar_columns(
        ref, [n for n in dict.fromkeys(c[0] for c in cols) if n in ref])} if ref else {}
    for k, (name, label, values) in enumerate(cols):
        ax = axes[k // ncols][k % ncols]
        _kde_line(ax, values, color="C0", label=labels[0])
        if label in resampled:
            _kde_line(ax, resampled[label], color="C0", linestyle="--", label="VI, PSIS")
        if label in ref_cols:
            _kde_line(ax, ref_cols[label], color="k", linewidth=1.0, label=labels[1])
        shown = [np.asarray(v, dtype=float) for v in (values, ref_cols.get(label))
                 if v is not None]
        shown = np.concatenate([v[np.isfinite(v)] for v in shown])
        if shown.size > 1 and np.ptp(shown) > 0:   # the bulk, not a few far draws
            lo, hi = np.percentile(shown, [0.5, 99.5])
            pad = 0.05 * (hi - lo) if hi > lo else 1.0
            ax.set_xlim(lo - pad, hi + pad)
        ax.set_title(label, fontsize="small")
        ax.set_yticks([])
        ax.tick_params(labelsize="x-small")
    for k in range(len(cols), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    axes[0][0].legend(fontsize="x-small")
    return _finish(fig, path)


# ------------------------------------------------------------------------------ Pareto k-hat
def plot_khat(fits, *, labels: Sequence[str] | None = None, path=None):
    """Pareto k-hat of each fit against the verdict bands (left), and the distribution of each
    fit's normalized log importance weights (right: a long right tail is what k-hat measures).

    Args:
        fits: a Fit, a list, or a dict ``{label: fit}`` (fits or Diagnostics objects).
    """
    from stanvi.diagnostics.report import GOOD_K  # noqa: PLC0415

    items, names = _as_list(fits), _labels(fits, labels)
    diags = [f.diagnostics() if hasattr(f, "diagnostics") and callable(f.diagnostics) else f
             for f in items]
    fig, axes = _figure(1, 2, figsize=(10.0, max(3.0, 0.45 * len(diags) + 2.0)))
    ax, ax2 = axes[0]
    khats = np.array([d.khat for d in diags], dtype=float)
    tau = min(d.threshold for d in diags)
    shown = np.where(np.isfinite(khats), khats, np.where(khats > 0, 1.5, -0.5))
    top = max(1.2, float(np.nanmax(shown)) + 0.15)
    bottom = min(-0.2, float(np.nanmin(shown)) - 0.1)
    good_top = min(GOOD_K, tau)
    ax.axvspan(bottom, good_top, color=_BAND_COLORS["good"], zorder=0)
    ax.axvspan(good_top, tau, color=_BAND_COLORS["use with care"], zorder=0)
    ax.axvspan(tau, top, color=_BAND_COLORS["unreliable"], zorder=0)
    for xv, style in ((good_top, ":"), (tau, "--"), (1.0, "-")):
        ax.axvline(xv, color="0.4", linestyle=style, linewidth=0.8)
    y = np.arange(len(diags))[::-1]
    ax.scatter(shown, y, color="k", zorder=3)
    for yi, d, xv in zip(y, diags, shown):
        ax.annotate(f"{d.khat:.2f}  {d.verdict}", (xv, yi), xytext=(6, 4),
                    textcoords="offset points", fontsize="small")
    ax.set_yticks(y, names)
    ax.set_xlim(bottom, top)
    ax.set_ylim(-0.7, len(diags) - 0.3)
    ax.set_xlabel(f"Pareto k-hat (threshold {tau:.2f}: dashed; 0.5: dotted; 1: solid)")
    ax.set_title("importance-ratio tail (Yao et al. 2018)", fontsize="medium")
    for d, name in zip(diags, names):
        raw = np.asarray(d.log_ratios if d.log_ratios is not None else d.log_weights, dtype=float)
        raw = raw[np.isfinite(raw)]
        lw = raw - np.logaddexp.reduce(raw) + np.log(raw.size) if raw.size else raw
        if lw.size:
            ax2.hist(lw, bins=50, histtype="step", linewidth=1.2, label=name)
    ax2.set_yscale("log")
    ax2.set_xlabel("log (S × normalized importance ratio)   (0 = uniform)")
    ax2.set_ylabel("draws")
    ax2.legend(fontsize="small")
    return _finish(fig, path)
