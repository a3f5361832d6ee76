"""ELBO-change sample sizes for TrustVI's step assessment
(Regier, Jordan & McAuliffe 2017, §3.3.1 "Choosing the sample size": Inequalities 11 and 13,
Eq. 12 for τ1, τ2; docs/algorithms.md#sample-size and #trustvi-constants).

* Inequality 11 (sample enough to reject bad steps): with ``A = η m'``, ``B = τ2 δ²``,
  ``C = τ1 δ²`` and ``y_lo = max(−A/2, −B)``,

      N_11 = ⌈max(0, sup_{y > y_lo} R(y))⌉,   R(y) = 2σ² log((B + y)/C) / (A + y)².

  ``R'(y)`` has the sign of ``ψ(y) = (A + y) − 2(B + y) log((B + y)/C)``, which is positive
  while it rises (``B + y < C e^{−1/2}``) and then falls monotonically to −∞. So either
  ``ψ(y_lo⁺) ≤ 0`` and the supremum is the boundary limit ``R(y_lo⁺)``, or it is ``R(y*)`` at the
  unique root ``y*`` of ψ, found by doubling then bisection (:func:`ineq11_sup`), or in closed
  form via Lambert W (:func:`ineq11_sup_closed_form`).
* Inequality 13 (sample enough to accept good steps):
  ``N_13 = ⌈−2σ² log(1 − ζ1) / (ν1² ‖∇L‖² δ²)⌉``.
* The retrospective update of ``N`` (docs/algorithms.md#sample-size, default policy).
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import numpy as np

__all__ = ["Ineq11Result", "ineq11_sup", "ineq11_sup_closed_form", "n_ineq11",
           "n_ineq11_closed_form", "n_ineq13", "reference_code_update", "retrospective_update",
           "tau_constants"]

#: Returned when a sample size is unbounded / not computable ("more than any N_max").
N_INFINITE = sys.maxsize
_BISECT_RTOL = 1e-10
_MAX_DOUBLINGS = 2000
_MAX_BISECTIONS = 2000


class Ineq11Result(NamedTuple):
    """Supremum of ``R`` in Inequality 11 (docs/algorithms.md#sample-size).

    ``value``: ``sup R`` (may be ≤ 0, then ``N_11 = 0``); ``y_star``: the maximizer (``y_lo``
    for the boundary branch, where the supremum is the limit ``R(y_lo⁺)``); ``branch``:
    ``"root"`` (interior stationary point, ``ψ(y*) = 0``) or ``"boundary"``.
    """

    value: float
    y_star: float
    branch: str


def tau_constants(alpha: float = 5.0, gamma: float = 2.0, lam: float = 1e-3
                  ) -> tuple[float, float]:
    """``(τ1, τ2) = (α(1 − γ⁻²) − λ, α(γ² − γ⁻²))`` (Eq. 12 of the TrustVI paper); defaults
    give (3.749, 18.75).

    Raises ``ValueError`` unless ``γ > 1`` and ``α > λ/(1 − γ⁻²)`` (so that τ1 > 0).
    """
    if not gamma > 1:
        raise ValueError(f"gamma must exceed 1, got {gamma}")
    g2 = 1.0 / (gamma * gamma)
    tau1 = alpha * (1.0 - g2) - lam
    tau2 = alpha * (gamma * gamma - g2)
    if not tau1 > 0:
        raise ValueError(f"alpha={alpha} must exceed lam/(1 - gamma^-2) = {lam / (1 - g2)}")
    return tau1, tau2


def _abc(m_prime: float, delta: float, eta: float, tau1: float, tau2: float
         ) -> tuple[float, float, float]:
    d2 = float(delta) ** 2
    return eta * float(m_prime), tau2 * d2, tau1 * d2


def _R(y: float, A: float, B: float, C: float, k: float) -> float:
    """``R(y) = k log((B + y)/C)/(A + y)²`` with ``k = 2σ²`` (or σ²)."""
    return k * math.log((B + y) / C) / (A + y) ** 2


def _psi(y: float, A: float, B: float, C: float) -> float:
    """``ψ(y) = (A + y) − 2(B + y) log((B + y)/C)``, the sign of ``R'(y)``."""
    u = B + y
    return (A + y) - 2.0 * u * math.log(u / C) if u > 0 else A + y


def _check(sigma2: float, A: float, C: float) -> None:
    if not (np.isfinite(sigma2) and sigma2 >= 0):
        raise ValueError(f"sigma2 must be finite and >= 0, got {sigma2}")
    if not C > 0:
        raise ValueError("tau1 * delta**2 must be positive")


def ineq11_sup(sigma2: float, m_prime: float, delta: float, *, eta: float = 0.25,
               tau1: float, tau2: float, factor_two: bool = True) -> Ineq11Result:
    """Supremum of ``R`` over ``y > y_lo`` by the ψ sign analysis and bisection
    (docs/algorithms.md#sample-size).

    If ``ψ(y_lo⁺) ≤ 0`` the supremum is ``R(y_lo⁺)`` (boundary branch; for ``y_lo = −B`` this
    never happens since ``ψ(−B⁺) = A − B > 0``). Otherwise bracket the root of ψ by doubling
    the offset ``y − y_lo`` starting from ``C`` until ``ψ < 0``, then bisect to a relative
    tolerance of 1e-10 on the offset. Requires ``A = η m' > 0`` (else ``ValueError``).
    ``factor_two=False`` drops the factor 2 (the ``reference_code`` profile,
    docs/algorithms.md#reference-code).
    """
    A, B, C = _abc(m_prime, delta, eta, tau1, tau2)
    _check(sigma2, A, C)
    if not (A > 0 and np.isfinite(A)):
        raise ValueError(f"eta * m_prime must be finite and positive, got {A}")
    k = (2.0 if factor_two else 1.0) * float(sigma2)
    if -A / 2 > -B:
        y_lo = -A / 2
        if _psi(y_lo, A, B, C) <= 0:
            return Ineq11Result(_R(y_lo, A, B, C, k), y_lo, "boundary")
    else:
        y_lo = -B  # ψ(−B⁺) = A − B > 0: root branch
    lo, hi = 0.0, C  # offsets from y_lo; ψ(y_lo + lo) > 0
    for _ in range(_MAX_DOUBLINGS):
        if _psi(y_lo + hi, A, B, C) < 0:
            break
        lo, hi = hi, 2.0 * hi
    for _ in range(_MAX_BISECTIONS):
        if hi - lo <= _BISECT_RTOL * hi:
            break
        mid = 0.5 * (lo + hi)
        if _psi(y_lo + mid, A, B, C) > 0:
            lo = mid
        else:
            hi = mid
    y_star = y_lo + 0.5 * (lo + hi)
    return Ineq11Result(_R(y_star, A, B, C, k), y_star, "root")


def ineq11_sup_closed_form(sigma2: float, m_prime: float, delta: float, *, eta: float = 0.25,
                           tau1: float, tau2: float, factor_two: bool = True) -> Ineq11Result:
    """Lambert-W closed form of :func:`ineq11_sup` (docs/algorithms.md#sample-size); a test oracle.

    With ``x = (B + y)/C``, ``ψ = 0`` ⇔ ``x(2 log x − 1) = (A − B)/C``, whose root on the falling
    branch is ``x* = exp(½ + W₀((A − B)/(2C√e)))`` (exists iff the argument is ≥ −1/e). The root
    branch applies iff ``x*`` exists and ``y* = C x* − B > y_lo``; otherwise the boundary branch.
    """
    A, B, C = _abc(m_prime, delta, eta, tau1, tau2)
    _check(sigma2, A, C)
    if not (A > 0 and np.isfinite(A)):
        raise ValueError(f"eta * m_prime must be finite and positive, got {A}")
    k = (2.0 if factor_two else 1.0) * float(sigma2)
    y_lo = max(-A / 2, -B)
    arg = (A - B) / (2.0 * C * math.sqrt(math.e))
    if arg >= -1.0 / math.e:
        from scipy.special import lambertw  # noqa: PLC0415 (SciPy on first use: issue 8 part 3)

        x_star = math.exp(0.5 + float(np.real(lambertw(arg, 0))))
        y_star = C * x_star - B
        if y_star > y_lo:
            return Ineq11Result(_R(y_star, A, B, C, k), y_star, "root")
    return Ineq11Result(_R(y_lo, A, B, C, k), y_lo, "boundary")


def _ceil_count(value: float) -> int:
    """``⌈max(0, value)⌉`` as an int, saturating at :data:`N_INFINITE`."""
    if math.isnan(value):
        return N_INFINITE
    if value <= 0:
        return 0
    if value >= N_INFINITE:  # includes +inf
        return N_INFINITE
    return int(math.ceil(value))


def n_ineq11(sigma2: float, m_prime: float, delta: float, *, eta: float = 0.25, tau1: float,
             tau2: float, factor_two: bool = True) -> int:
    """``N_11 = ⌈max(0, sup R)⌉`` (Inequality 11), via :func:`ineq11_sup`.

    Returns :data:`N_INFINITE` (``sys.maxsize``) when ``η m'`` is not finite and positive (the
    caller only assesses steps with ``η m' ≥ λδ² > 0``) or when σ² is not finite, and 0 when
    ``σ² ≤ 0`` (no noise: ``R ≡ 0``).
    """
    A = eta * float(m_prime)
    if not (A > 0 and np.isfinite(A)) or not np.isfinite(sigma2):
        return N_INFINITE
    if sigma2 <= 0:
        return 0
    return _ceil_count(ineq11_sup(sigma2, m_prime, delta, eta=eta, tau1=tau1, tau2=tau2,
                                  factor_two=factor_two).value)


def n_ineq11_closed_form(sigma2: float, m_prime: float, delta: float, *, eta: float = 0.25,
                         tau1: float, tau2: float, factor_two: bool = True) -> int:
    """:func:`n_ineq11` through the Lambert-W closed form (test oracle)."""
    A = eta * float(m_prime)
    if not (A > 0 and np.isfinite(A)) or not np.isfinite(sigma2):
        return N_INFINITE
    if sigma2 <= 0:
        return 0
    return _ceil_count(ineq11_sup_closed_form(sigma2, m_prime, delta, eta=eta, tau1=tau1,
                                              tau2=tau2, factor_two=factor_two).value)


def n_ineq13(sigma2: float, grad_norm_sq: float, delta: float, *, zeta1: float = 0.7,
             nu1: float = 0.5) -> int:
    """``N_13 = ⌈−2σ² log(1 − ζ1) / (ν1² ‖∇L‖² δ²)⌉`` (Inequality 13).

    ``grad_norm_sq`` is ``‖g_k‖²`` (default) or the jackknife ``θ̂`` (option ``"unbiased"``).
    If it is ≤ 0 (or anything is non-finite) the requirement is unbounded and
    :data:`N_INFINITE` (``sys.maxsize``) is returned.
    """
    if not (np.isfinite(grad_norm_sq) and grad_norm_sq > 0 and np.isfinite(sigma2)):
        return N_INFINITE
    if not 0 < zeta1 < 1:
        raise ValueError(f"zeta1 must be in (0, 1), got {zeta1}")
    value = -2.0 * float(sigma2) * math.log1p(-zeta1) / (nu1 * nu1 * grad_norm_sq * delta * delta)
    return _ceil_count(value)


def retrospective_update(N_k: int, N_star: int | None, n_g: int, N_max: int) -> int:
    """Retrospective ELBO-change sample-size update (docs/algorithms.md#sample-size,
    ``n_change_policy="retrospective"``).

    ``N_k`` is the sample size the step was judged with, ``N_star = max(N_11, N_13)`` from
    ``σ̂_k²``, ``n_g`` the current gradient batch size:

    * ``min(2N_k, N_max)`` if ``N* > N_k``;
    * ``N_k // 2`` if ``N_k > n_g`` and ``N_k > 2N*``;
    * ``N_k`` otherwise.

    ``N_k ≤ 0`` (λ-test rejection: no draws) or ``N_star is None`` (assessment aborted, no σ̂)
    return ``N_k`` unchanged; in those cases the caller keeps its pre-set ``N``.
    """
    N_k = int(N_k)
    if N_k <= 0 or N_star is None:
        return N_k
    if N_star > N_k:
        return min(2 * N_k, int(N_max))
    if N_k > n_g and N_k > 2 * N_star:
        return max(N_k // 2, 1)
    return N_k


def reference_code_update(N_k: int, N_star: int | None, N_min: int, N_max: int) -> int:
    """The authors' code's ELBO-change sample-size update (docs/algorithms.md#sample-size
    and #reference-code; the ``reference_code`` profile): double while below ``N_max`` if
    ``N* > N_k``; halve, with floor ``N_min`` (128 in [R]), whenever ``N* < N_k/2``; otherwise
    keep.  ``N_k ≤ 0`` or ``N_star is None`` keep ``N_k``, as in :func:`retrospective_update`."""
    N_k = int(N_k)
    if N_k <= 0 or N_star is None:
        return N_k
    if N_star > N_k:
        return min(2 * N_k, int(N_max))
    if 2 * N_star < N_k:
        return max(N_k // 2, int(N_min))
    return N_k
