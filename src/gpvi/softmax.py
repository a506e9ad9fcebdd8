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

    def _at_nodes(self, y, m, v):
        """``E`` and the unnormalised softmax ``e^{f_c − max}`` with its total at the nodes,
        class by class over (…, P) arrays: on XLA:CPU the same sums over (n, P, C) arrays (a
        reduction over a minor axis of length C) took 3× longer (USPS, n = 1233, C = 3,
        P = 1000: 6 against 21 ms for E; 21 against 40 ms for the moments and 27 against
        134 ms with ``h`` by automatic differentiation)."""
        Z, W = self._nodes()
        s = jnp.sqrt(v)
        fs = [m[..., c, None] + s[..., c, None] * Z[:, c] for c in range(self.num_classes)]  # (…, P)
        mx = fs[0]
        for f in fs[1:]:
            mx = jnp.maximum(mx, f)
        es = [jnp.exp(f - mx) for f in fs]
        tot = sum(es[1:], es[0])
        idx = jnp.asarray(y).astype(jnp.int32)
        E = jnp.take_along_axis(m, idx[..., None], axis=-1)[..., 0] - (mx + jnp.log(tot)) @ W
        return E, es, tot

    def expected_log_prob(self, y, m, v):
        return self._at_nodes(y, m, v)[0]

    def _moments(self, y, m, v, hessians: bool):
        """``(E, ρ, λ)``, and ``h`` with ``hessians``, from one softmax ``π`` at the nodes."""
        Z, W = self._nodes()
        C = self.num_classes
        E, es, tot = self._at_nodes(y, m, v)
        ps = [e / tot for e in es]
        Ep = jnp.stack([p @ W for p in ps], axis=-1)
        lam = -jnp.stack([p @ (Z[:, c] * W) for c, p in enumerate(ps)], axis=-1) / jnp.sqrt(v)
        rho = (jnp.arange(C) == jnp.asarray(y).astype(jnp.int32)[..., None]).astype(m.dtype) - Ep
        if not hessians:
            return E, rho, lam
        pw = [p * W for p in ps]
        Epp = {(q, r): jnp.sum(pw[q] * ps[r], axis=-1) for q in range(C) for r in range(q, C)}
        h = jnp.stack([jnp.stack([Epp[min(q, r), max(q, r)] for r in range(C)], -1) for q in range(C)], -2)
        return E, rho, lam, h - Ep[..., None] * jnp.eye(C, dtype=m.dtype)

    def variational_moments(self, y, m, v):
        """``(E, ρ, λ)`` in closed form: the exact derivatives of the product rule of
        :meth:`expected_log_prob` (``∂ lse/∂f = π``, the softmax at each node), so they agree
        with automatic differentiation of it to rounding, without a backward pass:

            ρ_c = [y = c] − Σ_p w_p π_pc,      λ_c = 2 ∂E/∂v_c = −Σ_p w_p π_pc z_pc / √v_c.
        """
        return self._moments(y, m, v, hessians=False)

    def moments_and_mean_hessians(self, y, m, v):
        """As :meth:`variational_moments`, with each row's curvature in the means,
        ``h = −Σ_p w_p (diag π_p − π_p π_pᵀ)`` (n, C, C): the exact second derivative of the
        product rule, from the same softmax at the nodes."""
        return self._moments(y, m, v, hessians=True)

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
