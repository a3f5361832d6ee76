"""A Gaussian-mixture variational family in the unconstrained space
(docs/discrete.md#mixture-estimator; Liu et al. 2019 for the gradient of its weights):

    q_λ(θ) = Σ_{c=1}^C w_c N(θ; m_c, L_c L_cᵀ),    w = softmax(α).

λ = (α (C,), then per component its Gaussian parameters): ``covariance_type="diag"`` stores
(m_c, ω_c) with L_c = diag(exp ω_c) (2D per component, as :class:`~stanvi.families.MeanField`);
``"full"`` stores (m_c, vech L_c) row by row with a log diagonal (D + D(D+1)/2, as
:class:`~stanvi.families.FullRank` with ``diagonal="log"``).

Sampling from D standard normals, exactly (:meth:`GaussianMixture.sample`): the first base
coordinate picks the component and is then reused.  With ``u = Φ(ε₀)`` uniform, the component is
the c with ``W_{c−1} ≤ u < W_c`` (W the cumulative weights), and given c, ``u' = (u − W_{c−1})/w_c``
is again uniform on (0, 1) and independent of c, so ``ε₀' = Φ⁻¹(u')`` is a standard normal
independent of the choice: ``θ = m_c + L_c (ε₀', ε₁, …, ε_{D−1})`` is a draw from q.  Every draw
path of stanvi (output draws, Pareto k̂'s draws, ELBO estimates) therefore works unchanged with
base draws of shape (n, D).  (Floating point: u' has resolution about 1e-16/w_c, so for a
component of weight 1e-8 the first coordinate's tails are cut near 5.6 sd; for weights above
1e-3, beyond 7 sd.)  This map is piecewise in α, so autodiff through it does not give the
gradient for the weights: that gradient is the Rao-Blackwellized estimator of
:mod:`stanvi.estimators.mixture_rb`.

The entropy of a mixture has no closed form; the family has no ``entropy`` method, and its ELBO
is ``E_q[log p − log q]`` with ``log q`` the log-sum-exp over all components.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from stanvi.families.gaussian import LOG_2PI, tril_grid
from stanvi.lazy_jax import jax, jnp

# "auto" budget: every component is evaluated up to this many (docs/discrete.md#mixture-limits)
EXACT_MAX_COMPONENTS = 4
AUTO_BUDGET = 4   # beyond EXACT_MAX_COMPONENTS: a Prop. 2 budget of this many components


@dataclass(frozen=True)
class GaussianMixture:
    """A mixture of ``n_components`` Gaussians (module docstring).

    Attributes:
        dim: D, the unconstrained dimension.
        n_components: C ≥ 1.
        covariance_type: 'diag' (default) or 'full' per component (sklearn's name).
        samples_per_component: S, draws per evaluated component per gradient; None: the method's
            own draw count (ADVI's ``grad_samples``).
        component_budget: components evaluated per gradient step: None = every component
            (exact, "stratified", C·S draws); an int M < C = the Rao-Blackwellized estimator
            with budget M (M·S draws); 'auto' (default) = exact for C ≤ 4, else M = 4.
        budget_rule: how many of the M are summed exactly: 'prop2' (paper Prop. 2, default),
            'mass' (until the remainder mass is ≤ ``mass_tol``) or 'fixed' (``rb_k``).
        rb_k: the summed count for ``budget_rule='fixed'`` (0 ≤ rb_k < M).
        mass_tol: the remainder-mass target of ``budget_rule='mass'``.
        init_spread: component means start at μ₀ ± init_spread·u_j (u_j fixed unit-variance
            directions, component pairs mirrored), so components begin apart
            (docs/discrete.md#mixture-limits: mixture VI needs an initialization that breaks
            the symmetry).
    """

    dim: int
    n_components: int = 2
    covariance_type: str = "diag"
    samples_per_component: int | None = None
    component_budget: int | str | None = "auto"
    budget_rule: str = "prop2"
    rb_k: int = 1
    mass_tol: float = 0.05
    init_spread: float = 2.0
    name: str = "mixture"
    #: not one Gaussian: no Newton step of the means from Stein's lemma (docs/diagnostics.md#means)
    gaussian: ClassVar[bool] = False

    # the family protocol (stanvi.families.protocol): the reparameterization gradient does not
    # reach the weights (the component choice is discrete), so the family names its own
    # estimator, the Rao-Blackwellized one of stanvi.estimators.mixture_rb
    gradient_estimator: ClassVar[str | None] = "mixture_rb"

    def __post_init__(self) -> None:
        if not (isinstance(self.n_components, (int, np.integer)) and self.n_components >= 1):
            raise ValueError(f"n_components must be a positive integer, got {self.n_components!r}")
        if self.covariance_type not in ("diag", "full"):
            raise ValueError(f"covariance must be 'diag' or 'full', got {self.covariance_type!r}")
        if self.samples_per_component is not None and not (
                isinstance(self.samples_per_component, (int, np.integer))
                and self.samples_per_component >= 1):
            raise ValueError(f"samples_per_component must be a positive integer or None, got "
                             f"{self.samples_per_component!r}")
        b = self.component_budget
        if not (b is None or b == "auto" or (isinstance(b, (int, np.integer))
                                             and not isinstance(b, bool) and b >= 1)):
            raise ValueError(f"component_budget must be None, 'auto' or a positive integer, "
                             f"got {b!r}")
        if self.budget_rule not in ("prop2", "mass", "fixed"):
            raise ValueError(f"budget_rule must be 'prop2', 'mass' or 'fixed', "
                             f"got {self.budget_rule!r}")
        M = self.budget
        if self.budget_rule == "fixed" and M < self.n_components and not 0 <= self.rb_k < M:
            raise ValueError(f"budget_rule='fixed' needs 0 ≤ rb_k < component_budget = {M}, "
                             f"got rb_k={self.rb_k}")
        if not (math.isfinite(self.init_spread) and self.init_spread >= 0):
            raise ValueError(f"init_spread must be a finite number ≥ 0, got {self.init_spread!r}")

    def peak_bytes(self, n_draws: int) -> int:
        """About the most memory one evaluation of log q at ``n_draws`` draws takes: the (n, C, D)
        arrays of every draw's standardized distance to every component (three alive at once),
        plus the components' factors.  A fit checks it against the memory available before it
        starts (``n_components=100000`` used to fail after two minutes with a 51 GB
        out-of-memory error deep in XLA; issue T3-2 item 12)."""
        per_component = self.dim * self.dim if self.covariance_type == "full" else self.dim
        return 8 * (3 * int(n_draws) * self.n_components * self.dim
                    + 2 * self.n_components * per_component)

    # ------------------------------------------------------------------ family protocol
    @property
    def base_dim(self) -> int:
        """The width of a base draw: D (the first coordinate also picks the component)."""
        return self.dim

    def draws_per_gradient(self, n: int) -> int:
        """Log-density gradients one ELBO gradient evaluates: M components × S draws, S =
        ``samples_per_component`` or the method's ``n``."""
        return self.budget * (self.samples_per_component or int(n))

    def elbo_pieces(self, log_density: Callable) -> Callable:
        """(params, eps (n, D)) ↦ (log p(z_j) − log q(z_j) per draw, 0): the entropy has no
        closed form, so log q enters per draw (its mean is an unbiased ELBO estimate)."""
        def pieces(params, eps):
            z = self.sample(params, eps)
            return jax.vmap(log_density)(z) - self.log_q(params, z), 0.0
        return pieces

    def log_g_offset(self, params) -> float:
        """D/2 log 2π: Stan's ``log_g__`` is log q without the N(0, I) constant (there is no
        single ε per draw to take −½‖ε‖² of)."""
        return 0.5 * self.dim * LOG_2PI

    def family_options(self) -> dict[str, Any]:
        """Every setting but ``dim`` and ``name`` (n_components, covariance_type, ...), so a
        saved fit rebuilds the same mixture."""
        return {k: v for k, v in asdict(self).items() if k not in ("dim", "name")}

    # ------------------------------------------------------------------ layout
    @property
    def budget(self) -> int:
        """Components evaluated per gradient (M; C when exact)."""
        C, b = self.n_components, self.component_budget
        if b is None:
            return C
        if b == "auto":
            return C if C <= EXACT_MAX_COMPONENTS else AUTO_BUDGET
        return min(int(b), C)

    @property
    def exact(self) -> bool:
        """Every component evaluated at every step (no Rao-Blackwellization needed)."""
        return self.budget >= self.n_components

    @property
    def component_params(self) -> int:
        d = self.dim
        return 2 * d if self.covariance_type == "diag" else d + d * (d + 1) // 2

    @property
    def n_params(self) -> int:
        return self.n_components * (1 + self.component_params)

    def split(self, params: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(α (C,), per-component parameters (C, P_c))."""
        C = self.n_components
        return params[:C], params[C:].reshape(C, self.component_params)

    def log_weights(self, params: jax.Array) -> jax.Array:
        return jax.nn.log_softmax(self.split(params)[0])

    def weights(self, params) -> np.ndarray:
        """w = softmax(α), in NumPy."""
        alpha = np.asarray(params, dtype=float)[: self.n_components]
        e = np.exp(alpha - alpha.max())
        return e / e.sum()

    def _factor(self, theta: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(m, L or its diagonal, log|det L|) of one component's parameters ``theta``."""
        d = self.dim
        m = theta[:d]
        if self.covariance_type == "diag":
            return m, jnp.exp(theta[d:]), jnp.sum(theta[d:])
        i, j, lower = tril_grid(d)
        vech = theta[d:]
        raw = jnp.where(lower, vech[jnp.where(lower, i * (i + 1) // 2 + j, 0)], 0.0)
        L = jnp.where(i == j, jnp.exp(raw), raw)
        dd = jnp.arange(d)
        return m, L, jnp.sum(vech[dd * (dd + 3) // 2])

    def _affine(self, theta: jax.Array, eps: jax.Array) -> jax.Array:
        m, L, _ = self._factor(theta)
        return m + (eps * L if self.covariance_type == "diag" else eps @ L.T)

    def initial_params(self, mu0: np.ndarray, log_scale0: float = 0.0) -> np.ndarray:
        """α = 0 (equal weights); component c's mean μ₀ ± init_spread·u_{c//2} (the sign
        alternating, u_j fixed unit-variance directions from NumPy's generator with seed 0, so
        the start depends on μ₀ only); scales exp(log_scale0)."""
        C, d = self.n_components, self.dim
        mu0 = np.asarray(mu0, dtype=float)
        dirs = np.random.default_rng(0).standard_normal(((C + 1) // 2, d))
        comps = []
        for c in range(C):
            shift = 0.0 if C == 1 else (1.0 if c % 2 == 0 else -1.0) * dirs[c // 2]
            m = mu0 + self.init_spread * shift
            if self.covariance_type == "diag":
                comps.append(np.concatenate([m, np.full(d, float(log_scale0))]))
            else:
                rows, cols = np.tril_indices(d)
                comps.append(np.concatenate([m, np.where(rows == cols, float(log_scale0), 0.0)]))
        return np.concatenate([np.zeros(C), *comps])

    # ------------------------------------------------------------------ sampling, density
    def component_sample(self, params: jax.Array, idx: jax.Array, eps: jax.Array) -> jax.Array:
        """θ = m_c + L_c ε for component indices ``idx`` (...,) and base draws ``eps`` (..., D)."""
        _, comps = self.split(params)
        theta = comps[idx]
        return jax.vmap(self._affine)(theta.reshape(-1, theta.shape[-1]),
                                      eps.reshape(-1, self.dim)).reshape(eps.shape)

    def choose(self, params: jax.Array, eps: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(component (n,), the reused first coordinate ε₀' (n,)) from base draws (n, D)."""
        w = jax.nn.softmax(self.split(params)[0])
        cum = jnp.cumsum(w)
        u = jax.scipy.special.ndtr(eps[:, 0])
        c = jnp.clip(jnp.searchsorted(cum, u, side="right"), 0, self.n_components - 1)
        lo = jnp.where(c > 0, cum[jnp.maximum(c - 1, 0)], 0.0)
        tiny = jnp.finfo(eps.dtype).tiny
        u2 = jnp.clip((u - lo) / w[c], tiny, 1.0 - jnp.finfo(eps.dtype).epsneg)
        return c, jax.scipy.special.ndtri(u2)

    def sample(self, params: jax.Array, eps: jax.Array) -> jax.Array:
        """Draws from q for each row of ``eps`` (n, D) (module docstring: exact, by reusing the
        first coordinate for the component choice)."""
        eps = jnp.asarray(eps)
        c, e0 = self.choose(params, eps)
        return self.component_sample(params, c, eps.at[:, 0].set(e0))

    def component_log_q(self, params: jax.Array, z: jax.Array) -> jax.Array:
        """log N(z; m_c, Σ_c) for each row of z (n, D) and component: (n, C)."""
        _, comps = self.split(params)

        def one(theta):
            m, L, log_det = self._factor(theta)
            if self.covariance_type == "diag":
                e = (z - m) / L
            else:
                e = jax.scipy.linalg.solve_triangular(L, (z - m).T, lower=True).T
            return -0.5 * jnp.sum(e * e, axis=-1) - log_det - 0.5 * self.dim * LOG_2PI

        return jax.vmap(one, out_axes=1)(comps)

    def log_q(self, params: jax.Array, z: jax.Array) -> jax.Array:
        """log q(z) = logsumexp_c (log w_c + log N(z; m_c, Σ_c)) for each row of z (n, D)."""
        return jax.nn.logsumexp(self.log_weights(params)[None, :]
                                + self.component_log_q(params, z), axis=1)

    # ------------------------------------------------------------------ moments (NumPy)
    def _np_components(self, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(w (C,), means (C, D), covariances (C, D, D)) in NumPy."""
        params = np.asarray(params, dtype=float)
        C, d = self.n_components, self.dim
        comps = params[C:].reshape(C, self.component_params)
        means = comps[:, :d]
        covs = np.empty((C, d, d))
        for c in range(C):
            if self.covariance_type == "diag":
                covs[c] = np.diag(np.exp(2.0 * comps[c, d:]))
            else:
                rows, cols = np.tril_indices(d)
                L = np.zeros((d, d))
                L[rows, cols] = comps[c, d:]
                L[np.arange(d), np.arange(d)] = np.exp(np.diag(L))
                covs[c] = L @ L.T
        return self.weights(params), means, covs

    def mean(self, params) -> np.ndarray:
        """Σ_c w_c m_c."""
        w, means, _ = self._np_components(params)
        return w @ means

    def covariance(self, params) -> np.ndarray:
        """Σ_c w_c (Σ_c + m_c m_cᵀ) − m mᵀ."""
        w, means, covs = self._np_components(params)
        m = w @ means
        second = np.einsum("c,cij->ij", w, covs + means[:, :, None] * means[:, None, :])
        return second - np.outer(m, m)

    def marginal_sd(self, params) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.sqrt(np.maximum(np.diag(self.covariance(params)), 0.0))

    def components(self, params) -> list[dict]:
        """Each component's weight, mean and marginal sd (NumPy), heaviest first."""
        w, means, covs = self._np_components(params)
        order = np.argsort(-w, kind="stable")
        return [{"weight": float(w[c]), "mean": means[c],
                 "sd": np.sqrt(np.diag(covs[c]))} for c in order]
