"""The run context a method receives besides its options: initial point, budget, progress and
the ELBO estimator built once per (family, target)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stanvi.estimators.elbo import ElboEstimator
from stanvi.methods.progress import IterationProgress


@dataclass
class RunContext:
    """Attributes:
        init_mu: initial mean in unconstrained space (D,), or None for the method's own rule
            (then ``random_init_mu`` gives Stan's uniform(−2, 2) initialization).
        random_init_mu: Stan-style random initial point (uniform(−2, 2), finite density), (D,).
        max_oracle_calls: budget in scaled oracle units (None: unlimited).
        estimator: the compiled ELBO estimator.
        progress: progress display.
    """

    init_mu: np.ndarray | None
    random_init_mu: np.ndarray
    max_oracle_calls: float | None
    estimator: ElboEstimator
    progress: IterationProgress

    def over_budget(self, oracle_scaled: float) -> bool:
        return self.max_oracle_calls is not None and oracle_scaled >= self.max_oracle_calls
