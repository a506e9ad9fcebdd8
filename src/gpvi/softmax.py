"""Likelihoods with several latent values per row, and the softmax (multiclass) likelihood.

A likelihood with ``num_latents = Q > 1`` sees, per row, the Q latent values
``f_i = (f_i1, …, f_iQ)``; under the factorised posterior of :class:`gpvi.multilatent.MultiLatent`
their marginal is ``N(m_i, diag(v_i))``.  Its methods take ``m, v`` of shape (n, Q) and
:meth:`~gpvi.likelihoods.Likelihood.variational_moments` returns ``E`` (n,) and ``ρ, λ`` (n, Q),
``ρ_iq = ∂E_i/∂m_iq`` and ``λ_iq = 2 ∂E_i/∂v_iq`` — per latent, which is all a factorised q
needs (Nguyen & Bonilla 2014, §3.2: "q_k(n) has a diagonal covariance").

The Gaussian expectation is by product Gauss–Hermite quadrature (:func:`product_nodes`), or by
Monte Carlo when wrapped in :class:`gpvi.MonteCarlo`.
"""
from __future__ import annotations

import itertools
import numbers
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from ._module import static
from .likelihoods import Likelihood, _finite_1d
from .quadrature import _nodes as _gh_nodes

__all__ = ["Softmax", "product_nodes", "PRODUCT_NODES_BUDGET"]

#: Most nodes of a product rule by default: ``quadrature_points`` per latent, lowered so that
#: the product stays within this many (Q = 2: 20 × 20; Q = 3: 10³; Q = 4: 5⁴).
PRODUCT_NODES_BUDGET = 1000


def points_per_latent(n: int, Q: int) -> int:
    """Gauss–Hermite points per latent of the default product rule for Q latents."""
    if Q == 1:
        return n
    return max(2, min(n, int(np.floor(PRODUCT_NODES_BUDGET ** (1.0 / Q) + 1e-9))))


@lru_cache(maxsize=32)
def _product(n: int, Q: int):
    z, w = _gh_nodes(n)
    Z = np.array(list(itertools.product(z, repeat=Q)))
    W = np.prod(np.array(list(itertools.product(w, repeat=Q))), axis=1)
    return Z, W


def product_nodes(n: int, Q: int):
    """Nodes (n^Q, Q) and weights (n^Q,) of the product Gauss–Hermite rule for ``N(0, I_Q)``."""
    Z, W = _product(int(n), int(Q))
    return jnp.asarray(Z), jnp.asarray(W)


def _check_classes(owner, name, c):
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c < 2:
        raise ValueError(f"{owner}: {name} must be an int ≥ 2 (the number of classes C), got {c!r}")
    return int(c)


class Softmax(Likelihood):
    """Multiclass labels ``y ∈ {0, …, C−1}`` with ``p(y = c | f) = e^{f_c} / Σ_k e^{f_k}``:
    one latent function per class (Q = C), as in Nguyen & Bonilla (2014, Table 1).

    ``E = m_y − E[log Σ_k e^{f_k}]``; the second term by product Gauss–Hermite with
    :func:`points_per_latent` points per class (``quadrature_points`` caps it), or by Monte
    Carlo with ``gpvi.MonteCarlo(Softmax(C), num_samples=S)``.
    """

    num_classes: int = static(None, check=_check_classes)

    @property
    def num_latents(self) -> int:
        return self.num_classes

    def validate(self, y):
        y = _finite_1d(y).astype(np.float64)
        bad = (y < 0) | (y > self.num_classes - 1) | (y != np.round(y))
        if np.any(bad):
            raise ValueError(f"y has labels {np.unique(y[bad])[:5].tolist()} outside 0..{self.num_classes - 1} "
                             f"(Softmax with num_classes={self.num_classes} needs integer labels 0..C−1)")
        return y

    def log_prob(self, y, f):
        """``log p(y | f)`` for labels ``y`` (…) and latents ``f`` (…, C)."""
        idx = jnp.asarray(y).astype(jnp.int32)
        fy = jnp.take_along_axis(f, idx[..., None], axis=-1)[..., 0]
        return fy - jax.scipy.special.logsumexp(f, axis=-1)

    def _nodes(self):
        return product_nodes(points_per_latent(self.quadrature_points, self.num_classes), self.num_classes)

    def _latents(self, m, v):
        """``f`` at the product nodes: (n, P, C)."""
        Z, _ = self._nodes()
        return m[..., None, :] + jnp.sqrt(v)[..., None, :] * Z

    def expected_log_prob(self, y, m, v):
        _, W = self._nodes()
        lse = jax.scipy.special.logsumexp(self._latents(m, v), axis=-1)
        idx = jnp.asarray(y).astype(jnp.int32)
        return jnp.take_along_axis(m, idx[..., None], axis=-1)[..., 0] - lse @ W

    def predict_proba(self, m, v):
        """Predictive class probabilities ``E[softmax(f)]`` (n, C) under ``f ~ N(m, diag v)``."""
        _, W = self._nodes()
        return jnp.einsum("npc,p->nc", jax.nn.softmax(self._latents(m, v), axis=-1), W)

    def predict_mean_and_var(self, m, v):
        p = self.predict_proba(m, v)
        return p, p * (1.0 - p)

    def predictive_log_density(self, y, m, v):
        _, W = self._nodes()
        lp = self.log_prob(jnp.asarray(y)[..., None], self._latents(m, v))
        return jax.scipy.special.logsumexp(lp + jnp.log(W), axis=-1)

    def decode(self, codes):
        return np.asarray(codes).astype(int)
