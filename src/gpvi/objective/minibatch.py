"""One minibatch, scaled by N / B: the sums and the bound the stochastic engines (sfp, svi) step on."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from gpvi.models.base import factored, kl_standard_normal
from gpvi.objective.state import Chunks, DEFAULT_CHUNK, State, Sums, is_batched
from gpvi.objective.blocks import (assemble_gram, block_gram, block_matvec, marginals_stacked, pass_projection,
                                   column_quadratic, raw_moments, stacked_state, zero_gram)
from gpvi._compile import jit


# ---- one minibatch, scaled (the stochastic engines: sfp, svi) ----------------------------------
# A minibatch larger than DEFAULT_CHUNK rows is summed over sub-chunks of at most that many rows
# (a lax.scan), like the full-data pass: measured on XLA:CPU at M = 300, the sums of one
# 4096-row batch took 29-32 ms per 1000 rows against 10 ms per 1000 rows in 2048-row pieces
# (the (d, n) projections of a piece stay in cache).

def split_batch(batch: Chunks, chunk_size: int = DEFAULT_CHUNK) -> Chunks:
    """A one-chunk ``batch`` (fields (B, ·)) as (C, n, ·) chunks of at most ``chunk_size`` rows,
    padded with masked copies of its first row (shapes are static, so this traces)."""
    B = batch.mask.shape[0]
    C = -(-B // chunk_size)
    n = -(-B // C)
    pad = C * n - B

    def cut(a, fill=None):
        if pad:
            extra = jnp.repeat(a[:1], pad, axis=0) if fill is None else jnp.full((pad,) + a.shape[1:], fill, a.dtype)
            a = jnp.concatenate([a, extra], axis=0)
        return a.reshape((C, n) + a.shape[1:])

    return Chunks(cut(batch.X), cut(batch.y), cut(batch.offset), cut(batch.mask, 0.0))


def minibatch_projection(model, prior, batch: Chunks, blocks: int = 1, pcache=None):
    """``(A blocks, b, c)`` of one minibatch of at most ``DEFAULT_CHUNK`` rows (see
    :func:`pass_projection`), to share between :func:`minibatch_sums` and
    :func:`minibatch_vlb` at two states (``proj=``).  ``pcache`` is ``model.pass_cache(prior)``
    (made here when None): for the sparse GP ``L⁻¹``, so each batch's projection is one matrix
    product instead of a triangular solve (measured 7× slower on XLA:CPU at M = 300)."""
    pcache = model.pass_cache(prior) if pcache is None else pcache
    return pass_projection(model, pcache, batch, None, False, blocks)


def _batch_data_sums(model, prior, batch: Chunks, W, blocks: int, want_hessian: bool, clip_gamma: bool,
                     proj=None, pcache=None):
    """``(Σ E_i, Σ ρ_i a_i, lower blocks of Σ λ_i a_i a_iᵀ)`` over the real rows of one chunk
    ``batch`` (fields (B, ·), no leading chunk axis), unscaled; the same per-chunk algebra as
    :func:`data_sums`."""
    A, b, c = minibatch_projection(model, prior, batch, blocks, pcache) if proj is None else proj
    m, v = marginals_stacked(A, b, c, batch.offset, W)
    E, rho, lam = model.likelihood.variational_moments(batch.y, m, v)
    keep = batch.mask > 0
    E, rho, lam = (jnp.where(keep, t, 0.0) for t in (E, rho, lam))
    if want_hessian:
        w = jnp.minimum(lam, 0.0) if clip_gamma else lam
        P, Arho = block_gram(A, w, rho)
    else:
        P, Arho = (), block_matvec(A, rho)
    return jnp.sum(E), Arho, P


@partial(jit, static_argnames=("blocks", "want_hessian", "clip_gamma"))
def minibatch_sums(model, prior, batch: Chunks, state: State, scale, blocks: int = 1,
                   want_hessian: bool = True, clip_gamma: bool = False, proj=None) -> Sums:
    """Unbiased estimates of the fields of :class:`Sums` from one minibatch.

    ``batch`` is a :class:`Chunks` of a single chunk: ``X`` (B, D), ``y``, ``offset``, ``mask``
    (B,), padding rows masked out; ``prior`` is ``model.prior_cache(·)``.  The data sums over
    the batch's rows are multiplied by ``scale`` (N / rows in the batch), so for a batch drawn
    uniformly at random the expectations are the full-data sums:
    ``vlb = scale·Σ_b E_i − KL``, ``grad = scale·Σ_b ρ_i a_i − m``, ``S = scale·Σ_b λ_i a_i a_iᵀ``.
    ``proj`` (:func:`minibatch_projection`, batches of at most ``DEFAULT_CHUNK`` rows) reuses the
    batch's projections.
    """
    W = stacked_state(state)
    d = state.mean.shape[0]
    if proj is not None or batch.mask.shape[0] <= DEFAULT_CHUNK:
        sE, Arho, P = _batch_data_sums(model, prior, batch, W, blocks, want_hessian, clip_gamma, proj)
    else:
        pcache = model.pass_cache(prior)

        def body(carry, ch):
            e, g, S = _batch_data_sums(model, prior, ch, W, blocks, want_hessian, clip_gamma, pcache=pcache)
            return (carry[0] + e, carry[1] + g, tuple(a + b for a, b in zip(carry[2], S))), None

        init = (jnp.zeros(()), jnp.zeros(d), zero_gram(d, blocks) if want_hessian else ())
        (sE, Arho, P), _ = jax.lax.scan(body, init, split_batch(batch))
    kl = kl_standard_normal(state.mean, state.chol)
    S = scale * assemble_gram(P, blocks) if want_hessian else jnp.zeros((0, 0))
    return Sums(scale * sE - kl, scale * Arho - state.mean, S)


def raw_pays(d: int, rows: int) -> bool:
    """Whether a batch of ``rows`` is cheaper summed in the raw features of a model with ``d``
    weights: moving the state costs about 3d³ (``raw_moments``) and each row d² once, against
    2d² a row through the projections (``T K_zx``, then ``Wᵀ`` times that); with derivatives
    6d³ + 2d²·rows against 6d²·rows.  At ``rows ≥ 3d`` the value costs no more and its gradient
    a third less; below it a large d with a small batch would pay d³ for nothing."""
    return rows >= 3 * d


def raw_sums(model, state: State, batch: Chunks) -> bool:
    """Whether a minibatch bound is summed in ``model``'s raw features: a factored model
    (:func:`~gpvi.models.base.factored`), one latent, and a batch that pays for it (:func:`raw_pays`)."""
    return factored(model) and not is_batched(state) and raw_pays(state.mean.shape[-1], batch.mask.shape[0])


def minibatch_vlb(model, batch: Chunks, state: State, scale, blocks: int = 1, prior=None, proj=None):
    """``scale·Σ_b E_i − KL``: the minibatch estimate of the VLB, differentiable in ``state`` and,
    when ``prior`` is None (the prior factorisation is then recomputed), in the model's
    parameters (not jitted: callers jit it inside their own step).  ``proj`` reuses the batch's
    projections (:func:`minibatch_projection`).

    Without ``proj``, a factored model with one latent (a sparse GP, see
    :meth:`gpvi.models.Model.raw_features`) and a batch of at least 3d rows
    (:func:`raw_pays`) is summed in its raw features, as a recomputing data pass is
    (:func:`~gpvi.objective.blocks.raw_moments`): ``T = pass_cache(prior)`` moves onto the state
    once, so a batch costs one product with ``D = Tᵀ(V − I)T`` instead of two (``T K_zx``, then
    ``Wᵀ`` times that), and its derivatives in the parameters (sfp's θ step) two more instead of
    four."""
    raw = proj is None and raw_sums(model, state, batch)
    pcache = None
    if prior is None and proj is None:
        prior, pcache = model.caches(batch.X)
    elif proj is None:
        pcache = model.pass_cache(prior)
    if raw:
        Tm, D = raw_moments(state, pcache)
    else:
        W = stacked_state(state)

    def chunk_E(ch, pr=None):
        if raw:
            return raw_expected_log_prob(model.likelihood, ch, Tm, D, *model.raw_features(ch.X))
        A, b, c = minibatch_projection(model, prior, ch, blocks, pcache) if pr is None else pr
        m, v = marginals_stacked(A, b, c, ch.offset, W)
        return jnp.sum(jnp.where(ch.mask > 0, model.likelihood.expected_log_prob(ch.y, m, v), 0.0))

    if proj is not None or batch.mask.shape[0] <= DEFAULT_CHUNK:
        sE = chunk_E(batch, proj)
    else:
        sE, _ = jax.lax.scan(lambda acc, ch: (acc + chunk_E(ch), None), jnp.zeros(()), split_batch(batch))
    return scale * sE - kl_standard_normal(state.mean, state.chol)


def raw_expected_log_prob(likelihood, ch: Chunks, Tm, D, F, b, k):
    """``Σ E_i`` over the real rows of one chunk from its raw features ``(F, b, k)``
    (:meth:`gpvi.models.Model.raw_features`) and the state's ``(Tm, D)``
    (:func:`~gpvi.objective.blocks.raw_moments`): means ``Tmᵀ f_i + b_i``, variances
    ``k_i + f_iᵀ D f_i``; differentiable in all of them."""
    m, v = Tm @ F + b + ch.offset, jnp.maximum(k + column_quadratic(D, F), 0.0)
    return jnp.sum(jnp.where(ch.mask > 0, likelihood.expected_log_prob(ch.y, m, v), 0.0))
