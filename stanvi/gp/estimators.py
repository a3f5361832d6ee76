"""The QSGP objective on gathered slices (docs/gp.md#objective): an unbiased estimate of −ELBO
for the Gaussian likelihood and an estimate of −(a lower bound on the ELBO) for other
log-concave likelihoods, at a cost independent of n and m.

One step draws four independent index vectors, iid uniform with replacement
(docs/gp.md#sampling): ``l~`` (n~ data rows), ``i~`` and ``j~`` (m~ basis columns each: the two
factors of every quadratic form) and ``r~`` (m~_r diagonal columns of C, from {k..m−1}).  Every
m-sized parameter vector is gathered once at ``W = unique(i~ ∪ j~ ∪ r~ ∪ {0..k−1})`` (padded
with the index m), and the objective is a function of those slices only: its gradient is
supported on W, so the update touches O(m~ + k) entries (docs/gp.md#jax-rules).

Terms (all scale factors Python floats, docs/gp.md#jax-rules; n~, m~ written nt, mt):

* Thm 1: L^_μ = −(2nm/(σ² nt mt)) y_lᵀ P_i μ_i + (n m²/(σ² nt mt²)) (P_j μ_j)ᵀ(P_i μ_i) + Ŝ(μ)
  with Ŝ(u) = (m²/mt²) u_jᵀ S_ji u_i for dense S, and the sparsity-aware form
  (m/(2mt)) [Σ_i s_i u_i² + Σ_j s_j u_j²] for diagonal S (docs/gp.md#unbiased).
* Thm 2 / chevron: every dense column r < k with the Thm 2 inner estimator (all k every step,
  docs/gp.md#families), diagonal columns by
  ((m−k)/m~_r) Σ_{r~} [c_rr² ((n/(σ² nt)) Σ_l Φ_lr² + s_rr) − 2 log c_rr].
* Prop 2 / L_const: −log|S| (closed form for RFF, (m/mt) Σ_{i~} log s_i for the RVM, a
  precomputed constant for inducing points), −m + n log 2πσ² + (n/(σ² nt)) ‖y_l‖².
* Data-Gram control variate (docs/gp.md#control-variates, Eq. 3) for L^_μ and every dense
  column, with the App. F.1 rescaled sparse gradient of its expectation term (|U| = distinct
  real indices).
* Non-Gaussian: the corrected bound of docs/gp.md#lower-bound, LB^ = (n/nt) Σ_l F_l(â_l, ŝ_l) with
  â_l = (m/mt) φ_{l,i~} μ_i~, ŝ_l = ‖x̂_l‖ for an unbiased sparse estimate x̂_l of Cᵀφ_lᵀ
  (repeated diagonal indices summed before squaring), minus the unbiased KL^.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg

from stanvi.gp.families import dense_columns
from stanvi.gp.likelihoods import Gaussian

_LOG_2PI = math.log(2.0 * math.pi)
sg = jax.lax.stop_gradient


@dataclass(frozen=True)
class Sizes:
    """Static sizes of one QSGP step (compile-time constants)."""

    n: int
    m: int
    k: int        # dense columns of C
    nt: int       # n~
    mt: int       # m~
    mr: int       # m~_r (0 when k = m)
    nbar: int     # control-variate support rows (0: no control variate)
    nys: int = 0  # Nyström control-variate support inputs (dense S only; 0: none)
    full: bool = False  # every basis once per factor: i~ = j~ = (0..m−1), r~ = (k..m−1)

    @property
    def width(self) -> int:
        """Size of the gathered index set W (m for a full pass: W = (0..m−1))."""
        return self.m if self.full else 2 * self.mt + self.mr + self.k


class Slices(NamedTuple):
    """Parameters gathered at W: μ, log c_rr, rows of the dense columns, RVM log s."""

    mu: jax.Array
    ld: jax.Array
    L: jax.Array
    logs: jax.Array


class Batch(NamedTuple):
    """The data and indices of one step (no parameters)."""

    Xl: jax.Array       # (nt, d)
    yl: jax.Array       # (nt,)
    W: jax.Array        # (width,) sorted, padded with m
    cols: object        # the basis's column data at W (RFF frequencies, or inducing inputs)
    pi: jax.Array       # positions of i~ in W
    pj: jax.Array
    pr: jax.Array       # positions of r~
    pk: jax.Array       # positions of 0..k-1
    in_u: jax.Array     # (width,) 1 where W's entry is in U = unique(i~ ∪ j~), else 0
    n_u: jax.Array      # |U|, the number of distinct real indices in i~ ∪ j~ (not padded)
    Phi0: jax.Array     # (nbar, width) Φ0[p, W] at the initial θ, padded columns zero
    a_mu: jax.Array     # (nbar,) = Φ0[p, :] μ
    A: jax.Array        # (nbar, k) = Φ0[p, :] C[:, :k]
    Psi: jax.Array = None     # (nys, width) Ψ[:, W] = R⁻¹ K(V, Z_W), padded columns zero
    a_nys: jax.Array = None   # (nys,) = Ψ μ
    A_nys: jax.Array = None   # (nys, k) = Ψ C[:, :k]


def draw_indices(key: jax.Array, sz: Sizes):
    """(l~, i~, j~, r~): iid uniform with replacement, mutually independent
    (docs/gp.md#sampling); with ``sz.full`` (m~ >= m) the basis indices are the full,
    deterministic sets i~ = j~ = (0..m−1), r~ = (k..m−1): no basis subsampling noise
    (docs/gp.md#convergence)."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    l = jax.random.randint(k1, (sz.nt,), 0, sz.n)
    if sz.full:
        every = jnp.arange(sz.m, dtype=jnp.int32)
        return l, every, every, jnp.arange(sz.k, sz.m, dtype=jnp.int32)[:sz.mr]
    i = jax.random.randint(k2, (sz.mt,), 0, sz.m)
    j = jax.random.randint(k3, (sz.mt,), 0, sz.m)
    r = jax.random.randint(k4, (sz.mr,), sz.k, sz.m) if sz.mr else jnp.zeros((0,), jnp.int32)
    return l, i, j, r


def index_sets(sz: Sizes, i, j, r):
    """W = unique(i~ ∪ j~ ∪ r~ ∪ {0..k−1}) (sorted, padded with m), the positions in W of every
    slot of i~, j~, r~ and of 0..k−1, and the 0/1 mask of W's entries in U = unique(i~ ∪ j~).
    One stable argsort does it all (O(w log w), w = 2m~ + m~_r + k)."""
    ks = jnp.arange(sz.k, dtype=jnp.int32)
    if sz.full:   # i~ = j~ = W = (0..m−1), r~ = (k..m−1): no sort, no padding
        every = jnp.arange(sz.m, dtype=jnp.int32)
        return every, every, every, every[sz.k:sz.k + sz.mr], ks, jnp.ones((sz.m,)), float(sz.m)
    allidx = jnp.concatenate([x.astype(jnp.int32) for x in (i, j, r)] + [ks])
    order = jnp.argsort(allidx, stable=True)
    srt = allidx[order]
    new = jnp.concatenate([jnp.ones((1,), bool), srt[1:] != srt[:-1]])
    rank = jnp.cumsum(new) - 1
    W = jnp.full((sz.width,), sz.m, jnp.int32).at[rank].set(srt)
    pos = jnp.zeros((sz.width,), jnp.int32).at[order].set(rank.astype(jnp.int32))
    mt, mr = sz.mt, sz.mr
    pi, pj = pos[:mt], pos[mt:2 * mt]
    pr, pk = pos[2 * mt:2 * mt + mr], pos[2 * mt + mr:]
    in_u = jnp.zeros((sz.width,)).at[pi].set(1.0).at[pj].set(1.0)
    return W, pi, pj, pr, pk, in_u, jnp.sum(in_u)


def gather(x: jax.Array, W: jax.Array, fill: float = 0.0) -> jax.Array:
    return x.at[W].get(mode="fill", fill_value=fill)


def objective(model, sz: Sizes, sl: Slices, theta: dict, b: Batch, arrays: dict,
              logdet_S_const: float | None) -> jax.Array:
    """The QSGP loss of one step: −ELBO^ (Gaussian; E[−ELBO^] = −ELBO exactly) or −ELBO_LB^
    (other log-concave likelihoods; E[ELBO_LB^] <= ELBO).  ``model`` supplies the basis and the
    likelihood (static)."""
    basis, lik = model.basis, model.likelihood
    n, m, k = float(sz.n), float(sz.m), sz.k
    nt, mt, mr = float(sz.nt), float(sz.mt), sz.mr
    Phi = basis.features_at(b.cols, b.Xl, theta)            # (nt, width)
    Pi = Phi[:, b.pi]
    Pj = Phi[:, b.pj]
    mu_i = sl.mu[b.pi]
    mu_j = sl.mu[b.pj]

    if basis.is_diagonal:
        s_W = basis.precision_diag(arrays, b.W, theta, sl.logs if sl.logs.size else None)
        s_i, s_j = s_W[b.pi], s_W[b.pj]

        def s_quad(ui, uj):
            return (m / (2.0 * mt)) * (jnp.sum(s_i[:, None] * ui * ui)
                                       + jnp.sum(s_j[:, None] * uj * uj))
    else:
        S_ji = basis.prior_precision(arrays, b.W[b.pj], b.W[b.pi], theta)

        def s_quad(ui, uj):
            return (m * m / (mt * mt)) * jnp.sum(uj * (S_ji @ ui))

    if k:
        Cw = dense_columns(b.W, sl.L, sl.ld[b.pk], k)        # (width, k)
        Ci, Cj = Cw[b.pi], Cw[b.pj]
        ld_dense = sl.ld[b.pk]
    if mr:
        ld_r = sl.ld[b.pr]
        c2_r = jnp.exp(2.0 * ld_r)
        s_r = basis.precision_diag(arrays, b.W[b.pr], theta,
                                   sl.logs[b.pr] if sl.logs.size else None)
    nys_cv = 0.0
    if sz.nys:   # Nyström control variate of the dense S term (App. F.2 (i)): ΨᵀΨ ≈ K(Z, Z)
        nys_cv = gram_cv(b.Psi, b.a_nys, b.A_nys, b, sl.mu, Cw if k else None,
                         m * m / (mt * mt), 1.0, m)
    # −log|S|
    if basis.per_basis_precision:
        logdet_S = (m / mt) * jnp.sum(sl.logs[b.pi])                 # Prop 2
    elif basis.is_diagonal:
        logdet_S = basis.logdet_precision(theta)
    else:
        logdet_S = 0.0 if logdet_S_const is None else logdet_S_const

    if isinstance(lik, Gaussian):
        v = lik.noise_var(theta)
        cA = 2.0 * n * m / (nt * mt)
        cB = n * m * m / (nt * mt * mt)
        Pmi = Pi @ mu_i
        L_mu = (-cA * (b.yl @ Pmi) + cB * (Pj @ mu_j) @ Pmi) / v + s_quad(mu_i[:, None],
                                                                          mu_j[:, None])
        L_sig = 0.0
        if k:
            L_sig = L_sig + cB * jnp.sum((Pi @ Ci) * (Pj @ Cj)) / v + s_quad(Ci, Cj) \
                - 2.0 * jnp.sum(ld_dense)
        if mr:
            col_sq = (n / nt) * jnp.sum(Phi[:, b.pr] ** 2, axis=0)
            L_sig = L_sig + ((m - k) / mr) * jnp.sum(c2_r * (col_sq / v + s_r) - 2.0 * ld_r)
        L_const = -logdet_S - m + n * (_LOG_2PI + jnp.log(v)) + (n / nt) * (b.yl @ b.yl) / v
        cv = 0.0
        if sz.nbar:   # data-Gram control variate (Eq. 3): (n/n_bar) Φ0_pᵀΦ0_p ≈ ΦᵀΦ
            nbar = float(sz.nbar)
            cv = gram_cv(b.Phi0, b.a_mu, b.A, b, sl.mu, Cw if k else None,
                         n * m * m / (nbar * mt * mt), n / nbar, m) / v
        return 0.5 * (L_mu + L_sig + L_const + cv + nys_cv)

    # ---- corrected lower bound for log-concave likelihoods (docs/gp.md#lower-bound)
    scale = m / mt
    a_hat = scale * (Pi @ mu_i)
    x2 = jnp.zeros_like(a_hat)
    if k:
        x2 = x2 + jnp.sum((scale * (Pi @ Ci)) ** 2, axis=1)
    if k < sz.m:
        c_ii = jnp.exp(sl.ld[b.pi]) * (b.W[b.pi] >= k)
        seg = jax.ops.segment_sum((Pi * c_ii[None, :]).T, b.pi, num_segments=sz.width)
        x2 = x2 + scale * scale * jnp.sum(seg * seg, axis=0)
    s_hat = jnp.sqrt(x2 + 1e-24)
    lb = (n / nt) * jnp.sum(lik.expected_log_site(b.yl, a_hat, s_hat, theta))
    kl2 = s_quad(mu_i[:, None], mu_j[:, None]) - m - logdet_S
    if k:
        kl2 = kl2 + s_quad(Ci, Cj) - 2.0 * jnp.sum(ld_dense)
    if mr:
        kl2 = kl2 + ((m - k) / mr) * jnp.sum(c2_r * s_r - 2.0 * ld_r)
    return -lb + 0.5 * (kl2 + nys_cv)


def gram_cv(P: jax.Array, a: jax.Array, A: jax.Array, b: Batch, mu_W: jax.Array,
            Cw: jax.Array | None, c_pair: float, c_exp: float, m: float) -> jax.Array:
    """A mean-zero control variate for the quadratic forms uᵀ(PᵀP)u, u = μ and every dense
    column of C, with P = P[:, W] a fixed low-rank factor gathered at W
    (docs/gp.md#control-variates):
    −c_pair (P_j u_j)ᵀ(P_i u_i) + c_exp ‖P u‖², where ``a`` = P μ and ``A`` = P C[:, :k] are
    kept up to date incrementally (Prop 3), so E[first term] = second term whenever
    c_pair = c_exp (m/m~)².  The expectation term's gradient is the dense one on
    U = unique(i~ ∪ j~) rescaled by m/|U| (App. F.1; |U| counts distinct real indices)."""
    Pi, Pj = P[:, b.pi], P[:, b.pj]
    PU = P * b.in_u[None, :]
    resc = m / b.n_u

    def q_tilde(a0, uU):
        # value ‖a0‖² exactly; gradient (m/|U|)·(dense gradient on U) (App. F.1)
        aa = a0 + PU @ (uU - sg(uU))
        q = jnp.sum(aa * aa)
        return resc * q + sg((1.0 - resc) * q)

    mu_i, mu_j = mu_W[b.pi], mu_W[b.pj]
    cv = -c_pair * (Pj @ mu_j) @ (Pi @ mu_i) + c_exp * q_tilde(a, mu_W)
    if Cw is not None:
        cv = cv - c_pair * jnp.sum((Pj @ Cw[b.pj]) * (Pi @ Cw[b.pi])) + c_exp * q_tilde(A, Cw)
    return cv


def make_batch(sz: Sizes, X, y, Xp, i_l, i, j, r, basis, arrays, theta0, a_mu, A,
               nys=None) -> Batch:
    """Gather the step's data and index sets; Φ0[p, W] at the frozen initial θ (App. F.3);
    with ``nys = (V, R, a_nys, A_nys)`` (R the lower Cholesky factor of K(V, V)) also the
    Nyström factor Ψ[:, W] = R⁻¹ K(V, Z_W) (App. F.2 (i))."""
    W, pi, pj, pr, pk, in_u, n_u = index_sets(sz, i, j, r)
    cols = basis.columns(arrays, W)
    real = (W < sz.m)[None, :]
    if sz.nbar:
        Phi0 = basis.features_at(cols, Xp, theta0) * real
    else:
        Phi0 = jnp.zeros((0, sz.width))
    extra = ()
    if sz.nys:
        V, R, a_nys, A_nys = nys
        Psi = jax.scipy.linalg.solve_triangular(R, basis.features_at(cols, V, theta0) * real,
                                                lower=True)
        extra = (Psi, a_nys, A_nys)
    return Batch(X[i_l], y[i_l], W, cols, pi, pj, pr, pk, in_u, n_u, Phi0, a_mu, A, *extra)

