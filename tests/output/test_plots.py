"""Plots (issue P1-3): ELBO traces vs oracle calls and wall time on log axes, marginals against
reference draws, Pareto k-hat; each returns a Figure and writes a non-empty PNG."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.figure import Figure

import stanvi
from stanvi.output import plots

A = np.array([[1.0, 0.6], [0.6, 2.0]])
M = np.array([0.5, -1.0])


@pytest.fixture(scope="module")
def fits():
    prec, m = jnp.asarray(np.linalg.inv(A)), jnp.asarray(M)
    target = stanvi.JaxTarget(lambda z: -0.5 * (z - m) @ prec @ (z - m), 2, names=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "TrustVI": stanvi.fit(target, method="trustvi", seed=0, progress=False),
            "ADVI": stanvi.fit(target, method="advi", seed=0, progress=False, max_iterations=1000),
        }


def _png_ok(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_elbo(fits, tmp_path):
    fig = plots.plot_elbo(fits, path=tmp_path / "elbo.png", title="2-D Gaussian")
    assert isinstance(fig, Figure)
    _png_ok(tmp_path / "elbo.png")
    ax_oracle, ax_time = fig.axes[:2]
    assert ax_oracle.get_xscale() == "log" and ax_time.get_xscale() == "log"
    # axis labels in user terms: cost in 256-draw gradient units; time without JAX compilation
    assert ax_oracle.get_xlabel() == plots.ORACLE_LABEL and "256-draw gradient" in plots.ORACLE_LABEL
    assert ax_time.get_xlabel() == plots.TIME_LABEL and "JAX compilation" in plots.TIME_LABEL
    assert len(ax_oracle.get_lines()) == 2  # one line per fit
    labels = [t.get_text() for t in ax_oracle.get_legend().get_texts()]
    assert labels == ["TrustVI", "ADVI"]
    # the plotted points are the trace's ELBO estimates
    x, y = ax_oracle.get_lines()[0].get_data()
    t = fits["TrustVI"].trace
    ok = np.isfinite(t.column("elbo")) & (t.column("oracle_scaled") > 0)
    np.testing.assert_allclose(y, t.column("elbo")[ok])

    # the time panel's x is wall time less JAX compilation, which its title reports
    xt, _ = ax_time.get_lines()[0].get_data()
    run = t.column("wall_time") - np.nan_to_num(t.column("compile_time"))
    np.testing.assert_allclose(xt, run[ok & (run > 1e-3)])
    if np.nanmax(t.column("compile_time")) > 0:
        assert ax_time.get_title().startswith("JAX compilation excluded: TrustVI")

    fig = plots.plot_elbo(list(fits.values()), x="oracle", gap=True, path=tmp_path / "gap.png")
    assert fig.axes[0].get_yscale() == "log"
    _png_ok(tmp_path / "gap.png")


def test_plot_marginals_against_reference(fits, tmp_path):
    rng = np.random.default_rng(0)
    ref = rng.multivariate_normal(M, A, size=4000)
    fig = plots.plot_marginals(fits["TrustVI"], {"a": ref[:, 0], "b": ref[:, 1]}, psis=True,
                               path=tmp_path / "marginals.png")
    _png_ok(tmp_path / "marginals.png")
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["a", "b"]
    assert len(fig.axes[0].get_lines()) == 3  # VI, VI reweighted, reference
    # also from a DataTree (e.g. arviz_base.from_cmdstanpy of NUTS draws) and vector variables
    tree = fits["ADVI"].to_arviz()
    fig = plots.plot_marginals(tree, fits["TrustVI"], path=tmp_path / "m2.png")
    _png_ok(tmp_path / "m2.png")


def test_plot_khat(fits, tmp_path):
    fig = plots.plot_khat(fits, path=tmp_path / "khat.png")
    _png_ok(tmp_path / "khat.png")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["TrustVI", "ADVI"]
    offsets = ax.collections[0].get_offsets()
    khats = [f.diagnostics().khat for f in fits.values()]
    np.testing.assert_allclose(np.asarray(offsets)[:, 0],
                               [k if np.isfinite(k) else -0.5 for k in khats])


def test_marginal_density_respects_a_lower_bound(tmp_path):
    """arviz-stats' boundary-corrected KDE: a <lower=0> variable's density starts at its
    smallest draw and is not pulled down to zero there (scipy's KDE leaked below 0 and halved
    the density at the bound)."""
    rng = np.random.default_rng(1)
    draws = {"sigma": rng.exponential(1.0, size=4000)}
    fig = plots.plot_marginals(draws, path=tmp_path / "bound.png")
    _png_ok(tmp_path / "bound.png")
    x, y = fig.axes[0].get_lines()[0].get_data()
    assert x.min() >= draws["sigma"].min() - 1e-12
    near_zero = y[x < 0.2].mean()
    assert near_zero == pytest.approx(np.exp(-0.1), rel=0.15)   # the Exp(1) density there
