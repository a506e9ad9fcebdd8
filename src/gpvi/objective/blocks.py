"""Projections kept in row blocks: the products of a pass that skip the zero half of the
triangular covariance factor and the upper half of the symmetric ``Σ λ_i a_i a_iᵀ``."""
from __future__ import annotations


import jax
import jax.numpy as jnp


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


# ---- triangular projections: row blocks that keep only their trailing columns ----------------
# The full GP's cached projections are ``At = Lᵀ`` (upper triangular: row k of At is zero in the
# columns of the training rows before k), so row block j is zero in the columns before its first
# row, e_j.  Kept *trimmed* — row block j as its trailing columns only, ``At[e_j:e_{j+1}, e_j:]``
# (:func:`trim_triangular`) — every product below skips those zeros too: with the (upper
# triangular) covariance factor, the marginals then cost about a third of the dense product
# instead of (k+1)/2k, and Σλaaᵀ about the same (three latents of d = n = 1233, four blocks:
# 52 → 26 ms a pass).  Every helper here takes either form: a block narrower than the first one
# (which always spans all n columns) covers the last ``width`` columns ("right-aligned"), and the
# widths never grow from one block to the next.


def trim_triangular(blocks) -> tuple:
    """Row blocks of an upper-triangular ``At`` (d ≤ n, row k zero before column k), each cut
    to the columns from its first row on (see above); the zeros cut off are not read again."""
    out, start = [], 0
    for a in blocks:
        out.append(a[..., start:])
        start += a.shape[-2]
    return tuple(out)


def _pad_left(x, n: int):
    """``x`` (…, w) as (…, n), with zeros in the first n − w columns."""
    w = x.shape[-1]
    if w == n:
        return x
    return jnp.concatenate([jnp.zeros(x.shape[:-1] + (n - w,), x.dtype), x], axis=-1)


def _tail(x, w: int):
    """The last ``w`` entries of ``x`` along its last axis."""
    return x[..., x.shape[-1] - w:]


def assemble_rows(blocks):
    """``At`` (…, d, n) from its row blocks, trimmed or not."""
    n = blocks[0].shape[-1]
    full = [_pad_left(a, n) for a in blocks]
    return jnp.concatenate(full, axis=-2) if len(full) > 1 else full[0]


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
    """``A r`` (d,) for A given as row blocks (trimmed or not) and r (n,)."""
    parts = [a @ _tail(r, a.shape[-1]) for a in blocks]
    return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def block_vecmat(u, blocks):
    """``uᵀ A`` (n,) for u (d,) and A given as row blocks (trimmed or not)."""
    e = block_edges(u.shape[0], len(blocks))
    n = blocks[0].shape[-1]
    return sum(_pad_left(u[e[j]:e[j + 1]] @ a, n) for j, a in enumerate(blocks))


def block_sum_squares(blocks):
    """Column sums of squares ``Σ_k A_ki²`` (n,) of A given as row blocks (trimmed or not)."""
    n = blocks[0].shape[-1]
    return sum(_pad_left(jnp.sum(a * a, axis=0), n) for a in blocks)


def block_gram(blocks, w, r=None):
    """The blocks on and below the diagonal of ``A diag(w) Aᵀ``, row by row (a flat tuple; add
    them up over chunks, then :func:`assemble_gram`).

    With ``r`` (n,), also ``A r`` (d,), returned as ``(blocks, A r)``: ``r`` rides as one more row
    of the last row block's scaled operand, so ``A r`` comes out of the same products instead
    of a separate pass over A (measured: 1–2.5 ms less per pass at d = 200, N = 20 000).
    """
    k = len(blocks)
    if blocks[-1].shape[-1] != blocks[0].shape[-1]:  # trimmed blocks: block i spans its last w_i columns
        out = []
        for i, ai in enumerate(blocks):
            wi = ai.shape[-1]
            aw = ai * _tail(w, wi)
            out.extend(aw @ _tail(blocks[j], wi).T for j in range(i + 1))
        return tuple(out) if r is None else (tuple(out), block_matvec(blocks, r))
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
    n = blocks[0].shape[-1]
    m, v = None, 0.0
    for i in range(k):
        r0 = 0 if i == 0 else e[i] + 1
        wi = blocks[i].shape[-1]  # trimmed blocks: the later ones are narrower (right-aligned)
        z = sum(_pad_left(W[r0:e[i + 1] + 1, e[j]:e[j + 1]] @ blocks[j], wi) for j in range(i, k))
        if i == 0:
            m, z = z[0], z[1:]
        v = v + _pad_left(jnp.sum(z * z, axis=0), n)
    return m + b + off, c + v


def raw_moments(state, T):
    """``(Tᵀ m, D)`` with ``D = Tᵀ(V − I)T`` (d, d), symmetric: the state moved into the basis of
    the raw features ``F`` of a factored model (``At = T F``, see
    :meth:`gpvi.models.Model.raw_features`).  A latent's mean is ``(Tᵀm)ᵀ f_i + b_i`` and its
    variance ``c + a_iᵀ V a_i = k_i − |a_i|² + a_iᵀ V a_i = k_i + f_iᵀ D f_i``.

    ``V − I`` is formed before the products, so its rounding error reaches a variance only as
    ``a_iᵀ E a_i ≤ ε|a_i|² ≤ ε k_i``: the O(|T|²) entries of ``Tᵀ T`` are never subtracted."""
    d = T.shape[0]
    V = state.chol @ state.chol.T
    D = T.T @ ((V - jnp.eye(d, dtype=V.dtype)) @ T)
    return T.T @ state.mean, 0.5 * (D + D.T)


def raw_operator(state, T):
    """``[Tᵀ m; D̃]`` (d+1, d) for :func:`raw_marginals`, with ``D̃`` the lower triangle of ``D``
    of :func:`raw_moments` with its diagonal halved, so that ``fᵀ D f = 2 fᵀ D̃ f``.  Row 0 times
    a chunk's ``F`` gives the latent means."""
    Tm, D = raw_moments(state, T)
    Dt = jnp.tril(D, -1) + 0.5 * jnp.diag(jnp.diag(D))
    return jnp.concatenate([Tm[None], Dt], axis=0)


@jax.custom_jvp
def column_quadratic(D, F):
    """``f_iᵀ D f_i`` for each column ``f_i`` of ``F`` (d, n), ``D`` (d, d) symmetric.

    The tangent ``2 (D f_i)ᵀ ḟ_i + f_iᵀ Ḋ f_i`` reuses ``D F``, so reverse mode costs one more
    (d, n)·(n, d) product (``Ḋ``'s cotangent ``F diag(q̄) Fᵀ``); differentiating
    ``Σ F ∘ (D F)`` as written costs two, and did not use that ``D`` is symmetric (M = 512,
    n = 2048: 35–43 ms against 9–11 ms for the value)."""
    return jnp.sum(F * (D @ F), axis=0)


@column_quadratic.defjvp
def _column_quadratic_jvp(primals, tangents):
    D, F = primals
    dD, dF = tangents
    G = D @ F
    return jnp.sum(F * G, axis=0), 2.0 * jnp.sum(dF * G, axis=0) + jnp.sum(F * (dD @ F), axis=0)


def raw_marginals(blocks, b, k, off, W):
    """Means and variances of one chunk's latents from its raw features ``F`` in row blocks and
    ``W = raw_operator(state, T)``: ``m = (Tᵀ m)ᵀ F``, ``v = k + 2 Σ_rows F ∘ (D̃ F)``.  ``D̃``
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
