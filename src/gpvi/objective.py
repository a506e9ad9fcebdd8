"""The variational lower bound and its data sums, taken in chunks of rows.

Everything an engine needs from the data is three sums over observations
(DESIGN §1): ``Σ E_i`` (scalar), ``Σ ρ_i a_i`` (vector) and ``Σ λ_i a_i a_iᵀ`` (matrix).
:class:`Objective` computes them with a ``lax.scan`` over fixed-size chunks of rows, so the
working memory is O(chunk·d + d²) whatever N is.  When the projections ``a_i`` of all rows fit
in ``cache_bytes`` they are computed once and kept, which saves the kernel evaluation in every
later pass; otherwise they are recomputed chunk by chunk (for the sparse GP the pass then sums in
the raw kernel features and maps the sums through L⁻¹ once, see :func:`data_pass`).  Either way
they are held in row blocks (see :func:`num_blocks`), so that the two O(n·d²) products of a pass
skip the zero half of the triangular covariance factor and the upper half of the symmetric
``Σ λ_i a_i a_iᵀ``.

The variational state is ``State(mean, chol)`` with ``V = chol cholᵀ`` in the whitened
coordinates of :mod:`gpvi.models` (prior ``N(0, I)``).
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpvi._batching import map_latents
from gpvi.models.base import GLM, GP, Model, SparseGP, factored, jitter_scale, kl_standard_normal

__all__ = ["State", "Sums", "Chunks", "Objective", "make_chunks", "prior_state", "minibatch_sums", "minibatch_vlb"]

DEFAULT_CHUNK = 2048
DEFAULT_CACHE_BYTES = 512 * 2**20


class State(NamedTuple):
    """Variational parameters: ``q(w) = N(mean, chol cholᵀ)``; shapes (d,) and (d, d).

    ``chol`` must be lower triangular (the KL term reads ``log det V`` from its diagonal);
    :func:`gpvi.fit` re-factorises a user-supplied ``init``.
    """

    mean: jax.Array
    chol: jax.Array


class Sums(NamedTuple):
    """The VLB and the data sums at one state.

    ``grad = Σ ρ_i a_i − m`` is ∂VLB/∂m and ``S = Σ λ_i a_i a_iᵀ``, so that
    ``∂VLB/∂V = (S + V⁻¹ − I)/2``.  With ``clip_gamma`` the matrix is instead
    ``Σ min(λ_i, 0) a_i a_iᵀ`` (γ = −λ clipped at 0, for non-log-concave likelihoods).
    """

    vlb: jax.Array
    grad: jax.Array
    S: jax.Array
    #: Each row's curvature in the means of its Q latents, ``∂²E_i/∂m_i∂m_iᵀ`` (C, n, Q, Q),
    #: zero on padding; only for latents that the likelihood couples (``Objective.coupled``),
    #: where the joint Newton direction needs it (:func:`_coupled_direction`).  Else ``None``.
    rows_h: jax.Array | None = None
    #: ``tr(S V)`` (per latent), from the pass's marginal variances (``Σ λ_i a_iᵀ V a_i``), for
    #: the gap estimate; ``None`` where the sums were not taken by :meth:`Objective.sums`.
    trSV: jax.Array | None = None


class Chunks(NamedTuple):
    """Rows split into equal chunks, padded; ``mask`` is 1 on real rows, 0 on padding."""

    X: jax.Array  # (C, n, D)
    y: jax.Array  # (C, n)
    offset: jax.Array  # (C, n)
    mask: jax.Array  # (C, n)


def prior_state(d: int, num_latents: int | None = None) -> State:
    """The prior ``N(0, I)`` as a state (the default starting point); with ``num_latents = Q``
    (a model with latent blocks, :mod:`gpvi.models.multilatent`) a batch of Q blocks, mean (Q, d) and
    chol (Q, d, d)."""
    # built in NumPy and transferred: jnp.zeros/jnp.eye would each compile for every new d
    if num_latents is None:
        return State(jnp.asarray(np.zeros(d)), jnp.asarray(np.eye(d)))
    return State(jnp.asarray(np.zeros((num_latents, d))), jnp.asarray(np.broadcast_to(np.eye(d), (num_latents, d, d))))


# ---- several latent functions --------------------------------------------------------------
# A state whose mean is (Q, d) holds Q independent latent blocks (gpvi.models.multilatent): every
# per-latent operation below is the single-latent one mapped over the leading axis with
# map_latents (block by block, never a batched LAPACK call: see gpvi._batching), chosen at trace
# time from the static number of dimensions, so a single-latent model runs exactly the program
# it always ran.  The likelihood sees each row's Q latents together.


def is_batched(state) -> bool:
    """Whether ``state`` holds several latent blocks (mean (Q, d))."""
    return state.mean.ndim == 2


def per_latent(fn, batched: bool, *args):
    """``fn(*args)``, or mapped over the leading (latent) axis of every argument."""
    return map_latents(fn, *args) if batched else fn(*args)


def kl_state(state) -> jax.Array:
    """``KL(q || prior)`` summed over latent blocks (the prior is ``N(0, I)`` in each)."""
    if is_batched(state):
        return jnp.sum(map_latents(kl_standard_normal, state.mean, state.chol))
    return kl_standard_normal(state.mean, state.chol)


def latent_moments_of_rows(lik, y, m, v, batched: bool, need_moments: bool = True, hessians: bool = False):
    """``(E, ρ, λ)`` (or ``E`` alone) of the likelihood for one chunk: with several latents the
    marginals ``m, v`` (Q, n) are handed to it as (n, Q) and ``ρ, λ`` returned as (Q, n).
    With ``hessians`` (a likelihood with Q > 1 latents per row), also each row's curvature in
    the means (n, Q, Q) (:meth:`gpvi.likelihoods.Likelihood.moments_and_mean_hessians`)."""
    if not batched:
        return lik.variational_moments(y, m, v) if need_moments else lik.expected_log_prob(y, m, v)
    if getattr(lik, "num_latents", 1) == 1:  # one latent block of a single-latent likelihood
        if not need_moments:
            return lik.expected_log_prob(y, m[0], v[0])
        E, rho, lam = lik.variational_moments(y, m[0], v[0])
        return E, rho[None], lam[None]
    if not need_moments:
        return lik.expected_log_prob(y, m.T, v.T)
    if hessians:
        E, rho, lam, h = lik.moments_and_mean_hessians(y, m.T, v.T)
        return E, rho.T, lam.T, h
    E, rho, lam = lik.variational_moments(y, m.T, v.T)
    return E, rho.T, lam.T


def make_chunks(X, y=None, offset=None, chunk_size: int = DEFAULT_CHUNK, bucketed: bool = False) -> Chunks:
    """Split (N, D) inputs and (N,) targets/offsets into padded (C, n, ·) chunks.

    The fewest chunks of at most ``chunk_size`` rows, all of one size ``n``: padding is then
    under C rows, where chunks of exactly ``chunk_size`` rows would pad up to ``chunk_size − 1``
    (N = 2049 would cost two full chunks; at N = 20 000 the 2.4 % padding cost ~4 % of a pass).
    With ``bucketed``, ``n`` is rounded up to :func:`gpvi._compile.bucket` (at most
    ``chunk_size``), so that nearby N share one chunk shape and hence one compiled program.
    """
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    C = -(-N // int(max(1, chunk_size)))
    n = -(-N // C) if C else 1
    if bucketed:
        from gpvi._compile import bucket

        n = max(n, min(bucket(n), int(chunk_size)))
    pad = C * n - N
    y = np.zeros(N) if y is None else np.asarray(y, dtype=np.float64)
    offset = np.zeros(N) if offset is None else np.asarray(offset, dtype=np.float64)

    def padded(a):
        if pad:
            # Pad with copies of the first row so padded terms stay finite; the mask drops them.
            a = np.concatenate([a, np.repeat(a[:1], pad, axis=0)], axis=0)
        return a.reshape((C, n) + a.shape[1:])

    mask = np.concatenate([np.ones(N), np.zeros(pad)])
    return Chunks(jnp.asarray(padded(X)), jnp.asarray(padded(y)), jnp.asarray(padded(offset)),
                  jnp.asarray(mask.reshape(C, n)))


# ---- projections kept in row blocks -----------------------------------------------------------
# A pass needs two O(n·d²) products per chunk: ``[mean; cholᵀ] · A`` for the latent marginals and
# ``(A·λ) Aᵀ`` for Σλ_i a_i a_iᵀ.  ``cholᵀ`` is upper triangular and the second product is
# symmetric, so with the d rows of A split into k blocks, only the blocks of ``cholᵀ`` on or above
# its diagonal and the blocks of Σλaaᵀ on or below its diagonal need computing: (k+1)/2k of the
# flops.  The blocks are stored as separate arrays (the cached projections are split once, at
# set-up), so no per-chunk slicing copies them.  Measured on XLA:CPU (2 cores, n = 2000): at
# d = 200 a pass takes 27 ms in 2 blocks against 31 ms in one; at d = 120 it takes 18.5 ms in
# 2 blocks against 15.5 ms in one (smaller products run at fewer GFLOP/s); at d = 400–600, 3–4
# blocks beat 2.


def num_blocks(d: int) -> int:
    """How many row blocks the projections of a model with ``d`` weights are split into."""
    return 1 if d < 144 else min(4, max(2, round(d / 150)))


def block_edges(d: int, k: int) -> tuple[int, ...]:
    """Boundaries of ``k`` near-equal row blocks of ``d`` rows."""
    return tuple(round(i * d / k) for i in range(k + 1))


def split_rows(At, k: int) -> tuple:
    """``At`` (…, d, n) as ``k`` row blocks (…, d_j, n) (see :func:`block_edges`)."""
    e = block_edges(At.shape[-2], k)
    return tuple(At[..., e[j]:e[j + 1], :] for j in range(k))


def chunk_projection(model, prior, ch, pr, cached: bool, k: int):
    """``(blocks, b, c)`` of one chunk: the cached projections, or computed now and split."""
    if cached:
        return pr
    At, b, c = model.project(prior, ch.X)
    return split_rows(At, k), b, c


def pass_projection(model, pcache, ch, pr, cached: bool, k: int):
    """As :func:`chunk_projection`, from ``pcache = model.pass_cache(prior)`` prepared once per
    pass (see :meth:`gpvi.models.Model.project_many`)."""
    if cached:
        return pr
    At, b, c = model.project_many(pcache, ch.X)
    return split_rows(At, k), b, c


def block_matvec(blocks, r):
    """``A r`` (d,) for A given as row blocks and r (n,)."""
    return jnp.concatenate([a @ r for a in blocks]) if len(blocks) > 1 else blocks[0] @ r


def block_vecmat(u, blocks):
    """``uᵀ A`` (n,) for u (d,) and A given as row blocks."""
    e = block_edges(u.shape[0], len(blocks))
    return sum(u[e[j]:e[j + 1]] @ a for j, a in enumerate(blocks))


def block_sum_squares(blocks):
    """Column sums of squares ``Σ_k A_ki²`` (n,) of A given as row blocks."""
    return sum(jnp.sum(a * a, axis=0) for a in blocks)


def block_gram(blocks, w, r=None):
    """The blocks on and below the diagonal of ``A diag(w) Aᵀ``, row by row (a flat tuple; add
    them up over chunks, then :func:`assemble_gram`).

    With ``r`` (n,), also ``A r`` (d,), returned as ``(blocks, A r)``: ``r`` rides as one more row
    of the last row block's scaled operand, so ``A r`` comes out of the same products instead
    of a separate pass over A (measured: 1–2.5 ms less per pass at d = 200, N = 20 000).
    """
    k = len(blocks)
    out, Ar = [], []
    for i, ai in enumerate(blocks):
        aw = ai * w
        if r is not None and i == k - 1:
            aw = jnp.concatenate([aw, r[None]], axis=0)
        prods = [aw @ blocks[j].T for j in range(i + 1)]
        if r is not None and i == k - 1:
            Ar = [p[-1] for p in prods]
            prods = [p[:-1] for p in prods]
        out.extend(prods)
    if r is None:
        return tuple(out)
    return tuple(out), (jnp.concatenate(Ar) if k > 1 else Ar[0])


def zero_gram(d: int, k: int, dtype=jnp.float64):
    """Zeros shaped like :func:`block_gram`'s output (the start of a sum over chunks)."""
    e = block_edges(d, k)
    return tuple(jnp.zeros((e[i + 1] - e[i], e[j + 1] - e[j]), dtype) for i in range(k) for j in range(i + 1))


def assemble_gram(lower, k: int):
    """The symmetric (d, d) matrix from :func:`block_gram`'s lower blocks (each diagonal block
    symmetrised: a dense product is symmetric only up to rounding)."""
    idx = {}
    for i in range(k):
        for j in range(i + 1):
            idx[i, j] = lower[len(idx)]
    rows = [[(0.5 * (idx[i, i] + idx[i, i].T) if i == j else idx[i, j] if j < i else idx[j, i].T)
             for j in range(k)] for i in range(k)]
    return jnp.block(rows) if k > 1 else rows[0][0]


def stacked_state(state):
    """``[mean; cholᵀ]`` (d+1, d): its product with a chunk gives the latent means (row 0)
    and ``cholᵀ a_i``, whose squared norms are the variances ``a_iᵀ V a_i``."""
    return jnp.concatenate([state.mean[None], state.chol.T], axis=0)


def marginals_stacked(blocks, b, c, off, W):
    """Means and variances of the latents of one chunk under q, from ``W = stacked_state(state)``
    and the chunk's projections in row blocks.

    ``W[1:] = cholᵀ`` is upper triangular (``State.chol`` is lower triangular), so row block i
    of ``cholᵀ A`` needs only the column blocks j ≥ i; the mean row rides with block 0.
    """
    k = len(blocks)
    e = block_edges(W.shape[1], k)
    m, v = None, 0.0
    for i in range(k):
        r0 = 0 if i == 0 else e[i] + 1
        z = sum(W[r0:e[i + 1] + 1, e[j]:e[j + 1]] @ blocks[j] for j in range(i, k))
        if i == 0:
            m, z = z[0], z[1:]
        v = v + jnp.sum(z * z, axis=0)
    return m + b + off, c + v


def _raw_operator(state, T):
    """``[Tᵀ m; D̃]`` (d+1, d), the state moved into the basis of the raw features ``F`` of a
    factored model (``At = T F``, see :meth:`gpvi.models.Model.raw_features`), where ``D̃`` is the
    lower triangle of ``D = Tᵀ(V − I)T`` (``V = chol cholᵀ``) with its diagonal halved, so that
    ``fᵀ D f = 2 fᵀ D̃ f``.  Row 0 times a chunk's ``F`` gives the latent means; the variances are
    ``c + a_iᵀ V a_i = k_i − |a_i|² + a_iᵀ V a_i = k_i + f_iᵀ D f_i`` (:func:`_raw_marginals`).

    ``V − I`` is formed before the products, so its rounding error reaches a variance only as
    ``a_iᵀ E a_i ≤ ε|a_i|² ≤ ε k_i``: the O(|T|²) entries of ``Tᵀ T`` are never subtracted."""
    d = T.shape[0]
    V = state.chol @ state.chol.T
    D = T.T @ ((V - jnp.eye(d, dtype=V.dtype)) @ T)
    D = 0.5 * (D + D.T)
    Dt = jnp.tril(D, -1) + 0.5 * jnp.diag(jnp.diag(D))
    return jnp.concatenate([(T.T @ state.mean)[None], Dt], axis=0)


def _raw_marginals(blocks, b, k, off, W):
    """Means and variances of one chunk's latents from its raw features ``F`` in row blocks and
    ``W = _raw_operator(state, T)``: ``m = (Tᵀ m)ᵀ F``, ``v = k + 2 Σ_rows F ∘ (D̃ F)``.  ``D̃``
    is lower triangular, so row block i of ``D̃ F`` needs only the column blocks j ≤ i (at
    M = 300, two blocks: 3/4 of the flops of the full product)."""
    e = block_edges(W.shape[1], len(blocks))
    m = sum(W[0, e[j]:e[j + 1]] @ f for j, f in enumerate(blocks))
    q = 0.0
    for i, fi in enumerate(blocks):
        z = sum(W[1 + e[i]:1 + e[i + 1], e[j]:e[j + 1]] @ blocks[j] for j in range(i + 1))
        q = q + jnp.sum(fi * z, axis=0)
    return m + b + off, jnp.maximum(k + 2.0 * q, 0.0)


def split_gram(S, k: int) -> tuple:
    """The lower row blocks of a symmetric (d, d) ``S`` in :func:`block_gram`'s order."""
    e = block_edges(S.shape[0], k)
    return tuple(S[e[i]:e[i + 1], e[j]:e[j + 1]] for i in range(k) for j in range(i + 1))


def _chunk_marginals(model, pcache, ch, pr, cached, blocks, Q, W, raw):
    """``(A, m, v, v0)`` of one chunk: the rows its sums are taken over, in row blocks (the
    projections, or the raw features ``F`` of a factored model when ``raw``), the latents'
    means and variances under q (``W`` from :func:`stacked_state` or :func:`_raw_operator`), and the
    part of the variances that q does not set: ``v − v0 = a_iᵀ V a_i`` (``v0 = c``), or
    ``a_iᵀ (V − I) a_i`` when ``raw`` (``v0 = k``)."""
    if raw:
        F, b, k = model.raw_features(ch.X)
        F = split_rows(F, blocks)
        return (F, *_raw_marginals(F, b, k, ch.offset, W), k)
    A, b, c = pass_projection(model, pcache, ch, pr, cached, blocks)
    m, v = per_latent(lambda A_, b_, c_, W_: marginals_stacked(A_, b_, c_, ch.offset, W_), Q, A, b, c, W)
    return A, m, v, c


def _pass_setup(model, prior, state, cached):
    """``(Q, raw, pcache, W)`` for a pass: whether the state holds several latents, whether the
    chunks are summed in the raw features of a factored model (projections recomputed, one
    latent), the per-pass cache and the state operator."""
    Q = is_batched(state)  # several latents: per-latent blocks of the same sums (see per_latent)
    raw = not cached and not Q and factored(model)
    pcache = None if cached else model.pass_cache(prior)
    W = _raw_operator(state, pcache) if raw else per_latent(stacked_state, Q, state)
    return Q, raw, pcache, W


def data_pass(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma=False, want_rows=False,
          want_trace=False):
    """The raw partial sums of one pass over ``chunks``: ``(Σ E_i, Σ ρ_i a_i, lower row blocks of
    Σ λ_i a_i a_iᵀ)`` (the last an empty tuple without ``want_hessian``).

    With ``want_rows`` or ``want_trace`` the result is ``(sums, extras)``, ``extras`` a dict
    with ``"rows_h"``, every row's curvature in the means of latents coupled by the likelihood
    (C, n, Q, Q): per row, not a sum, so only for a pass over all chunks at once
    (:meth:`Objective.sums`); and ``"trSV"``, ``tr(S V) = Σ λ_i a_iᵀ V a_i`` (per latent), read
    off the marginal variances the pass computes anyway, so that the gap estimate needs no
    d×d×d product (:func:`gpvi.engines._common.estimated_gap`).

    Partial sums over disjoint sets of chunks add up (:func:`add_partials`) to the sums over
    their union; :func:`finish_sums` turns the total into :class:`Sums`.  This is the unit of
    work every executor of the data pass maps over the data (see :mod:`gpvi.data.executors`).

    Where the projections are recomputed and the model is factored (``At = T F``, the sparse
    GP with ``T = L⁻¹``), the pass never forms ``T F``: it sums ``Σ ρ_i f_i`` and
    ``Σ λ_i f_i f_iᵀ`` and maps them through ``T`` once at the end, with the state mapped the
    other way at the start (:func:`_raw_operator`).  That drops one of the three O(n·d²)
    products per chunk (measured at M = 300, n = 2048: 1.25× the cached pass against 1.7×).
    """
    lik = model.likelihood
    d = state.mean.shape[-1]
    Q, raw, pcache, W = _pass_setup(model, prior, state, cached)

    def body(carry, xs):
        sE, g, S, tSV = carry
        ch, pr = xs
        A, m, v, v0 = _chunk_marginals(model, pcache, ch, pr, cached, blocks, Q, W, raw)
        keep = ch.mask > 0
        if want_rows:
            E, rho, lam, h = latent_moments_of_rows(lik, ch.y, m, v, Q, hessians=True)
            h = jnp.where(keep[:, None, None], h, 0.0)
        else:
            E, rho, lam = latent_moments_of_rows(lik, ch.y, m, v, Q)
            h = None
        E, rho, lam = (jnp.where(keep, t, 0.0) for t in (E, rho, lam))
        sE = sE + jnp.sum(E)
        if want_hessian:
            w = jnp.minimum(lam, 0.0) if clip_gamma else lam
            P, Arho = per_latent(block_gram, Q, A, w, rho)
            S = tuple(s + t for s, t in zip(S, P))
            if want_trace:
                tSV = tSV + jnp.sum(w * (v - v0), axis=-1)
        else:
            Arho = per_latent(block_matvec, Q, A, rho)
        return (sE, g + Arho, S, tSV), h

    zero_S = ()
    if want_hessian:
        zero_S = zero_gram(d, blocks)
        if Q:
            zero_S = tuple(jnp.zeros((state.mean.shape[0],) + z.shape, z.dtype) for z in zero_S)
    init = (jnp.zeros(()), jnp.zeros(state.mean.shape), zero_S, jnp.zeros(state.mean.shape[:-1]))
    (sE, g, S, tSV), rows_h = jax.lax.scan(body, init, (chunks, proj))
    if raw:  # back from the raw features: Σ ρ a = T Σ ρ f, Σ λ a aᵀ = T (Σ λ f fᵀ) Tᵀ
        g = pcache @ g
        if want_hessian:
            S_full = pcache @ assemble_gram(S, blocks) @ pcache.T
            S = split_gram(S_full, blocks)
            tSV = tSV + jnp.trace(S_full)  # Σ λ aᵀ(V − I)a + Σ λ aᵀa
    if not (want_rows or want_trace):
        return sE, g, S
    extras = {}
    if want_rows:
        extras["rows_h"] = rows_h
    if want_trace and want_hessian:
        extras["trSV"] = tSV
    return (sE, g, S), extras


def finish_sums(partial_sums, state, blocks, want_hessian):
    """:class:`Sums` fields ``(VLB, Σ ρ_i a_i − m, Σ λ_i a_i a_iᵀ)`` from the partial sums of all
    the data (the KL term and the prior's share of the gradient added once)."""
    sE, g, S = partial_sums
    kl = kl_state(state)
    if want_hessian:
        S = per_latent(lambda S_: assemble_gram(S_, blocks), is_batched(state), S)
    else:
        S = jnp.zeros((0, 0))
    return sE - kl, g - state.mean, S


def add_partials(parts):
    """The sum of a sequence of partial-sum pytrees, added pairwise in a fixed tree shape.

    The order of the additions depends only on the number of parts, never on which worker
    produced which part or when, so a pass gives the same bits however it was scheduled.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("no partial sums to add")
    while len(parts) > 1:
        nxt = [jax.tree_util.tree_map(lambda a, b: a + b, parts[i], parts[i + 1])
               for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


@partial(jax.jit, static_argnames=("cached", "blocks", "want_hessian", "clip_gamma", "want_rows"))
def _sums(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma=False, want_rows=False):
    """:class:`Sums` over all chunks: ``(VLB, Σ ρ_i a_i − m, Σ λ_i a_i a_iᵀ)``, with
    ``want_hessian`` also ``tr(S V)``, and with ``want_rows`` the rows' curvatures in the means."""
    sums, extras = data_pass(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma, want_rows,
                         want_trace=True)
    return Sums(*finish_sums(sums, state, blocks, want_hessian), **extras)


def expected_pass(model, prior, chunks, proj, state, cached, blocks):
    """``Σ E_i`` over ``chunks`` (no derivatives): the partial sum behind :meth:`Objective.vlb`."""
    lik = model.likelihood
    Q, raw, pcache, W = _pass_setup(model, prior, state, cached)

    def body(sE, xs):
        ch, pr = xs
        _, m, v, _ = _chunk_marginals(model, pcache, ch, pr, cached, blocks, Q, W, raw)
        E = latent_moments_of_rows(lik, ch.y, m, v, Q, need_moments=False)
        return sE + jnp.sum(jnp.where(ch.mask > 0, E, 0.0)), None

    sE, _ = jax.lax.scan(body, jnp.zeros(()), (chunks, proj))
    return sE


@partial(jax.jit, static_argnames=("cached", "blocks"))
def _expected(model, prior, chunks, proj, state, cached, blocks):
    """The VLB only (no derivatives)."""
    return expected_pass(model, prior, chunks, proj, state, cached, blocks) - kl_state(state)


@partial(jax.jit, static_argnames=("max_iter",))
def _coupled_direction(model, chunks, proj, state, grad, RH, rows_h=None, max_iter=200, rtol=1e-3):
    """The Newton direction ``d = Ĥ⁻¹ g`` of the VLB in the means of all Q latent blocks at once,
    and the gain it predicts, ``½ gᵀĤ⁻¹g`` (the mean's share of the estimated gap).

    With Q latents per row the negative Hessian of the VLB in the means is
    ``Ĥ = I − Σ_i A_i h_i A_iᵀ``, ``h_i = ∂²E_i/∂m_i∂m_iᵀ`` (Q, Q) and ``A_i`` the block-diagonal
    map from the Q weight blocks to row i's latents: the factorised q keeps the covariances per
    latent, but the likelihood couples the means (softmax: ``h_i = −E[diag p − p pᵀ]``, whose
    off-diagonal terms the per-latent step ``H_q⁻¹ g_q`` ignores; near the shift ``f → f + c·1``
    that softmax cannot see, that step then converges slowly).  Solved by conjugate gradients
    preconditioned with the per-latent factors ``RH`` (:func:`gpvi.engines._common.precision_chol`,
    which the covariance step factorises anyway), from the per-latent step; each iteration is
    one product with the cached projections, O(N·d·Q).  ``rows_h`` (C, n, Q, Q) are the rows'
    ``h_i`` at ``state`` (:attr:`Sums.rows_h`); recomputed here when not given.

    Stops at relative residual ``rtol`` (in the preconditioner's norm), after ``max_iter``
    iterations, or where a direction shows no positive curvature (a likelihood that is not
    log-concave far from the optimum), returning the best iterate so far — the engine's
    safeguard handles an inexact direction.  The default ``rtol = 1e-3`` makes this an inexact
    Newton step with forcing term 1e-3: the mean then still contracts by about that factor
    per step, and the predicted gain, computed from the residual so that its error is of
    second order (a lower bound), was within 1e-5 relative of the exact one.  Measured on USPS 4-7-9 (three latents on 1233 rows,
    kernel variance 89): 17 CG iterations against 85 at 1e-10, the learned fit 82 → 67 s.
    """
    if rows_h is None:
        lik = model.likelihood
        W = per_latent(stacked_state, True, state)

        def curvature(xs):
            ch, (A, b, c) = xs
            m, v = per_latent(lambda A_, b_, c_, W_: marginals_stacked(A_, b_, c_, ch.offset, W_), True,
                              A, b, c, W)
            h = lik.moments_and_mean_hessians(ch.y, m.T, v.T)[3]
            return jnp.where((ch.mask > 0)[:, None, None], h, 0.0)

        rows_h = jax.lax.map(curvature, (chunks, proj))

    def apply(U):
        def body(acc, xs):
            (A, _, _), h = xs
            F = per_latent(block_vecmat, True, U, A)  # (Q, n): a_iqᵀ u_q
            G = jnp.einsum("nqk,kn->qn", h, F)
            return acc + per_latent(block_matvec, True, A, G), None

        S, _ = jax.lax.scan(body, jnp.zeros_like(U), (proj, rows_h))
        return U - S

    def precond(R):
        return map_latents(lambda f, r: jax.scipy.linalg.cho_solve((f, True), r[::-1])[::-1], RH, R)

    x = precond(grad)
    r = grad - apply(x)
    z = precond(r)
    rz = jnp.vdot(r, z)
    stop = (rtol ** 2) * jnp.vdot(grad, precond(grad))

    def cond(c):
        it, _, _, _, rz, ok = c
        return (it < max_iter) & (rz > stop) & ok

    def body(c):
        it, x, r, p, rz, _ = c
        Ap = apply(p)
        pAp = jnp.vdot(p, Ap)
        ok = pAp > 0.0
        a = jnp.where(ok, rz / jnp.where(ok, pAp, 1.0), 0.0)
        x, r = x + a * p, r - a * Ap
        z = precond(r)
        rz_new = jnp.vdot(r, z)
        return it + 1, x, r, z + (rz_new / rz) * p, rz_new, ok

    _, x, r, _, _, _ = jax.lax.while_loop(cond, body, (0, x, r, z, rz, jnp.asarray(True)))
    # the quadratic model's gain gᵀx − ½ xᵀĤx = ½ (gᵀx + rᵀx), with r = g − Ĥx: at most the
    # exact ½ gᵀĤ⁻¹g, short of it by ½‖x − Ĥ⁻¹g‖²_Ĥ (second order in the error of x)
    return x, 0.5 * (jnp.vdot(grad, x) + jnp.vdot(r, x))


def all_finite(tree):
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


@partial(jax.jit, static_argnames=("cached", "blocks"))
def chunk_setup(model, X, chunk_X, cached, blocks):
    """The prior cache, whether it is finite, and (``cached``) the projections of all chunks in
    row blocks — one compiled program for everything an :class:`Objective` precomputes."""
    prior = model.prior_cache(X)
    finite = all_finite(prior)
    train = training_chunks(model, prior, X, chunk_X, blocks) if cached else None
    if train is not None:
        return prior, finite, train
    if cached:
        pcache = model.pass_cache(prior)

        def one(Xc):
            At, b, c = model.project_many(pcache, Xc)
            return split_rows(At, blocks), b, c
        return prior, finite, jax.lax.map(one, chunk_X)
    return prior, finite, jnp.zeros(chunk_X.shape[:1] + (0,))


def training_chunks(model, prior, X, chunk_X, blocks):
    """The projections of all chunks, in row blocks, gathered from
    :meth:`gpvi.models.Model.training_projection` where the model has one (the full GP:
    ``At = Lᵀ``, no triangular solve per chunk); ``None`` otherwise.

    Only for a model that is not :func:`bucketable`, whose chunks are the prior's own inputs
    ``X`` padded with copies of row 0 (:func:`make_chunks`)."""
    train = None if bucketable(model) else model.training_projection(prior)
    if train is None:
        return None
    N, (C, n) = X.shape[0], chunk_X.shape[:2]
    idx = np.concatenate([np.arange(N), np.zeros(C * n - N, int)]).reshape(C, n)
    At, b, c = (jnp.moveaxis(t[..., idx], -2, 0) for t in train)
    return split_rows(At, blocks), b, c


def as_device_array(X) -> jax.Array:
    """``X`` as a float64 device array.  A host (NumPy) array is transferred with
    ``jax.device_put``: ``jnp.asarray`` of a host array stages it through a small compiled
    program specialised to its shape (jax 0.10), so every new training-set size compiled one
    more program even when the fit's own programs were shared through a size bucket."""
    if isinstance(X, jax.Array) and X.dtype == jnp.float64:
        return X
    return jax.device_put(np.asarray(X, dtype=np.float64))


#: Largest training set whose rows are padded to a size bucket for a model of several latents
#: (:func:`pads_rows`).  Padding costs up to 20 % more rows per pass, and a pass of Q latents
#: costs Q times one latent's: a three-class softmax sparse GP on 3 000 rows (two chunks of
#: 1 500 padded to 1 720) took 0.86-0.90 s per fit instead of 0.73-0.81 s.  Below this size the
#: passes take milliseconds and a new compiled shape seconds, so sharing programs wins.
MULTI_LATENT_BUCKET_MAX = 1024


def pads_rows(model, num_rows: int) -> bool:
    """Whether the data sums of ``model`` on ``num_rows`` rows are taken over rows padded to a
    size bucket: a :func:`bucketable` model, and for several latents only up to
    :data:`MULTI_LATENT_BUCKET_MAX` rows."""
    if not bucketable(model):
        return False
    return getattr(model, "latents", None) is None or int(num_rows) <= MULTI_LATENT_BUCKET_MAX


def bucketable(model) -> bool:
    """Whether ``model``'s data sums are taken over rows padded to a size bucket
    (:func:`gpvi._compile.bucket`): the sparse GP and the GLM, whose weights do not depend on
    N, and a :class:`~gpvi.models.multilatent.MultiLatent` of such latents.  (A full GP has one
    weight per row: padding would change its prior; see :mod:`gpvi.fitting.collapsed` for the
    Gaussian case, where padding is exact.)"""
    latents = getattr(model, "latents", None)
    if latents is not None:
        return all(type(l) in (SparseGP, GLM) for l in latents)
    return type(model) in (SparseGP, GLM)


def prior_inputs(model, X, chunks: Chunks):
    """The inputs :meth:`Model.prior_cache` is compiled for: the padded rows of ``chunks`` for a
    :func:`bucketable` model (which ignores them), so its shape is the bucket's, else ``X``."""
    return chunks.X.reshape((-1,) + chunks.X.shape[2:]) if bucketable(model) else X


class Objective:
    """The VLB of ``model`` on data ``(X, y)``, and the sums the engines need.

    Parameters
    ----------
    model : Model
        A concrete model (see :meth:`gpvi.models.Model.initialise`).
    X : (N, D) array; y : (N,) array in the likelihood's internal coding;
    offset : (N,) array or None, added to every latent (``log`` exposure for counts).
    chunk_size : most rows per chunk of the data sums (see :func:`make_chunks`).
    cache_bytes : keep all projections ``a_i`` in memory when they take at most this much.
    blocks : number of row blocks the projections are split into (default
        :func:`num_blocks` of the number of weights; any value gives the same sums).
    coupled : whether fpi's mean steps take the joint Newton direction of Q latents that the
        likelihood couples (softmax); ``None`` (default): where the projections are in memory.
    newton_rtol : relative residual at which that direction's conjugate gradients stop.

    Raises
    ------
    numpy.linalg.LinAlgError
        Naming the matrix, when the prior covariance cannot be factorised even with the largest
        jitter (:meth:`check_prior`): a constructed objective always has a finite prior.
    """

    def __init__(self, model: Model, X, y, offset=None, *, chunk_size=DEFAULT_CHUNK,
                 cache_bytes=DEFAULT_CACHE_BYTES, blocks: int | None = None, coupled: bool | None = None,
                 newton_rtol: float = 1e-3):
        self.model = model
        self.X = as_device_array(X)
        self.num_data = int(self.X.shape[0])
        self.chunks = make_chunks(X, y, offset, chunk_size, bucketed=pads_rows(model, np.shape(X)[0]))
        self.dim = model.num_weights(X)
        self.num_latents = getattr(model, "num_latents", None)  # None: a single-latent model
        C, n = self.chunks.mask.shape
        self.cached = C * n * (self.dim + 2) * (self.num_latents or 1) * 8 <= cache_bytes
        self.blocks = num_blocks(self.dim) if blocks is None else int(blocks)
        if not 1 <= self.blocks <= self.dim:
            raise ValueError(f"blocks must be between 1 and the number of weights ({self.dim}), got {blocks!r}")
        self.prior, self._prior_finite, self.proj = chunk_setup(model, prior_inputs(model, self.X, self.chunks),
                                                           self.chunks.X, self.cached, self.blocks)
        self.check_prior()
        self.num_evaluations = 0
        # Q latents that the likelihood couples: the mean steps use the joint Newton direction
        # (:meth:`newton_direction`) when the projections are in memory (each CG iteration is a
        # product with them); coupled=False takes the per-latent steps instead.
        can_couple = bool(self.num_latents and getattr(model.likelihood, "num_latents", 1) > 1 and self.cached)
        if coupled not in (None, True, False):
            raise ValueError(f"coupled must be None (automatic), True or False, got {coupled!r}")
        if coupled and not can_couple:
            raise ValueError("coupled=True needs several latents that the likelihood couples (softmax) and the "
                             "projections in memory (cache_bytes)")
        self.coupled = can_couple if coupled is None else coupled
        # relative residual at which the conjugate gradients of that direction stop (an inexact
        # Newton step; see _coupled_direction)
        if not (isinstance(newton_rtol, (int, float)) and 0 < newton_rtol < 1):
            raise ValueError(f"newton_rtol must be a number in (0, 1), got {newton_rtol!r}")
        self.newton_rtol = float(newton_rtol)

    def newton_direction(self, state: State, grad, RH, rows_h=None):
        """The joint Newton direction of the means of all latent blocks and the gain it
        predicts (see :func:`_coupled_direction`); ``RH`` holds the per-latent precision
        factors and ``rows_h`` the rows' curvatures from the sums at ``state`` (recomputed if
        ``None``)."""
        return _coupled_direction(self.model, self.chunks, self.proj, state, grad, RH, rows_h,
                                  rtol=self.newton_rtol)

    # -- the three sums ------------------------------------------------------------------
    def sums(self, state: State, want_hessian: bool = True, clip_gamma: bool = False) -> Sums:
        """The VLB with its derivatives at ``state`` (see :class:`Sums`)."""
        self.num_evaluations += 1
        return _sums(self.model, self.prior, self.chunks, self.proj, state, self.cached,
                     self.blocks, want_hessian, clip_gamma, want_hessian and self.coupled)

    def vlb(self, state: State):
        """The variational lower bound in nats, summed over the data."""
        self.num_evaluations += 1
        return _expected(self.model, self.prior, self.chunks, self.proj, state, self.cached, self.blocks)

    def check_prior(self):
        """Raise a clear error when the prior covariance could not be factorised."""
        if not bool(self._prior_finite):
            name = "K(Z, Z) of the inducing inputs" if type(self.model).__name__ == "SparseGP" else "K(X, X)"
            raise np.linalg.LinAlgError(
                f"Cholesky of {name} failed even with jitter up to {self.model.jitter * 10**7:g}×mean diagonal; "
                "remove duplicate inducing inputs, shorten the lengthscale or raise the model's jitter"
            )


def expected_in_hyperparameters(model: Model, prior, chunks: Chunks, state: State, blocks: int, proj=None):
    """``Σ E_i`` over ``chunks`` recomputed from ``model`` and its ``prior`` cache, differentiable
    in both; each chunk is rematerialised in the backward pass (``jax.checkpoint``), so the
    gradient takes O(chunk·d + d²) memory like the forward pass.  ``proj``: the chunks'
    projections computed from ``prior`` already (:func:`training_chunks`), else each chunk's
    are computed in turn."""
    lik = model.likelihood
    Q = is_batched(state)
    W = per_latent(stacked_state, Q, state)
    pcache = None if proj is not None else model.pass_cache(prior)

    @jax.checkpoint
    def chunk_E(ch, pr):
        A, b, c = pass_projection(model, pcache, ch, pr, proj is not None, blocks)
        m, v = per_latent(lambda A_, b_, c_, W_: marginals_stacked(A_, b_, c_, ch.offset, W_), Q, A, b, c, W)
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
    out = jnp.zeros(())
    for q, (lat, (X, L, nugget)) in enumerate(zip(lats, priors)):
        L, w, C = sg(L), sg(means[q]), sg(chols[q])
        d = w.shape[0]
        Vw = C @ C.T + jnp.outer(w, w) - jnp.eye(d, dtype=C.dtype)  # V + w wᵀ − I
        Y = solve_triangular(L, Vw, lower=True, trans="T")  # L⁻ᵀ (V + w wᵀ − I)
        B = solve_triangular(L, Y.T, lower=True, trans="T")  # … L⁻¹ (the middle factor is symmetric)
        z = solve_triangular(L, w, lower=True, trans="T")  # K⁻¹ (m_f − μ) = L⁻ᵀ w
        K = lat.kernel(X, X)
        s = jitter_scale(K)
        K_eff = K + sg(nugget / s) * s * jnp.eye(d, dtype=K.dtype)  # the factor's jitter multiplier, frozen
        out = out + 0.5 * jnp.sum(B * K_eff) + lat.mean * jnp.sum(z)
    if likelihood:
        fixed = sg(model).replace(likelihood=model.likelihood)
        out = out + expected_in_hyperparameters(fixed, sg(prior), chunks, state, blocks,
                                                None if proj is None else sg(proj))
    return out


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
    at the current parameters, held fixed).  One latent function; the chunks in memory.
    """
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
    Z, lik = jnp.asarray(model.inducing), model.likelihood

    @jax.checkpoint
    def chunk_E(ch):
        Kzx = model.kernel.inducing_cross(Z, ch.X)
        m = model.mean + ch.offset + Kzx.T @ alpha
        v = model.kernel.diag(ch.X) - jnp.sum(Kzx * (B @ Kzx), axis=0)
        E = lik.expected_log_prob(ch.y, m, v)
        return jnp.sum(jnp.where(ch.mask > 0, E, 0.0))

    sE, _ = jax.lax.scan(lambda s, ch: (s + chunk_E(ch), None), jnp.zeros(()), chunks)
    return sE - kl


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
    :func:`_sums`."""
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


@partial(jax.jit, static_argnames=("blocks", "want_hessian", "clip_gamma"))
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


def minibatch_vlb(model, batch: Chunks, state: State, scale, blocks: int = 1, prior=None, proj=None):
    """``scale·Σ_b E_i − KL``: the minibatch estimate of the VLB, differentiable in ``state`` and,
    when ``prior`` is None (the prior factorisation is then recomputed), in the model's
    parameters (not jitted: callers jit it inside their own step).  ``proj`` reuses the batch's
    projections (:func:`minibatch_projection`)."""
    if prior is None and proj is None:
        prior = model.prior_cache(batch.X)
    W = stacked_state(state)
    pcache = model.pass_cache(prior) if proj is None else None

    def chunk_E(ch, pr=None):
        A, b, c = minibatch_projection(model, prior, ch, blocks, pcache) if pr is None else pr
        m, v = marginals_stacked(A, b, c, ch.offset, W)
        return jnp.sum(jnp.where(ch.mask > 0, model.likelihood.expected_log_prob(ch.y, m, v), 0.0))

    if proj is not None or batch.mask.shape[0] <= DEFAULT_CHUNK:
        sE = chunk_E(batch, proj)
    else:
        sE, _ = jax.lax.scan(lambda acc, ch: (acc + chunk_E(ch), None), jnp.zeros(()), split_batch(batch))
    return scale * sE - kl_standard_normal(state.mean, state.chol)
