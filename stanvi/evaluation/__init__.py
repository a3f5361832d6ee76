"""How runs are judged, shared by the batch runs, the benchmarks and the tests
(docs/architecture.md#layers): the TrustVI paper's comparison protocol and a run's summary
(:mod:`~stanvi.evaluation.protocol`), accuracy against reference draws
(:mod:`~stanvi.evaluation.accuracy`), the stored mean-field optima of the example models
(:mod:`~stanvi.evaluation.optima`) and where those models are (:mod:`~stanvi.evaluation.models`).
"""
