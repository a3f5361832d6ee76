"""Whether to trust a fit (docs/diagnostics.md): Pareto k̂ and the verdict drawn from it
(:mod:`stanvi.diagnostics.report`), PSIS transcribed into NumPy (:mod:`stanvi.diagnostics.psis`)
and the draws they are computed on (:mod:`stanvi.diagnostics.draws`)."""
