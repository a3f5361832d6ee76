"""``python -m stanvi.demo``: the README's end-to-end demo on a fresh machine.

Compiles the non-centered eight-schools model (cached after the first run), checks the JAX bridge
against the library on a batch of draws, fits it with TrustVI and prints the summary, the
stopping reason and the oracle counts.
"""

from __future__ import annotations


import numpy as np

from stanvi.evaluation.models import MODELS_DIR

MODELS = MODELS_DIR


def main() -> None:
    import jax  # noqa: PLC0415

    from stanvi.fit import fit as stanvi_fit  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    stan_file = MODELS / "eight_schools" / "eight_schools_noncentered.stan"
    data_file = MODELS / "eight_schools" / "eight_schools.data.json"
    target = StanTarget(stan_file, data_file)
    print(f"loaded {target!r}")
    z = np.random.default_rng(1).normal(size=(256, target.dim))
    res = target.log_density_gradient(z)
    grads = jax.jit(jax.vmap(jax.grad(target.jax_log_density)))(z)
    print("JAX bridge gradient matches the library on 256 draws:",
          bool(np.allclose(grads, res.gradient)))

    fit = stanvi_fit(target, method="trustvi", seed=1)
    print(f"\n{fit}")
    print(f"stopped: {fit.status} ({fit.message})")
    elbo, se = fit.elbo()
    print(f"ELBO {elbo:.3f} ± {se:.3f}; oracle calls {fit.oracle['oracle_scaled']:.1f} "
          f"(paper units), draw-level evaluations {fit.oracle['gradient_draws']} gradients, "
          f"{fit.oracle['hvp_draws']} HVPs, {fit.oracle['log_density_draws']} log densities")
    with np.printoptions(precision=2, suppress=True):
        print(fit.summary().to_string(float_format=lambda x: f"{x:8.2f}"))


if __name__ == "__main__":
    main()
