"""TrustVI's options (:class:`Options`, whose defaults are the ``paper`` profile) and its named
option sets (``PROFILES``, ``DEFAULT_PROFILE``); what each profile is for is in the docstring of
:mod:`stanvi.methods.trustvi`, which runs them, and each constant's allowed range and source in
docs/algorithms.md#trustvi-constants (the tags [P], [R], [C], [S]: #provenance).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """TrustVI options; defaults are the ``paper`` profile (sources: [P] paper, [R] the authors'
    code, [C] stanvi's choice; see docs/algorithms.md#trustvi-constants and #provenance)."""

    eta: float = 0.25                 # model-fitness threshold, (0, 1/2] [P]; 0.25 [R]
    gamma: float = 2.0                # radius expansion factor [R]
    lam: float = 1e-3                 # radius constraint λ of the λ-test [C] (#trustvi-constants)
    alpha: float = 5.0                # radius/objective trade-off in φ_k [R]
    nu1: float = 0.5                  # sampling-rate trade-off, (0, 1−η) [C]
    zeta1: float = 0.7                # probability of accepting a good step, (2/3, 1) [C]
    delta0: float = 0.1               # initial radius [R]
    delta_max: float = 1e4            # maximum radius [R]
    delta_min: float = 1e-4           # stop when δ < δ_min [R]
    max_iters: int = 500              # [R]
    n_grad: int = 256                 # base gradient batch n_g⁰ [P]
    n_hess: int = 85                  # base Hessian batch n_h⁰ [P]
    n_change0: int = 128              # initial ELBO-change pairs N₀ [P]
    n_change_max: int = 4096          # N_max = 32 × 128 [R]
    r_max: int = 32                   # replication factor cap [R]
    solver: str = "gltr"              # 'gltr' | 'steihaug' | 'dense' (#trust-region-subproblem)
    tol_interior: float = 1e-2        # GLTR/CG relative tolerance, interior [R: trlib tol_rel_i]
    tol_boundary: float = 1e-1        # GLTR tolerance on the boundary [R: trlib tol_rel_b]
    hessian_max_reuse: int = 2        # consecutive reuses after rejections [P, R]
    reuse_mode: str = "subspace"      # 'subspace' (1 HVP) | 'sample' (same draws, new solve) | 'none'
    ineq13_gradient: str = "plugin"   # ‖∇L‖² in Ineq. 13: 'plugin' ‖g‖² [R] | 'unbiased' θ̂ [C]
    tol_model: float | None = None    # stop when the Newton model predicts < tol_model nats [C]
    tol_model_iters: int = 3          # ... of the Newton step, this many times in a row [C]
    stall_stop: bool = False          # stop on the stall signal [C]
    stall_iters: int = 5              # K_stall [C]
    norm_test: float | None = None    # also grow r when MC noise > ν²‖∇L‖² (Byrd et al. 2012) [C]
    init: str = "zero"                # initial mean when none is given: 'zero' [R] | 'random'
    log_scale0: float = -1.0          # initial ω (σ = e^{-1}) [R]
    fullrank_diagonal: str = "log"    # full-rank family parameterization (#fullrank) [C]
    max_gradient_drops_factor: int = 10  # a gradient fails after 10·n dropped draws (as Stan) [S]
    # the reference_code profile's deviations (#reference-code); the defaults are the paper's rules
    acceptance: str = "paper"         # 'paper': ℓ' ≥ ηm' ≥ λδ² | 'ratio': ℓ'/m' ≥ η, no λ-test [R]
    radius_rule: str = "paper"        # 'paper': γ on acceptance, 1/γ otherwise | 'reference' [R]
    warmup: bool = False              # accept nothing until δ has grown and shrunk once [R]
    ineq11_factor_two: bool = True    # [R] omits the factor 2 of Inequality 11
    n_change_policy: str = "retrospective"  # 'retrospective' (#sample-size) | 'reference' [R]
    # stanvi's additions for ill-conditioned posteriors (docs/methods.md, "Why `default` changed")
    metric: str = "euclidean"         # trust-region norm: 'euclidean' [P] | 'fisher' (q's Fisher diagonal) [C]
    certify_tol: float | None = None  # before stopping on tol_model, re-solve to this residual [C]
    gain_estimate: str = "plugin"     # Newton gain for tol_model: 'plugin' ½ḡᵀB⁻¹ḡ | 'split' ½g_aᵀB⁻¹g_b [C]
    warm_start: str = "none"          # 'none' | 'laplace': L-BFGS mode + Hessian scales [C]
    refine_draws: int | None = None   # after the stop, refine on this many fixed draws [C]
    refine_hess: int = 256            # ... Hessian-vector products on the first this many [C]
    refine_tol: float = 1e-3          # ... until the Newton decrement is below this (nats) [C]
    refine_max_iters: int = 100       # ... at most this many Newton iterations per stage [C]
    # ... first radius: the objective is deterministic, so the full Newton step is tried first
    # (a rejection costs one fixed-draw ELBO difference and divides the radius by 4); on a
    # raw-unit regression the optimum lay ~150 q-sds along a ridge that a radius doubling from
    # 0.5 took ten iterations to reach (60,662 → 15,606 draws to within 1 nat) [C]
    refine_delta0: float = 100.0
    handover_batch: int | None = None  # hand over to the refinement once n_g reaches this [C]
    # fixed-sample TrustVI, certified on fresh draws (#trustvi-fixed, issue T3-1)
    sample: str = "fresh"             # 'fresh': new draws each iteration [P] | 'fixed' [C]
    fixed_n0: int = 64                # ... the first fixed sample's draws [C]
    fixed_n_max: int = 8192           # ... the largest sample before giving up certifying [C]
    fixed_hessian: str = "stein"      # ... model Hessian: 'stein' (gradients only) | 'hvp' [C]
    fixed_n_hess: int = 32            # ... draws of the Hessian-vector products [C]
    fixed_stage_iters: int = 50       # ... iterations on one sample before certifying anyway [C]
    second_start_iters: int = 30      # exploratory run from the other start (0: none) [C]
    # L-BFGS paths from random initializations tried after the first certified optimum (the
    # first from Stan's random init, the others from uniform(−2, 2) points of the fit's key),
    # until one's Laplace q beats it; each costs an L-BFGS path, D HVPs and 64 log densities.
    # hmm_drive_0 (two modes 60 nats apart): half the random inits reach the higher one, so 1
    # path certified the lower mode on 4 of 8 seeds, 4 paths on none; on posteriordb 4 paths
    # cost 1,284 evaluations per fit against 691 and 0.098 s against 0.076 s (median; as
    # multi-path Pathfinder's 4 paths) [C]
    second_paths: int = 4
    second_start_draws: int = 16      # ... its fixed sample [C]
    second_start_trigger: float = 1.0  # ... when the optimum is this many nats above its start [C]
    fixed_krylov_tol: float = 1e-2    # ... GLTR relative residual of a step [C]
    certify_krylov_tol: float = 1e-3  # ... GLTR relative residual of the certifying solve [C]
    certify_gap: float = 0.1          # ... certified within this many nats [C]
    certify_rms: float = 0.02         # ... and ~this many q-sds per parameter (Fisher metric) [C]

    def __post_init__(self) -> None:
        # A misspelt choice must not silently select another behaviour (e.g. reuse_mode
        # 'subpsace' used to run the 'sample' mode, init 'zeros' the random initialization).
        for name, choices in (("solver", ("gltr", "steihaug", "dense")),
                              ("reuse_mode", ("subspace", "sample", "none")),
                              ("ineq13_gradient", ("plugin", "unbiased")),
                              ("init", ("zero", "random")),
                              ("fullrank_diagonal", ("log", "stan")),
                              ("acceptance", ("paper", "ratio")),
                              ("radius_rule", ("paper", "reference")),
                              ("n_change_policy", ("retrospective", "reference")),
                              ("metric", ("euclidean", "fisher")),
                              ("gain_estimate", ("plugin", "split")),
                              ("warm_start", ("none", "laplace")),
                              ("sample", ("fresh", "fixed")),
                              ("fixed_hessian", ("stein", "hvp"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"trustvi option {name}={getattr(self, name)!r} is not one of "
                                 f"{list(choices)}")
        if not (isinstance(self.second_paths, int) and self.second_paths >= 0):
            raise ValueError(f"trustvi option second_paths must be an integer >= 0, got "
                             f"{self.second_paths!r}")


# stanvi's tuning of the paper's stochastic iterations (issues P1-2, P2-1): the ``stochastic``
# profile, and the warm start, metric and certified gain the ``default`` profile shares
_STOCHASTIC = {"n_grad": 16, "n_hess": 8, "n_change0": 16, "r_max": 64, "n_change_max": 1024,
               "delta0": 1.0, "tol_model_iters": 3, "tol_interior": 0.1, "tol_boundary": 0.3,
               "max_iters": 1000, "tol_model": 0.25, "norm_test": 1.0, "metric": "fisher",
               "certify_tol": 1e-6, "gain_estimate": "split", "refine_draws": 4096,
               "warm_start": "laplace", "delta_min": 1e-2, "handover_batch": 512}

PROFILES: dict[str, dict] = {
    # the paper's algorithm and constants; the stop on the certified Newton gain is stanvi's
    # addition (the paper stops only when δ < 1e-4, tens of seconds after reaching the optimum)
    "paper": {"tol_model": 0.1, "certify_tol": 1e-6, "gain_estimate": "split"},
    # the trust-region iteration on a fixed, growing sample, certified on fresh draws
    # (#trustvi-fixed, issue T3-1), after the same Laplace warm start in the same Fisher metric
    "default": {**_STOCHASTIC, "sample": "fixed"},
    # fresh draws every iteration, handed over to the certifying refinement (#default-profile): the
    # ``default`` of issues P2-1 to T3-1
    "stochastic": dict(_STOCHASTIC),
    # faithful to the authors' code [R] (docs/algorithms.md#reference-code), for ablations
    "reference_code": {"acceptance": "ratio", "radius_rule": "reference", "warmup": True,
                       "ineq11_factor_two": False, "lam": 2.0, "nu1": 1.0, "zeta1": 2.0 / 3.0,
                       "n_change_policy": "reference"},
}
DEFAULT_PROFILE = "default"
