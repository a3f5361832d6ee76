"""Numerical building blocks of TrustVI (Regier, Jordan & McAuliffe 2017, §3.2–§3.3;
docs/algorithms.md#trustvi; the ``#anchors`` below are sections of docs/algorithms.md).

* :mod:`~stanvi.optim.trust_region` — what the operator solvers share (:class:`TRResult`, the
  problem's validation), the dense solve through an operator, a small matrix model solved from
  one shared eigendecomposition (:class:`MatrixModel`, #dense-tr), scaled trust regions and the
  Newton gain a solve predicts (#trust-region-subproblem);
* :mod:`~stanvi.optim.dense_tr` — dense trust-region subproblem (Moré–Sorensen, #dense-tr);
* :mod:`~stanvi.optim.steihaug` — Steihaug–Toint truncated CG (#steihaug);
* :mod:`~stanvi.optim.gltr` — GLTR / Lanczos (#gltr), subspace Hessian reuse (#hessian-reuse) and
  the certified full-space Newton gain;
* :mod:`~stanvi.optim.cg` — truncated conjugate gradients for a Newton system (HFSGVI, #hfsgvi);
* :mod:`~stanvi.optim.step_size` — Stan ADVI's adaptive step-size sequence (#advi);
* :mod:`~stanvi.optim.sample_size` — ELBO-change sample sizes, Inequalities 11 and 13 and the
  retrospective update (#sample-size);
* :mod:`~stanvi.optim.jackknife` — gradient signal-to-noise jackknife and replication factor
  (#trustvi-gradient).

All solvers minimize ``q(s) = cᵀs + ½ sᵀBs`` s.t. ``‖s‖ ≤ δ``; TrustVI maximizes
``gᵀs + ½ sᵀHs`` and calls them with ``c = −g``, ``B = −H`` and uses ``m' = −q_value``.
"""

from stanvi.optim.cg import truncated_cg
from stanvi.optim.dense_tr import DenseTRResult, solve_dense_tr, solve_eigen_tr, tr_model_value
from stanvi.optim.gltr import certified_newton_gain, solve_gltr, solve_subspace_reuse
from stanvi.optim.jackknife import JackknifeResult, jackknife_snr, update_replication
from stanvi.optim.sample_size import (N_INFINITE, Ineq11Result, ineq11_sup,
                                      ineq11_sup_closed_form, n_ineq11, n_ineq11_closed_form,
                                      n_ineq13, retrospective_update, tau_constants)
from stanvi.optim.steihaug import solve_steihaug
from stanvi.optim.step_size import stan_step
from stanvi.optim.trust_region import (MatrixModel, TRResult, newton_gain, scaled_problem,
                                       solve_dense_operator)

__all__ = ["DenseTRResult", "Ineq11Result", "JackknifeResult", "MatrixModel", "N_INFINITE",
           "TRResult",
           "certified_newton_gain", "newton_gain", "scaled_problem", "solve_dense_operator",
           "stan_step", "truncated_cg", "ineq11_sup", "ineq11_sup_closed_form", "jackknife_snr", "n_ineq11",
           "n_ineq11_closed_form", "n_ineq13", "retrospective_update", "solve_dense_tr",
           "solve_eigen_tr",
           "solve_gltr", "solve_steihaug", "solve_subspace_reuse", "tau_constants",
           "tr_model_value", "update_replication"]
