"""Gauss–Hermite expectations under univariate Gaussians, and their product rule over a few
independent latents.

``gauss_hermite(n)`` returns nodes ``z`` and weights ``w`` with
``E_{N(0,1)}[g(z)] ≈ Σ_k w_k g(z_k)``, exact for polynomials of degree ≤ 2n−1.
:func:`expect_product` takes the tensor product of such rules over the last axis of ``m, v``
(the Q latents of one row, independent under q): ``n^Q`` points, so only for a few latents
(:data:`PRODUCT_MAX_POINTS`).
"""
from __future__ import annotations

from functools import lru_cache

import jax.numpy as jnp
import numpy as np

__all__ = ["gauss_hermite", "hermite_nodes", "expect", "expect_product", "product_order", "product_rule", "PRODUCT_MAX_POINTS"]


@lru_cache(maxsize=32)
def hermite_nodes(n: int):
    """Gauss–Hermite nodes and weights for N(0, 1) as NumPy arrays (cached; see :func:`gauss_hermite`)."""
    if n < 1:
        raise ValueError(f"quadrature needs at least one point, got {n}")
    # numpy's hermgauss integrates against exp(-x^2); rescale to the standard normal.
    x, w = np.polynomial.hermite.hermgauss(n)
    # exactly mirror-symmetric (hermgauss already is): Bernoulli's moments pair mirrored nodes
    x, w = 0.5 * (x - x[::-1]), 0.5 * (w + w[::-1])
    return x * np.sqrt(2.0), w / np.sqrt(np.pi)


def gauss_hermite(n: int = 20):
    """Nodes and weights (each shape (n,)) for expectations under N(0, 1)."""
    z, w = hermite_nodes(int(n))
    return jnp.asarray(z), jnp.asarray(w)


def expect(g, m, v, n: int = 20):
    """``E_{N(f | m, v)}[g(f)]`` elementwise over the shapes of ``m`` and ``v``.

    ``g`` maps an array of f values to an array of the same shape (it is called on an
    array with a trailing axis of length ``n``).
    """
    z, w = gauss_hermite(n)
    f = m[..., None] + jnp.sqrt(v)[..., None] * z
    return jnp.sum(w * g(f), axis=-1)


#: Most points of a product rule (:func:`product_order`): 20² for two latents, 10³ for three.
PRODUCT_MAX_POINTS = 1000


def product_order(num_latents: int, n: int = 20) -> int:
    """Points per latent of the product rule over ``num_latents`` latents: ``n``, lowered until
    ``n^Q ≤ PRODUCT_MAX_POINTS``; a ``ValueError`` below 5 points per latent (Q ≥ 5), where a
    product rule is too coarse or too large."""
    Q = int(num_latents)
    k = int(n)
    while k > 1 and k ** Q > PRODUCT_MAX_POINTS:
        k -= 1
    if k < 5:
        raise ValueError(f"a likelihood with {Q} latents per row needs its own expected_log_prob (or "
                         "variational_moments): the default Gauss–Hermite product rule would need "
                         f"{n}^{Q} points; wrap it in gpvi.MonteCarlo(...) for Monte Carlo expectations")
    return k


def expect_product(g, m, v, n: int):
    """``E[g(f)]`` with ``f ~ N(m, diag v)`` per row, ``m, v`` of shape (..., Q): the tensor
    product of ``n``-point Gauss–Hermite rules.  ``g`` is called on f of shape (..., n^Q, Q)
    and returns (..., n^Q)."""
    Z, W = product_rule(m.shape[-1], n)
    f = m[..., None, :] + jnp.sqrt(v)[..., None, :] * jnp.asarray(Z)
    return jnp.sum(jnp.asarray(W) * g(f), axis=-1)


@lru_cache(maxsize=32)
def product_rule(num_latents: int, n: int):
    """Nodes (n^Q, Q) and weights (n^Q,) of the product of ``n``-point rules over Q = ``num_latents``
    independent standard normals (NumPy arrays, cached)."""
    z, w = hermite_nodes(int(n))
    Q = int(num_latents)
    Z = np.stack([a.reshape(-1) for a in np.meshgrid(*([z] * Q), indexing="ij")], axis=-1)
    W = np.prod(np.stack([a.reshape(-1) for a in np.meshgrid(*([w] * Q), indexing="ij")], axis=-1), axis=-1)
    return Z, W
