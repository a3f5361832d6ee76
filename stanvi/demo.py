"""``python -m stanvi.demo``: the README's end-to-end demo on a fresh machine.

Compiles the non-centered eight-schools model (cached after the first run), loads its data, and
evaluates the log density, gradient and an exact Hessian-vector product over a batch of draws,
then the same through the JAX bridge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parent.parent / "stan_models"


def main() -> None:
    import jax  # noqa: PLC0415

    import stanvi  # noqa: PLC0415

    stan_file = MODELS / "eight_schools" / "eight_schools_noncentered.stan"
    data_file = MODELS / "eight_schools" / "eight_schools.data.json"
    target = stanvi.load(stan_file, data_file)
    print(f"loaded {target!r}")
    print("unconstrained parameters:", ", ".join(target.unconstrained_names))
    z = np.random.default_rng(1).normal(size=(256, target.dim))
    res = target.log_density_gradient(z)
    print(f"256 draws: mean log density {res.log_density.mean():.3f}, "
          f"mean |gradient| {np.linalg.norm(res.gradient, axis=1).mean():.3f}")
    grads = jax.jit(jax.vmap(jax.grad(target.jax_log_density)))(z)
    print("JAX bridge gradient matches the library:", bool(np.allclose(grads, res.gradient)))
    print("oracle calls (draws):", target.counter.snapshot())


if __name__ == "__main__":
    main()
