"""Warped Gaussian likelihood (Snelson, Rasmussen & Ghahramani 2004), as used by Nguyen & Bonilla
(2014, Table 1 and §4.2).

The observations are warped by a monotone map into a space where a GP with Gaussian noise fits:

    t(y) = y + Σ_j a_j tanh(b_j (y + c_j)),   a_j, b_j > 0,

    p(y | f) = t'(y) N(t(y) | f, σ²),   t'(y) = 1 + Σ_j a_j b_j (1 − tanh²(b_j (y + c_j))).

``t'(y) ≥ 1``, so ``t`` is strictly increasing (monotone) exactly when all ``a_j, b_j > 0``; other
values are rejected.  The Jacobian term ``log t'(y)`` does not depend on ``f``, so the Gaussian
expectation, ρ and λ are those of the Gaussian likelihood at the warped target ``z = t(y)`` plus
``log t'(y)``: closed forms, and the fixed-point engines apply unchanged.  The warping parameters
``a, b, c`` are learnable with the others (``likelihood.a`` …) or fixed by leaving them out of
``learn_hyperparameters`` (the paper fixed them).

Predictions are in the original ``y`` space: with ``z ~ N(m, v + σ²)`` the predictive density is
``t'(y) N(t(y) | m, v + σ²)``; its mean and variance are ``E[t⁻¹(z)]`` and ``Var[t⁻¹(z)]`` by
Gauss–Hermite, with ``t⁻¹`` by bisection (``t(y) − y`` lies within ``±Σ a_j``, so the root is
bracketed); :meth:`Warped.predict_median` gives ``t⁻¹(m)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._module import is_tracer, param, positional
from gpvi.likelihoods.base import LOG2PI, Likelihood
from gpvi.likelihoods.scalar import Gaussian
from gpvi.likelihoods.quadrature import gauss_hermite

__all__ = ["Warped"]

_BISECTIONS = 64  # bracket width 2Σa → 2Σa·2⁻⁶⁴, below float64 resolution


class Warped(Likelihood):
    """``p(y|f) = t'(y) N(t(y) | f, σ²)`` with the tanh-sum warping ``t`` (see module docstring).

    Parameters
    ----------
    likelihood : a :class:`~gpvi.likelihoods.Gaussian` (its ``variance`` is σ²; learnable).
    a, b : (I,) positive arrays (amplitudes and slopes of the I tanh terms); learnable.
    c : (I,) real array (offsets); learnable.
    """

    likelihood: Likelihood = positional(kind=Likelihood)
    a: object = param("positive", (1.0,), domain=None, shape="vector")
    b: object = param("positive", (1.0,), domain=None, shape="vector")
    c: object = param("real", (0.0,), domain=None, shape="vector")

    def __post_init__(self):
        if not isinstance(self.likelihood, Gaussian):
            raise ValueError("Warped: likelihood must be a gpvi Gaussian likelihood (the warped GP of "
                             f"Snelson et al.), got {type(self.likelihood).__name__}")
        vals = {}
        for name in ("a", "b", "c"):
            v = getattr(self, name)
            if isinstance(v, tuple):
                v = np.asarray(v, dtype=np.float64)
                object.__setattr__(self, name, v)
            vals[name] = v
        if any(is_tracer(v) for v in vals.values()):
            return
        arr = {k: np.asarray(v, dtype=np.float64) for k, v in vals.items()}
        sizes = {k: a.shape for k, a in arr.items()}
        if len(set(sizes.values())) != 1 or arr["a"].ndim != 1:
            raise ValueError(f"Warped: a, b and c must be 1-D arrays of one length (one entry per tanh "
                             f"term), got shapes {sizes}")
        for k, v in arr.items():
            if not np.all(np.isfinite(v)):
                raise ValueError(f"Warped: {k} must be finite, got {v}")
        for k in ("a", "b"):
            if not np.all(arr[k] > 0):
                raise ValueError(f"Warped: {k} must be > 0 elementwise so that the warping t(y) = y + "
                                 f"Σ a tanh(b (y + c)) is monotone (increasing), got {k} = {arr[k]}")

    # ---- the warping -----------------------------------------------------------------------
    def _terms(self, y):
        a, b, c = (jnp.asarray(p) for p in (self.a, self.b, self.c))
        return a, b, jnp.tanh(b * (y[..., None] + c))

    def warp(self, y):
        """``t(y)`` elementwise."""
        a, _, th = self._terms(y)
        return y + jnp.sum(a * th, axis=-1)

    def log_jacobian(self, y):
        """``log t'(y)`` elementwise (``t' ≥ 1``)."""
        a, b, th = self._terms(y)
        return jnp.log1p(jnp.sum(a * b * (1.0 - th * th), axis=-1))

    def unwarp(self, z):
        """``t⁻¹(z)`` elementwise, by bisection on the bracket ``z ± Σ a_j``."""
        span = jnp.sum(jnp.asarray(self.a))
        lo, hi = z - span - 1e-12, z + span + 1e-12

        def body(_, lh):
            lo, hi = lh
            mid = 0.5 * (lo + hi)
            above = self.warp(mid) > z
            return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

        lo, hi = jax.lax.fori_loop(0, _BISECTIONS, body, (lo, hi))
        return 0.5 * (lo + hi)

    # ---- the likelihood --------------------------------------------------------------------
    def log_prob(self, y, f):
        return self.log_jacobian(y) + self.likelihood.log_prob(self.warp(y), f)

    def expected_log_prob(self, y, m, v):
        return self.log_jacobian(y) + self.likelihood.expected_log_prob(self.warp(y), m, v)

    def variational_moments(self, y, m, v):
        E, rho, lam = self.likelihood.variational_moments(self.warp(y), m, v)
        return E + self.log_jacobian(y), rho, lam

    # ---- predictions in y space ------------------------------------------------------------
    def predictive_log_density(self, y, m, v):
        s = v + self.likelihood.variance
        z = self.warp(y)
        return self.log_jacobian(y) - 0.5 * (LOG2PI + jnp.log(s) + (z - m) ** 2 / s)

    def predict_mean_and_var(self, m, v):
        z, w = gauss_hermite(self.quadrature_points)
        s = jnp.sqrt(v + self.likelihood.variance)
        yk = self.unwarp(m[..., None] + s[..., None] * z)
        mean = jnp.sum(w * yk, axis=-1)
        return mean, jnp.maximum(jnp.sum(w * (yk - mean[..., None]) ** 2, axis=-1), 0.0)

    def predict_median(self, m, v):
        """Predictive median of y, ``t⁻¹(m)`` (the warping is monotone)."""
        return self.unwarp(m)

    def conditional_mean(self, f):
        return self.predict_mean_and_var(f, jnp.zeros_like(f))[0]

    def conditional_variance(self, f):
        return self.predict_mean_and_var(f, jnp.zeros_like(f))[1]
