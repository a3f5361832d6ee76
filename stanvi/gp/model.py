"""The basis-function GP model (docs/gp.md#model): data, a basis, a likelihood and the
hyperparameters θ; exact (O(n m² + m³)) reference quantities for small problems.

``BasisGP`` is what ``stanvi.fit(model, method="qsgp" | "exact" | "svi")`` takes.  It also
exposes the generic JAX log-density protocol (:meth:`BasisGP.log_joint`,
:meth:`BasisGP.as_target`), so every core stanvi method can run on it when m is small
(docs/gp.md#methods); that costs O(n m) per evaluation.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.gp.basis import InducingPoints, RandomFourierFeatures, RVM
from stanvi.gp.families import VParams, dense_columns, dense_matrix
from stanvi.gp.kernels import SquaredExponential
from stanvi.gp.likelihoods import BernoulliLogit, Gaussian, Laplace

_LOG_2PI = math.log(2.0 * math.pi)


@partial(jax.jit, static_argnums=0)
def _features(basis, arrays: dict, X: jax.Array, cols: jax.Array, theta: dict) -> jax.Array:
    """Φ[X, cols] as one compiled program per (basis, shapes): called outside a trace, the
    basis's feature map (an RFF column regeneration is a vmapped threefry draw) would otherwise
    run, and compile, one primitive at a time."""
    return basis.features(arrays, X, cols, theta)


class BasisGP:
    """f(x) = Σ_i w_i φ_i(x), w ~ N(0, S⁻¹), y_l ~ g(· | f(x_l)) (docs/gp.md#model).

    Args:
        X: inputs (n, d); y: targets (n,) (regression) or labels in {−1, +1} / {0, 1}.
        basis: :class:`RandomFourierFeatures`, :class:`InducingPoints` or :class:`RVM`.
        likelihood: :class:`Gaussian` (default), :class:`Laplace`, :class:`BernoulliLogit`.
        theta: initial hyperparameters overriding the basis's and likelihood's (log-space dict,
            e.g. ``{"log_ell": ..., "log_sf2": ..., "log_noise": ...}``).
    """

    __stanvi_gp__ = True

    def __init__(self, X, y, *, basis, likelihood=None, theta: dict | None = None,
                 name: str = "basis_gp") -> None:
        X = np.asarray(X, dtype=float)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[0] < 1:
            raise ValueError(f"X must have shape (n, d) with n >= 1, got {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X has non-finite values")
        self.likelihood = likelihood if likelihood is not None else Gaussian()
        y = self.likelihood.check_y(np.asarray(y).reshape(-1))
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} values")
        self.X = X
        self.y = y
        self.basis = basis
        self.name = name
        self.n, self.d = X.shape
        self.m = (basis.num_features if isinstance(basis, RandomFourierFeatures)
                  else basis.count(X))
        self.arrays = basis.arrays(X)
        theta0 = {**basis.theta0(self.d), **self.likelihood.theta0()}
        for key, value in (theta or {}).items():
            if key not in theta0:
                raise KeyError(f"unknown hyperparameter {key!r}; this model has {sorted(theta0)}")
            theta0[key] = jnp.asarray(value, dtype=float).reshape(jnp.shape(theta0[key]))
        self.theta = theta0

    def __repr__(self) -> str:
        return (f"BasisGP(n={self.n}, d={self.d}, m={self.m}, basis={self.basis.name}, "
                f"likelihood={self.likelihood.name})")

    def with_theta(self, theta: dict) -> "BasisGP":
        """The same model with hyperparameters ``theta`` (log space)."""
        new = object.__new__(BasisGP)
        new.__dict__.update(self.__dict__)
        new.__dict__.pop("_exact_elbo_jit", None)
        new.theta = {k: jnp.asarray(v) for k, v in theta.items()}
        return new

    # ---------------------------------------------------------------- dense blocks (small m)
    def features(self, X=None, cols=None, theta: dict | None = None) -> jax.Array:
        """Φ at inputs X (default: the training inputs) and columns ``cols`` (default: all)."""
        X = jnp.asarray(self.X if X is None else np.asarray(X, dtype=float).reshape(-1, self.d))
        cols = jnp.arange(self.m) if cols is None else jnp.asarray(cols)
        return _features(self.basis, self.arrays, X, cols, self.theta if theta is None else theta)

    def precision_matrix(self, theta: dict | None = None, log_s=None) -> jax.Array:
        """S (m, m); ``log_s`` (RVM) the per-basis log precisions."""
        theta = self.theta if theta is None else theta
        cols = jnp.arange(self.m)
        if self.basis.is_diagonal:
            if self.basis.per_basis_precision and log_s is None:
                log_s = jnp.full((self.m,), math.log(self.basis.s0))
            return jnp.diag(self.basis.diag_precision(cols, theta, log_s))
        return self.basis.prior_precision(self.arrays, cols, cols, theta)

    def log_joint(self, w: jax.Array, theta: dict | None = None) -> jax.Array:
        """log p(y | w) + log p(w) (O(n m); RVM at s_i = s0)."""
        theta = self.theta if theta is None else theta
        f = self.features(theta=theta) @ w
        S = self.precision_matrix(theta)
        lp = -0.5 * (w @ S @ w) + 0.5 * jnp.linalg.slogdet(S)[1] - 0.5 * self.m * _LOG_2PI
        return lp + jnp.sum(self.likelihood.expected_log_site(jnp.asarray(self.y), f,
                                                              jnp.zeros_like(f) + 1e-300, theta))

    def as_target(self):
        """A :class:`stanvi.JaxTarget` over the m weights (for the core methods, small m)."""
        from stanvi.targets.jax_target import JaxTarget  # noqa: PLC0415

        return JaxTarget(self.log_joint, self.m, names=[f"w.{i + 1}" for i in range(self.m)],
                         name=self.name)

    # ---------------------------------------------------------------- exact references
    def exact_elbo(self, params: VParams, theta: dict | None = None, log_s=None) -> float:
        """ELBO = Σ_l F_l(a_l, s_l) − KL(q‖p), a_l = φ_l μ, s_l = ‖Cᵀφ_lᵀ‖ (docs/gp.md#exact-elbo):
        exact for every likelihood (its F in closed form or by quadrature); O(n m² + m³)."""
        theta = self.theta if theta is None else theta
        fn = self.__dict__.get("_exact_elbo_jit")
        if fn is None:   # one compiled program per model, not one per primitive
            fn = self.__dict__["_exact_elbo_jit"] = jax.jit(self.exact_elbo_jax)
        return float(fn(*(jnp.asarray(p) for p in params), theta,
                        None if log_s is None else jnp.asarray(log_s)))

    def exact_elbo_jax(self, mu, ld, L, theta: dict, log_s=None) -> jax.Array:
        """:meth:`exact_elbo` as a differentiable JAX function of (μ, log c_rr, L, θ, log s)."""
        Phi = self.features(theta=theta)
        C = _dense_C(ld, L)
        a = Phi @ mu
        s = jnp.sqrt(jnp.sum((Phi @ C) ** 2, axis=1) + 1e-300)
        lik = jnp.sum(self.likelihood.expected_log_site(jnp.asarray(self.y), a, s, theta))
        S = self.precision_matrix(theta, log_s)
        kl = 0.5 * (mu @ S @ mu + jnp.sum(C * (S @ C)) - 2.0 * jnp.sum(ld) - self.m
                    - jnp.linalg.slogdet(S)[1])
        return lik - kl

    def kl(self, params: VParams, theta: dict | None = None, log_s=None) -> float:
        """KL(q‖p) = ½[μᵀSμ + tr(SΣ) − log|Σ| − m − log|S|] (docs/gp.md#exact-elbo)."""
        theta = self.theta if theta is None else theta
        S = self.precision_matrix(theta, log_s)
        C = jnp.asarray(dense_matrix(params))
        mu = jnp.asarray(params.mu)
        return float(0.5 * (mu @ S @ mu + jnp.sum(C * (S @ C)) - 2.0 * jnp.sum(params.ld)
                            - self.m - jnp.linalg.slogdet(S)[1]))

    def exact_elbo_eq2(self, params: VParams, theta: dict | None = None) -> float:
        """Gaussian likelihood: ELBO = −½(L_μ + L_Σ + L_const) (Eq. 2, docs/gp.md#exact-elbo)."""
        if not isinstance(self.likelihood, Gaussian):
            raise ValueError("the eq.-2 form is for the Gaussian likelihood")
        theta = self.theta if theta is None else theta
        v = float(np.exp(np.asarray(theta["log_noise"])))
        Phi = self.features(theta=theta)
        S = self.precision_matrix(theta)
        C = jnp.asarray(dense_matrix(params))
        mu = jnp.asarray(params.mu)
        y = jnp.asarray(self.y)
        Pm = Phi @ mu
        L_mu = (-2.0 * y @ Pm + Pm @ Pm) / v + mu @ S @ mu
        L_sig = jnp.sum((Phi @ C) ** 2) / v + jnp.sum(C * (S @ C)) - 2.0 * jnp.sum(params.ld)
        L_const = -jnp.linalg.slogdet(S)[1] - self.m + self.n * math.log(2 * math.pi * v) + y @ y / v
        return float(-0.5 * (L_mu + L_sig + L_const))


def _dense_C(ld, L):
    m, k = L.shape
    C = jnp.diag(jnp.exp(ld))
    if k:
        C = C.at[:, :k].set(dense_columns(jnp.arange(m), L, ld[:k], k))
    return C


# -------------------------------------------------------------------- constructors
def rff_regression(X, y, m: int = 10_000, *, lengthscale: float = 1.0, variance: float = 1.0,
                   noise: float = 0.1, ard: bool = False, likelihood: str = "gaussian",
                   seed: int = 0) -> BasisGP:
    """An RFF SE-kernel regression model (docs/gp.md#bases, the paper's Table 2); ``likelihood``
    'gaussian' or 'laplace' (then ``noise`` is the Laplace scale b)."""
    lik = {"gaussian": lambda: Gaussian(noise=noise),
           "laplace": lambda: Laplace(b=noise)}.get(likelihood)
    if lik is None:
        raise ValueError(f"likelihood must be 'gaussian' or 'laplace', got {likelihood!r}")
    kern = SquaredExponential(lengthscale=lengthscale, variance=variance, ard=ard)
    return BasisGP(X, y, basis=RandomFourierFeatures(m=m, kernel=kern, seed=seed),
                   likelihood=lik(), name="rff_regression")


def rff_classification(X, y, m: int = 10_000, *, lengthscale: float = 1.0,
                       variance: float = 1.0, ard: bool = False, nodes: int = 32,
                       seed: int = 0) -> BasisGP:
    """An RFF SE-kernel logistic classifier (the paper's MNIST setting,
    docs/gp.md#paper-settings)."""
    kern = SquaredExponential(lengthscale=lengthscale, variance=variance, ard=ard)
    return BasisGP(X, y, basis=RandomFourierFeatures(m=m, kernel=kern, seed=seed),
                   likelihood=BernoulliLogit(nodes=nodes), name="rff_classification")


def inducing_regression(X, y, *, Z=None, lengthscale: float = 1.0, variance: float = 1.0,
                        noise: float = 0.1, ard: bool = False) -> BasisGP:
    """Inducing points at Z (default the training inputs): the exact GP prior (docs/gp.md#bases)."""
    kern = SquaredExponential(lengthscale=lengthscale, variance=variance, ard=ard)
    return BasisGP(X, y, basis=InducingPoints(kernel=kern, Z=None if Z is None else np.asarray(Z)),
                   likelihood=Gaussian(noise=noise, learn_noise=False), name="inducing_regression")


def rvm_regression(X, y, *, lengthscale: float = 1.0, noise: float = 0.1) -> BasisGP:
    """A relevance vector machine (QSRVM, docs/gp.md#bases) with SE kernel columns at the inputs."""
    kern = SquaredExponential(lengthscale=lengthscale, variance=1.0)
    return BasisGP(X, y, basis=RVM(kernel=kern), likelihood=Gaussian(noise=noise),
                   name="rvm_regression")


def init_exact_gp_subset(model: BasisGP, n_sub: int = 1000, *, steps: int = 200,
                         lr: float = 0.05, seed: int = 0) -> BasisGP:
    """Type-II ML initialisation of θ on ``n_sub`` random training points (docs/gp.md#training, the
    paper's setting): Adam on the exact GP log marginal likelihood with the SE kernel (Gaussian
    likelihood only).  Returns the model with the new θ."""
    if not isinstance(model.likelihood, Gaussian):
        raise ValueError("init_exact_gp_subset needs a Gaussian likelihood")
    kern = model.basis.kernel
    rng = np.random.default_rng(seed)
    idx = rng.choice(model.n, size=min(n_sub, model.n), replace=False)
    X = jnp.asarray(model.X[idx])
    y = jnp.asarray(model.y[idx])
    keys = ("log_ell", "log_sf2", "log_noise")

    def nlml(th):
        K = kern.cross(X, X, th) + (jnp.exp(th["log_noise"]) + 1e-8) * jnp.eye(X.shape[0])
        Lc = jnp.linalg.cholesky(K)
        alpha = jax.scipy.linalg.cho_solve((Lc, True), y)
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(Lc))) + 0.5 * X.shape[0] * _LOG_2PI

    th = {k: model.theta[k] for k in keys}
    grad = jax.jit(jax.value_and_grad(nlml))
    m1 = jax.tree.map(jnp.zeros_like, th)
    m2 = jax.tree.map(jnp.zeros_like, th)
    for t in range(1, steps + 1):
        _, g = grad(th)
        m1 = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m1, g)
        m2 = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, m2, g)
        th = jax.tree.map(lambda x, a, b: x - lr * (a / (1 - 0.9 ** t))
                          / (jnp.sqrt(b / (1 - 0.999 ** t)) + 1e-8), th, m1, m2)
    return model.with_theta({**model.theta, **th})
