"""The draws from q on which a fit's Pareto k̂ is computed: how many (S_diag,
:func:`diagnostic_draw_count`), and their log p and log q from one batched log-density call
(:func:`diagnostic_log_densities`), with the Gaussian families' draws and log q taken in NumPy
(:mod:`stanvi.families.host_math`).  Why k̂ needs its own, larger set of draws, and the verdict drawn from it:
:mod:`stanvi.diagnostics.report` (docs/algorithms.md#pareto-k).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DIAG_MIN_DRAWS = 4000    # diagnostic draws: S_diag = max(draws, min(MAX, max(MIN, WORK // D)))
DIAG_MAX_DRAWS = 32000
DIAG_WORK = 64000
#: The diagnostic draws are made and evaluated in blocks of at most this many numbers (rows × D).
CHUNK_ENTRIES = 1 << 24
#: The draws z are kept (for the verdict's mean shift) up to this many numbers, S · D (512 MB;
#: above it, e.g. 4,000 draws at D > 16,000, the verdict has no mean shift)
KEEP_Z_ENTRIES = 1 << 26


#: The seed of the diagnostic draws, the same for every fit (common random numbers, issue T3-5
#: item 1; docs/diagnostics.md#common-draws): k̂ is then a function of q alone, so two fits
#: whose q agree get the same verdict, whatever their seeds, and two methods' verdicts on one
#: model differ by their q's, not by their draws.  A fit's own seed chose them until
#: 2026-12-06, and the seeds of 79 of 434 TrustVI model-family pairs of T3-4 whose ELBOs agree
#: within 0.1 nat got different verdicts.
DIAGNOSTIC_SEED = 0


def _generator(seed: int | None, batch: int) -> np.random.Generator:
    """The diagnostic draws' generator: ``seed`` (None: :data:`DIAGNOSTIC_SEED`) and the
    batch of added draws (:mod:`stanvi.diagnostics.verdict`: batches 1, 2, …)."""
    base = DIAGNOSTIC_SEED if seed is None else int(seed)
    return np.random.default_rng([base, 0x5D1A6] + ([int(batch)] if batch else []))


def diagnostic_draw_count(dim: int, n_output: int = 0) -> int:
    """S_diag = max(n_output, min(32000, max(4000, 64000 // D))): the number of draws from q on
    which k̂ is computed (:mod:`stanvi.diagnostics.report`: the GPD tail fit uses 3√S of them)."""
    by_dim = DIAG_WORK // max(int(dim), 1)
    return max(int(n_output), min(DIAG_MAX_DRAWS, max(DIAG_MIN_DRAWS, by_dim)))


#: Work bound of the added diagnostic draws (:func:`diagnostic_draw_cap`): D · S ≤ this
DIAG_ADDED_WORK = 2_048_000
#: The most diagnostic draws a fit's verdict may use: 8 S_diag (three doublings)
DIAG_GROWTH = 8
DIAG_CAP_DRAWS = 256_000


def diagnostic_draw_cap(dim: int, first: int) -> int:
    """The most draws the verdict adds up to while k̂'s band is undecided
    (:mod:`stanvi.diagnostics.verdict`): 8 S_diag, at most 2,048,000 / D and 256,000 (about
    the work of 2,000 gradients of a D = 1,000 model), never fewer than the first S_diag."""
    by_dim = DIAG_ADDED_WORK // max(int(dim), 1)
    return max(int(first), min(DIAG_GROWTH * int(first), by_dim, DIAG_CAP_DRAWS))


class DiagnosticSample(NamedTuple):
    """Draws z (S, D) from q with their log p (−inf where the model failed), log q and the
    model's messages at the failed rows (row → message); z is None where S · D is above
    ``KEEP_Z_ENTRIES`` (then no mean shift is computed).  ``eps``: the standard normal draws
    ε (S, D) with z = m + A ε of a Gaussian q with a square A (mean-field, full-rank, Stan's
    ADVI and Pathfinder), for the curvature along the Newton step
    (:func:`stanvi.diagnostics.verdict.newton_curvature`); None otherwise or where z is."""

    log_p: np.ndarray
    log_q: np.ndarray
    messages: dict
    z: np.ndarray
    eps: np.ndarray | None = None


def can_draw(fit) -> bool:
    """Whether fresh draws from the fit's q can be evaluated (it has a family and a target
    with a log density: not a fit read from disk)."""
    target, family = getattr(fit, "target", None), getattr(fit, "family", None)
    return target is not None and family is not None and hasattr(target, "log_density")


def diagnostic_log_densities(fit, n_draws: int | None = None, seed: int | None = None,
                             batch: int = 0) -> DiagnosticSample | None:
    """log p, log q and the model's messages at S_diag fresh draws from the fit's q, drawn with
    ``seed`` (None: :data:`DIAGNOSTIC_SEED`, whatever the fit's seed) and ``batch`` (the
    verdict's added draws, :mod:`stanvi.diagnostics.verdict`, are batches 1, 2, …): one
    batched log-density call (no gradients), plus log q.  Returns None when the fit has no
    target to evaluate."""
    if not can_draw(fit):
        return None
    target, family = fit.target, fit.family
    dim = int(family.dim)
    n = diagnostic_draw_count(dim, len(fit.log_p)) if n_draws is None else int(n_draws)
    rng = _generator(seed, batch)
    width = int(family.base_dim)
    params = np.asarray(fit.params, dtype=float)
    # in blocks of rows (the same draws: NumPy's generator fills row after row), so that memory
    # stays O(CHUNK_ENTRIES) at large D (S_diag = 4,000 draws of D = 50,000 are 1.6 GB an array)
    rows = max(1, CHUNK_ENTRIES // max(width, 1))
    keep_z = n * dim <= KEEP_Z_ENTRIES   # the mean shift needs the draws themselves
    parts = []
    for start in range(0, n, rows):
        block = _block(target, family, params, rng.standard_normal((min(rows, n - start), width)))
        parts.append(block if keep_z else block._replace(z=None, eps=None))
    return merge_blocks(parts)


def merge_blocks(parts: list[DiagnosticSample]) -> DiagnosticSample:
    """One sample of several blocks of draws, in order (the messages' rows renumbered; z None
    if any block has none)."""
    if len(parts) == 1:
        return parts[0]
    messages, offset = {}, 0
    for part in parts:
        messages.update({offset + int(row): text for row, text in part.messages.items()})
        offset += len(part.log_p)
    z = None if any(p.z is None for p in parts) else np.concatenate([p.z for p in parts])
    eps = (None if any(p.eps is None for p in parts)
           else np.concatenate([p.eps for p in parts]))
    return DiagnosticSample(np.concatenate([p.log_p for p in parts]),
                            np.concatenate([p.log_q for p in parts]), messages, z, eps)


def _block(target, family, params: np.ndarray, eps: np.ndarray) -> DiagnosticSample:
    """log p, log q, the model's messages (by row) and the draws z at one block ``eps``."""
    if hasattr(family, "log_q_eps_np"):
        # the Gaussian families' host math (stanvi.families.host_math): z = m + A ε and
        # log q(z) in NumPy, no JAX program to compile on a first fit
        z = family.sample_np(params, eps)
        log_q = family.log_q_eps_np(params, eps)
        if int(family.base_dim) == int(family.dim):    # A square: ε is q's whitened z
            return evaluated(target, np.asarray(z, dtype=float), log_q)._replace(eps=eps)
    else:
        import jax.numpy as jnp  # noqa: PLC0415

        z = np.asarray(family.sample(jnp.asarray(params), jnp.asarray(eps)), dtype=float)
        log_q = np.asarray(family.log_q(jnp.asarray(params), jnp.asarray(z)), dtype=float)
    return evaluated(target, np.asarray(z, dtype=float), log_q)


def evaluated(target, z: np.ndarray, log_q: np.ndarray) -> DiagnosticSample:
    """The draws z with their log q and, from one batched call of ``target``, their log p
    (−inf where the model failed) and the model's messages."""
    res = target.log_density(z)
    log_p = np.asarray(res.log_density, dtype=float)
    if res.ok is not None:
        log_p = np.where(np.asarray(res.ok, dtype=bool), log_p, -np.inf)
    return DiagnosticSample(log_p, np.asarray(log_q, dtype=float), dict(res.messages or {}), z,
                            None)


def gaussian_draws(target, mean: np.ndarray, chol: np.ndarray, seed: int | None = None):
    """``draw(n, batch)`` for the verdict (:mod:`stanvi.diagnostics.verdict`) of a Gaussian
    q = N(m, L Lᵀ) known only by m and L (Stan's ADVI and Pathfinder, recovered from their
    output: :mod:`stanvi.reference.diagnostics`): n draws z = m + L ε, their log p through
    ``target`` and log q = log φ(ε) − Σ log L_ii, seeded as a stanvi fit's diagnostic draws
    (the same ε for the same D: :data:`DIAGNOSTIC_SEED`)."""
    mean = np.asarray(mean, dtype=float)
    chol = np.asarray(chol, dtype=float)
    dim = mean.size
    log_det = float(np.sum(np.log(np.abs(np.diagonal(chol)))))

    def draw(n: int, batch: int) -> DiagnosticSample:
        eps = _generator(seed, batch).standard_normal((int(n), dim))
        z = mean + eps @ chol.T
        log_q = -0.5 * np.sum(eps * eps, axis=1) - log_det - 0.5 * dim * np.log(2.0 * np.pi)
        return evaluated(target, z, log_q)._replace(eps=eps)
    return draw
