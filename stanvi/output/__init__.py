"""A fit's output (docs/architecture.md#layers, the output layer): the ArviZ DataTree
(:mod:`stanvi.output.arviz_io`, its attributes :mod:`stanvi.output.arviz_attrs`), the Stan CSV
and :func:`stanvi.output.writers.save` (:mod:`stanvi.output.writers`), the summary table
(:mod:`stanvi.output.summary`) and the plots (:mod:`stanvi.output.plots`)."""
