"""The VLB as a differentiable function of the hyperparameters: recomputed from scratch
(:func:`vlb_in_hyperparameters`), or with q held fixed in function space (:func:`vlb_envelope`,
full GPs) or over the inducing values (:func:`sparse_envelope`, sparse GPs) — the gradients of the
profile bound that the hyperparameter search uses."""
from __future__ import annotations


import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from gpvi.models.base import GP, Model, SparseGP, jitter_scale
from gpvi.objective.state import Chunks, State, is_batched, kl_state, per_latent_products
from gpvi.objective.chunks import training_chunks
from gpvi._linalg import lower_gram
from gpvi.objective.blocks import marginals_stacked, num_blocks, pass_projection, stacked_state
from gpvi.objective.passes import latent_moments_of_rows


def expected_in_hyperparameters(model: Model, prior, chunks: Chunks, state: State, blocks: int, proj=None):
    """``Σ E_i`` over ``chunks`` recomputed from ``model`` and its ``prior`` cache, differentiable
    in both; each chunk is rematerialised in the backward pass (``jax.checkpoint``), so the
    gradient takes O(chunk·d + d²) memory like the forward pass.  ``proj``: the chunks'
    projections computed from ``prior`` already (:func:`training_chunks`), else each chunk's
    are computed in turn."""
    lik = model.likelihood
    Q = is_batched(state)
    W = per_latent_products(stacked_state, Q, state)
    pcache = None if proj is not None else model.pass_cache(prior)

    @jax.checkpoint
    def chunk_E(ch, pr):
        A, b, c = pass_projection(model, pcache, ch, pr, proj is not None, blocks)
        m, v = per_latent_products(lambda A_, b_, c_, W_: marginals_stacked(A_, b_, c_, ch.offset, W_), Q, A, b, c, W)
        E = latent_moments_of_rows(lik, ch.y, m, v, Q, need_moments=False)
        return jnp.sum(jnp.where(ch.mask > 0, E, 0.0))

    pr = jnp.zeros(chunks.mask.shape[:1]) if proj is None else proj
    sE, _ = jax.lax.scan(lambda s, xs: (s + chunk_E(*xs), None), jnp.zeros(()), (chunks, pr))
    return sE


def vlb_in_hyperparameters(model: Model, X, chunks: Chunks, state: State, blocks: int | None = None):
    """VLB recomputed from scratch for ``model`` (differentiable in its parameters) on the
    chunks of its training inputs ``X`` (as an :class:`Objective` makes them); memory as
    :func:`expected_in_hyperparameters`.  A full GP's projections are gathered from ``Lᵀ``
    (:func:`training_chunks`), so its gradient does not differentiate a triangular solve."""
    k = num_blocks(state.mean.shape[-1]) if blocks is None else blocks
    prior = model.prior_cache(X)
    proj = training_chunks(model, prior, X, chunks.X, k)
    sE = expected_in_hyperparameters(model, prior, chunks, state, k, proj)
    return sE - kl_state(state)


def full_gp_latents(model) -> bool:
    """Whether every latent function of ``model`` is a full GP (a ``GP``, or a MultiLatent of
    them): then the data terms do not depend on the prior's parameters once ``q`` is held fixed
    over the training latents, and :func:`vlb_envelope` gives the hypergradient."""
    lats = getattr(model, "latents", None)
    return all(type(l) is GP for l in lats) if lats is not None else type(model) is GP


def vlb_envelope(model: Model, prior, chunks: Chunks, state: State, blocks: int, proj=None,
                 likelihood: bool = True):
    """A scalar whose gradient in ``model``'s parameters is the gradient of the VLB with ``q``
    held fixed over the training latents ``f`` (function space), for models whose latents are
    all full GPs (:func:`full_gp_latents`); ``prior`` is the model's prior cache (at the same
    parameters), ``state`` the variational state in its whitened coordinates.

    At the optimal ``q`` of the current parameters this is the gradient of the profile bound
    ``max_q VLB`` (the envelope theorem: it does not matter in which coordinates ``q`` is held,
    since ``∂VLB/∂q = 0`` there), which is what :func:`gpvi.fit` needs.  Held in function space,
    ``E_q log p(y | f)`` depends on the parameters only through the likelihood's own, and
    the KL term ``KL(N(m_f, S_f) ‖ N(μ, K))`` (``m_f = μ + L w``, ``S_f = L V Lᵀ``, ``K = L Lᵀ``
    with its jitter) has the closed-form derivatives

        ∂VLB/∂K = ½ L⁻ᵀ (V + w wᵀ − I) L⁻¹,     ∂VLB/∂μ = 1ᵀ L⁻ᵀ w,

    so the gradient costs two triangular solves and one product per latent and the kernel's
    own derivatives, instead of differentiating through the Cholesky factor and a pass of the
    data (USPS 4-7-9, three latents of 1 233 rows: 0.55 against 1.1–1.4 s).  ``likelihood``: also
    differentiate ``Σ E_i`` in the likelihood's parameters at the fixed marginals (one pass).
    """
    sg = jax.lax.stop_gradient
    Q = is_batched(state)
    lats = model.latents if Q else (model,)
    priors = prior if Q else (prior,)
    means = state.mean if Q else state.mean[None]
    chols = state.chol if Q else state.chol[None]
    # Latents that share their prior (MultiLatent._same_prior: one kernel for all, or tied
    # parameters) share K and L: their terms ½⟨L⁻ᵀ M_q L⁻¹, K⟩ add up to one with Σ_q M_q, so the
    # two (d, d) triangular solves and the kernel's derivative are done once per group (USPS
    # 4-7-9, one kernel for three latents: 2 solves instead of 6, each 1.9 GFLOP).
    same = model._same_prior() if Q else [0]
    out = jnp.zeros(())
    for g in sorted(set(same)):
        lat, (X, L, nugget) = lats[g], priors[g]
        L = sg(L)
        d = L.shape[0]
        Vw = jnp.zeros((d, d), L.dtype)
        for q in (q for q in range(len(lats)) if same[q] == g):
            w, C = sg(means[q]), sg(chols[q])
            Vw = Vw + lower_gram(C) + jnp.outer(w, w) - jnp.eye(d, dtype=C.dtype)  # V + w wᵀ − I
            z = solve_triangular(L, w, lower=True, trans="T")  # K⁻¹ (m_f − μ) = L⁻ᵀ w
            out = out + lats[q].mean * jnp.sum(z)
        Y = solve_triangular(L, Vw, lower=True, trans="T")  # L⁻ᵀ (V + w wᵀ − I)
        B = solve_triangular(L, Y.T, lower=True, trans="T")  # … L⁻¹ (the middle factor is symmetric)
        K = lat.kernel(X, X)
        s = jitter_scale(K)
        K_eff = K + sg(nugget / s) * s * jnp.eye(d, dtype=K.dtype)  # the factor's jitter multiplier, frozen
        out = out + 0.5 * jnp.sum(B * K_eff)
    if likelihood:
        fixed = sg(model).replace(likelihood=model.likelihood)
        out = out + expected_in_hyperparameters(fixed, sg(prior), chunks, state, blocks,
                                                None if proj is None else sg(proj))
    return out


def _inducing_space(model: SparseGP, state: State):
    """``(α, B, KL)`` of :func:`sparse_envelope`: ``q(u)`` held at its value under ``model``'s
    current parameters, as functions of those parameters."""
    sg = jax.lax.stop_gradient
    L = model.prior_cache(None)
    L0, w, Lv = sg(L), sg(state.mean), sg(state.chol)
    M = w.shape[0]
    C = solve_triangular(L, L0, lower=True)  # L⁻¹ L₀ (the identity at the current parameters)
    Cw, G = C @ w, C @ Lv
    alpha = solve_triangular(L, Cw, lower=True, trans="T")  # K⁻¹ μ_u
    inner = jnp.eye(M, dtype=L.dtype) - G @ G.T  # I − L⁻¹ S_u L⁻ᵀ
    Y = solve_triangular(L, inner, lower=True, trans="T")
    B = solve_triangular(L, Y.T, lower=True, trans="T")  # L⁻ᵀ (I − L⁻¹ S_u L⁻ᵀ) L⁻¹ (symmetric)
    logdet_Su = 2.0 * (jnp.sum(jnp.log(jnp.diag(L0))) + jnp.sum(jnp.log(jnp.abs(jnp.diag(Lv)))))
    kl = 0.5 * (jnp.sum(G * G) + Cw @ Cw - M + 2.0 * jnp.sum(jnp.log(jnp.diag(L))) - sg(logdet_Su))
    return alpha, B, kl


def sparse_envelope_kl(model: SparseGP, state: State):
    """``KL(q(u) ‖ N(0, K_zz))`` with ``q(u)`` held fixed over the inducing values (the prior
    term of :func:`sparse_envelope`)."""
    return _inducing_space(model, state)[2]


def sparse_envelope_expected(model: SparseGP, chunks: Chunks, state: State):
    """``Σ E_i`` over ``chunks`` with ``q(u)`` held fixed over the inducing values (the data term
    of :func:`sparse_envelope`; a block-wise pass adds it up block by block)."""
    alpha, B, _ = _inducing_space(model, state)
    return _expected_over_u(model, chunks, alpha, B)


def _expected_over_u(model: SparseGP, chunks: Chunks, alpha, B):
    """``Σ E_i`` with each row's marginal ``N(mean + k_iᵀ α, k_ii − k_iᵀ B k_i)``."""
    Z, lik = jnp.asarray(model.inducing), model.likelihood

    @jax.checkpoint
    def chunk_E(ch):
        Kzx = model.kernel.inducing_cross(Z, ch.X)
        m = model.mean + ch.offset + Kzx.T @ alpha
        v = model.kernel.diag(ch.X) - jnp.sum(Kzx * (B @ Kzx), axis=0)
        E = lik.expected_log_prob(ch.y, m, v)
        return jnp.sum(jnp.where(ch.mask > 0, E, 0.0))

    sE, _ = jax.lax.scan(lambda s, ch: (s + chunk_E(ch), None), jnp.zeros(()), chunks)
    return sE


def sparse_envelope(model: SparseGP, chunks: Chunks, state: State):
    """A scalar whose gradient in ``model``'s parameters is the gradient of the VLB of a sparse GP
    with ``q(u) = N(μ_u, S_u)`` held fixed over the inducing values ``u = L w`` (``K_zz = L Lᵀ``
    with its jitter, ``μ_u = L m``, ``S_u = L V Lᵀ`` at the current parameters), and whose value
    is the VLB there.

    At the optimal ``q`` this is the gradient of the profile bound (the envelope theorem, as for
    :func:`vlb_envelope`), the same as that of :func:`vlb_in_hyperparameters` with the whitened
    ``(m, V)`` held fixed.  Held over ``u``, a row's marginal is ``N(k_iᵀ α, k_ii − k_iᵀ B k_i)``
    with ``α = K⁻¹ μ_u`` and ``B = K⁻¹ − K⁻¹ S_u K⁻¹`` (two M×M triangular solves each), so the
    data pass is one product ``B K_zx`` per chunk instead of the whitened projection
    ``L⁻¹ K_zx`` followed by ``cholᵀ (L⁻¹ K_zx)``, and its derivative needs no derivative of
    either (a9a, M = 500, 32 561 rows: see benchmarks/README.md).  ``KL(q(u) ‖ N(0, K))`` has
    ``tr(K⁻¹ S_u) = ‖L⁻¹ L₀ chol V‖²_F`` and ``μ_uᵀ K⁻¹ μ_u = ‖L⁻¹ L₀ m‖²`` (``L₀`` the factor
    at the current parameters, held fixed).  One latent function; the data term is
    :func:`sparse_envelope_expected`, the prior term :func:`sparse_envelope_kl`.
    """
    alpha, B, kl = _inducing_space(model, state)  # once for both terms
    return _expected_over_u(model, chunks, alpha, B) - kl
