"""Gauss–Hermite expectations under univariate Gaussians.

``gauss_hermite(n)`` returns nodes ``z`` and weights ``w`` with
``E_{N(0,1)}[g(z)] ≈ Σ_k w_k g(z_k)``, exact for polynomials of degree ≤ 2n−1.
"""
from __future__ import annotations

from functools import lru_cache

import jax.numpy as jnp
import numpy as np

__all__ = ["gauss_hermite", "hermite_nodes", "expect"]


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
