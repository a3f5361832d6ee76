"""MLMCVI's options and profiles (docs/mlmcvi.md#defaults; the method:
:mod:`stanvi.methods.mlmcvi`).  Tags: [P] the paper (Fujisawa & Sato), [S #a] stanvi's
resolution of a point the paper leaves open, at docs/mlmcvi.md#<a>, [EXT] an extension not in
the paper, off by default (docs/mlmcvi.md#extensions), [C] stanvi's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from stanvi.families.coordinates import SCALE_PARAMS
from stanvi.estimators.mlmc_schedule import SCHEDULERS, Scheduler

ESTIMATORS = ("mlmc", "mc", "rqmc")


@dataclass(frozen=True)
class Options:
    """mlmcvi options.  Tags: [P] the paper (Fujisawa & Sato), [S #a] stanvi's resolution of a
    point the paper leaves open, at docs/mlmcvi.md#<a>, [EXT] an extension not in the paper, off
    by default (docs/mlmcvi.md#extensions), [C] stanvi's choice."""

    estimator: str = "mlmc"             # 'mlmc' | 'mc' | 'rqmc' (the paper's baselines) [P §5]
    n0: int = 100                       # N_0, level-0 draws [P Table 3, §5.2; S #defaults]
    baseline_draws: int | None = None   # draws per iteration for 'mc'/'rqmc'; None: equal cost
                                        # with MLMC over the same run [S #baselines: N = 41]
    scheduler: str = "step"             # 'step' | 'time' | 'exp' | 'constant' [P App. D]
    beta: float = 0.5                   # decay β [P §5.2 Fashion-MNIST; S #defaults]
    drop_every: int = 100               # step decay's drop period r [P §5.2; S #defaults]
    lr0: float = 0.01                   # α_0 [P §5.2 grid top; S #defaults]; tune it [P App. G]
    optimizer: str = "sgd"              # 'sgd' [P: Lemma 1 needs SGD] | 'adam' [EXT E1; adam
                                        # settings b1 0.9, b2 0.999, eps 1e-8: S #resolutions] |
                                        # 'natural': SGD preconditioned by q's Fisher diagonal [C]
    warm_start: str = "none"            # 'laplace': L-BFGS mode and Hessian scales (as TrustVI) [C]
    max_iters: int = 1000               # T, the last level: T + 1 updates [S #resolutions]
    scale_param: str = "log"            # 'log' (s = e^ω) | 'direct' (the paper's v)
                                        # [S #scale-collapse: 'log' can collapse a scale under MLMC]
    restart_every: int | None = None    # [EXT R1] fresh N_0-draw level 0 every this many levels
    truncate: float | None = None       # Algorithm 2's box [−B, B]^D [P App. C; S #truncation]
    init: str = "zero"                  # 'zero': m = 0 [S #resolutions] | 'random' (Stan's)
    log_scale0: float = 0.0             # initial log scale ω_0 (s_0 = 1) [S #resolutions]
    tol: float | None = None            # stop when ‖Δλ‖_∞ < tol (1 + ‖λ‖_∞) [S #resolutions]
    tol_elbo: float | None = None       # stop when the ELBO (fixed draws) rose by less than this
                                        # at two evaluations in a row [C]
    patience: int = 10                  # … for this many consecutive iterations [S #resolutions]
    elbo_every: int = 50                # ELBO every this many iterations [S #defaults]
    elbo_draws: int = 2000              # fixed draws per ELBO estimate [P §5; S #defaults]
    snr_every: int | None = None        # replicate variance/SNR period [P §5.2; S #diagnostics]
    snr_reps: int = 100                 # replicates R for it [S #diagnostics: the paper used 1000]
    max_failed: float = 0.1             # share of a level's draws that may fail [S #failed-draws]
    warn_cost: bool = True              # warn when MLMC costs more than MC with N = N_0 [S #cost]
    fullrank_diagonal: str = "log"      # the full-rank family's storage (fit builds it) [C]

    def __post_init__(self) -> None:
        for name, choices in (("estimator", ESTIMATORS), ("scheduler", SCHEDULERS),
                              ("optimizer", ("sgd", "adam", "natural")),
                              ("scale_param", SCALE_PARAMS), ("warm_start", ("none", "laplace")),
                              ("init", ("zero", "random")),
                              ("fullrank_diagonal", ("log", "stan"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"mlmcvi option {name}={getattr(self, name)!r} is not one of "
                                 f"{list(choices)}")
        for name in ("n0", "max_iters", "drop_every", "elbo_every", "elbo_draws", "snr_reps",
                     "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"mlmcvi option {name} must be >= 1, got {getattr(self, name)}")
        for name in ("baseline_draws", "restart_every", "snr_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"mlmcvi option {name} must be >= 1 or None, got {value}")
        if not self.lr0 > 0:
            raise ValueError(f"mlmcvi option lr0 must be > 0, got {self.lr0}")
        if self.truncate is not None and not self.truncate > 0:
            raise ValueError(f"mlmcvi option truncate must be > 0 or None, got {self.truncate}")
        Scheduler(self.scheduler, self.beta, self.drop_every)   # checks beta

    @property
    def schedule(self) -> Scheduler:
        return Scheduler(self.scheduler, self.beta, self.drop_every)


PROFILES: dict[str, dict] = {
    # what a user picking the method by name needs (issue T3-2 item 3): the paper's SGD with
    # α₀ = 0.01 halved every 100 levels ended 424 nats short on a logistic regression (N = 2,000,
    # D = 9) — its steps are in the model's units and die out by level 500.  Here: the Laplace
    # warm start (as TrustVI), steps preconditioned by q's Fisher diagonal (natural-gradient
    # SGD: a step of α is ~α q-sds, whatever the model's units), α₀ = 0.5 halved every 200
    # levels, and, once it has dropped, a stop when the ELBO on its fixed 2,000 draws rose by
    # less than 0.05 nat at two evaluations 25 levels apart
    "default": {"warm_start": "laplace", "optimizer": "natural", "lr0": 0.5,
                "drop_every": 200, "tol_elbo": 0.05, "elbo_every": 25},
    "paper": {},                                           # §5.2: SGD + step decay 0.5 / 100
    "hlr": {"lr0": 0.027026, "beta": 0.862527, "drop_every": 221},       # Table 3, HLR
    "blr": {"lr0": 0.007438, "beta": 0.226316, "drop_every": 458},       # Table 3, BLR
    "restart": {"restart_every": 100},                     # [EXT R1], docs/mlmcvi.md#extensions
}
DEFAULT_PROFILE = "default"
