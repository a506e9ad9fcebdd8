"""Lower-triangular matrix helpers shared by the models, the objective and the engines.

Products with one or two lower-triangular factors that read only the lower triangles and skip
the zero blocks, and the inverse of a lower-triangular factor by 2×2 blocks.  Every factor in
gpvi (of K(Z, Z), of the covariance V, of the fixed-point precision H) goes through these, so
each operation has one implementation with one measured strategy.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = ["LOWER_LEAF", "lower_matmul", "lower_gram", "lower_left_matmul", "lower_right_matmul", "tri_inv"]


# ---- products of lower-triangular factors ----------------------------------------------------
# Square products of two lower-triangular (d, d) factors skip the zero blocks by 2×2 recursion:
# about a third of the dense product's flops, in matrix products XLA runs at full speed down to
# leaves of LOWER_LEAF rows (three factors of d = 1233 on the 2-core AMD EPYC: T·chol 149 → 73 ms,
# C Cᵀ 146 → 89 ms; leaves of 128–400 rows all within 20 %).
LOWER_LEAF = 256


def lower_matmul(A, B, leaf: int = LOWER_LEAF):
    """``A @ B`` of lower-triangular ``A`` (…, d, d) and ``B`` (…, d, d), batch axes broadcast;
    only the lower triangles are read, and the product is lower triangular."""
    d = A.shape[-1]
    if d <= leaf:
        return jnp.matmul(jnp.tril(A), jnp.tril(B))
    h = d // 2
    C11 = lower_matmul(A[..., :h, :h], B[..., :h, :h], leaf)
    C22 = lower_matmul(A[..., h:, h:], B[..., h:, h:], leaf)
    C21 = jnp.matmul(A[..., h:, :h], jnp.tril(B[..., :h, :h])) + jnp.matmul(jnp.tril(A[..., h:, h:]), B[..., h:, :h])
    top = jnp.concatenate([C11, jnp.zeros(C11.shape[:-1] + (d - h,), C11.dtype)], -1)
    return jnp.concatenate([top, jnp.concatenate([C21, C22], -1)], -2)


def lower_gram(C, leaf: int = LOWER_LEAF):
    """``C @ Cᵀ`` of a lower-triangular ``C`` (…, d, d), reading only its lower triangle."""
    d = C.shape[-1]
    if d <= leaf:
        C = jnp.tril(C)
        return jnp.matmul(C, jnp.swapaxes(C, -1, -2))
    h = d // 2
    A, B, D = C[..., :h, :h], C[..., h:, :h], C[..., h:, h:]
    G21 = jnp.matmul(B, jnp.swapaxes(jnp.tril(A), -1, -2))
    G22 = jnp.matmul(B, jnp.swapaxes(B, -1, -2)) + lower_gram(D, leaf)
    return jnp.concatenate([jnp.concatenate([lower_gram(A, leaf), jnp.swapaxes(G21, -1, -2)], -1),
                            jnp.concatenate([G21, G22], -1)], -2)


def lower_left_matmul(L, B, leaf: int = LOWER_LEAF):
    """``L @ B`` of a lower-triangular ``L`` (d, d) and a full ``B`` (d, n), reading only the
    lower triangle of ``L``: half the dense product's flops, by halving ``L`` down to ``leaf`` rows."""
    d = L.shape[-1]
    if d <= leaf:
        return jnp.tril(L) @ B
    h = d // 2
    top = lower_left_matmul(L[:h, :h], B[:h], leaf)
    bottom = L[h:, :h] @ B[:h] + lower_left_matmul(L[h:, h:], B[h:], leaf)
    return jnp.concatenate([top, bottom], 0)


def lower_right_matmul(B, L, leaf: int = LOWER_LEAF):
    """``B @ L`` of a full ``B`` (n, d) and a lower-triangular ``L`` (d, d), reading only the
    lower triangle of ``L`` (as :func:`lower_left_matmul`)."""
    d = L.shape[-1]
    if d <= leaf:
        return B @ jnp.tril(L)
    h = d // 2
    left = lower_right_matmul(B[:, :h], L[:h, :h], leaf) + B[:, h:] @ L[h:, :h]
    return jnp.concatenate([left, lower_right_matmul(B[:, h:], L[h:, h:], leaf)], 1)


# Leaves of tri_inv's recursion: at most this many rows, inverted by one triangular solve; its
# off-diagonal products skip the zero halves of the triangular factors down to blocks of
# _TRI_INV_PRODUCT_LEAF rows.  Each level adds compilation (slices, products and a concatenation
# of new shapes) in every program that inverts a factor, so the recursion stops early.  Measured on
# the 2-core AMD EPYC (jax 0.10.2, median of alternating runs, compilation of tri_inv alone in a
# lax.map over three latents), against leaves of 64 rows with dense products:
# d = 1233: 89 against 105 ms, compiled in 0.64 against 1.35 s; d = 2500: 520 against 619 ms,
# 1.1 against 2.3 s; d = 600: 14.4 against 12.4 ms, 0.27 against 0.68 s; d = 150: 0.4 against
# 0.3 ms, 0.11 against 0.29 s.  Leaves of 32 rows ran fastest at d = 1233 (76 ms) but compiled in
# 2.1 s; one solve of the whole factor compiled in 0.17 s and ran in 122 ms.
_TRI_INV_LEAF, _TRI_INV_PRODUCT_LEAF = 320, 160


def tri_inv(R):
    """Inverse of the lower-triangular ``R`` (d, d), itself lower triangular (exact zeros above
    the diagonal).

    By 2×2 blocks, ``[[A, 0], [C, D]]⁻¹ = [[A⁻¹, 0], [−D⁻¹ C A⁻¹, D⁻¹]]``, recursing down to
    leaves of at most 320 rows solved against the identity; the off-diagonal products read only
    the triangles of ``A⁻¹`` and ``D⁻¹`` (:func:`lower_right_matmul`,
    :func:`lower_left_matmul`).  NaN in, NaN out.
    """
    d = R.shape[0]
    if d <= _TRI_INV_LEAF:
        return solve_triangular(R, jnp.eye(d, dtype=R.dtype), lower=True)
    h = d // 2
    A, D = tri_inv(R[:h, :h]), tri_inv(R[h:, h:])
    CA = lower_right_matmul(R[h:, :h], A, _TRI_INV_PRODUCT_LEAF)
    return jnp.block([[A, jnp.zeros((h, d - h), R.dtype)], [-lower_left_matmul(D, CA, _TRI_INV_PRODUCT_LEAF), D]])
