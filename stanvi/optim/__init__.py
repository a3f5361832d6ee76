"""Numerical building blocks of TrustVI (spec trustvi_hfsgvi_advi.md §4.3–§4.6).

* :mod:`~stanvi.optim.dense_tr` — dense trust-region subproblem (Moré–Sorensen, §4.5.3) and the
  shared :class:`TRResult`;
* :mod:`~stanvi.optim.steihaug` — Steihaug–Toint truncated CG (§4.5.1);
* :mod:`~stanvi.optim.gltr` — GLTR / Lanczos (§4.5.2) and subspace Hessian reuse (§4.4);
* :mod:`~stanvi.optim.sample_size` — ELBO-change sample sizes, Inequalities 11 and 13 and the
  retrospective update (§4.6);
* :mod:`~stanvi.optim.jackknife` — gradient signal-to-noise jackknife and replication factor
  (§4.3).

All solvers minimize ``q(s) = cᵀs + ½ sᵀBs`` s.t. ``‖s‖ ≤ δ``; TrustVI maximizes
``gᵀs + ½ sᵀHs`` and calls them with ``c = −g``, ``B = −H`` and uses ``m' = −q_value``.
"""

from stanvi.optim.dense_tr import DenseTRResult, TRResult, solve_dense_tr, tr_model_value
from stanvi.optim.gltr import solve_gltr, solve_subspace_reuse
from stanvi.optim.jackknife import JackknifeResult, jackknife_snr, update_replication
from stanvi.optim.sample_size import (N_INFINITE, Ineq11Result, ineq11_sup,
                                      ineq11_sup_closed_form, n_ineq11, n_ineq11_closed_form,
                                      n_ineq13, retrospective_update, tau_constants)
from stanvi.optim.steihaug import solve_steihaug

__all__ = ["DenseTRResult", "Ineq11Result", "JackknifeResult", "N_INFINITE", "TRResult",
           "ineq11_sup", "ineq11_sup_closed_form", "jackknife_snr", "n_ineq11",
           "n_ineq11_closed_form", "n_ineq13", "retrospective_update", "solve_dense_tr",
           "solve_gltr", "solve_steihaug", "solve_subspace_reuse", "tau_constants",
           "tr_model_value", "update_replication"]
