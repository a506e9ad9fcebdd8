"""Observation models ``p(y | f)`` and their Gaussian expectations.

A likelihood author writes the maths once, pointwise:

- :meth:`Likelihood.log_prob` ``(y, f) -> log p(y | f)`` is the only required method;
- everything else has a default in the base class: the variational expectation
  ``E = E_{N(f|m,v)}[log p(y|f)]`` by Gauss–Hermite quadrature, and

  ``ρ = ∂E/∂m = E[∂_f log p]``, ``λ = 2 ∂E/∂v = E[∂²_f log p]``

  (Sheth et al. 2015, Eq. 5, 8, 10) by automatic differentiation of ``E``.  Differentiating
  the expectation rather than ``log p`` is what Sheth & Khardon (2016, Eq. 7) and Challis &
  Barber prescribe for likelihoods that are not twice differentiable (Laplace), and it makes
  ρ, λ the exact derivatives of the objective every engine maximises, so fixed-point and
  gradient engines converge to the same optimum.
- subclasses override ``expected_log_prob`` (or ``variational_moments``) where a closed form
  exists: Gaussian, Poisson, Laplace, exponential, stochastic volatility.

``y`` passes through :meth:`Likelihood.validate` (NumPy, outside of JAX) which checks the
support and maps labels to the internal coding, e.g. {0, 1} → {−1, +1} for Bernoulli.
"""
from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._module import Module, static
from gpvi.likelihoods.quadrature import expect, expect_product, gauss_hermite, product_order, product_rule

__all__ = ["Likelihood", "LOG2PI", "as_array", "is_real_dtype", "check_quadrature_points", "finite_1d",
           "mean_hessians_by_autodiff"]

LOG2PI = float(np.log(2.0 * np.pi))


def as_array(a, name):
    """``np.asarray(a)``, with ragged input reported as a ValueError that names ``name``."""
    try:
        return np.asarray(a)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name} must be a rectangular numeric array: {err}") from None


def is_real_dtype(dtype):
    return dtype == bool or (np.issubdtype(dtype, np.number) and not np.issubdtype(dtype, np.complexfloating))


# Gauss–Hermite orders accepted: one node evaluates log p at the mean only, so the bound would
# not depend on the variances at all; beyond 200 nodes NumPy's nodes and weights are no more
# accurate and the cost grows linearly (200 is the reference order of the tests).
QUADRATURE_RANGE = (2, 200)


def check_quadrature_points(owner, name, n):
    lo, hi = QUADRATURE_RANGE
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or not lo <= n <= hi:
        raise ValueError(f"{owner}: {name} must be an int in [{lo}, {hi}], got {n!r}")
    return int(n)


def finite_1d(y, name="y"):
    y = as_array(y, name)
    if y.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of observations, got shape {y.shape}")
    if not is_real_dtype(y.dtype):
        raise ValueError(f"{name} must be numeric (real), got dtype {y.dtype}")
    if not np.all(np.isfinite(y.astype(np.float64))):
        raise ValueError(f"{name} contains NaN or infinite values")
    return y


def mean_hessians_by_autodiff(lik, y, m, v):
    """``∂²E_i/∂m_i∂m_iᵀ`` (n, Q, Q) of ``lik.expected_log_prob`` at rows ``m, v`` (n, Q).
    ``E_i`` depends on row i alone, so the Hessian of ``Σ_i E_i`` is block diagonal and Q
    forward-over-reverse products give every row's block at once (exact for any
    ``expected_log_prob`` written over a chunk, Monte Carlo with common random numbers included).
    """
    grad = jax.grad(lambda mm: jnp.sum(lik.expected_log_prob(y, mm, v)))
    cols = [jax.jvp(grad, (m,), (jnp.zeros_like(m).at[:, q].set(1.0),))[1] for q in range(m.shape[1])]
    return jnp.stack(cols, axis=-1)


class Likelihood(Module):
    """Base class of observation models; see the module docstring for the contract.

    Subclasses are decorated with :func:`gpvi._module.module` and declare their parameters
    with :func:`gpvi._module.param`.  ``quadrature_points`` (a static field of every
    built-in likelihood) sets the Gauss–Hermite order.
    """

    quadrature_points: int = static(20, check=check_quadrature_points)

    def __post_init__(self):
        if type(self) is Likelihood:
            raise ValueError("Likelihood is an abstract base class: use one such as "
                             f"{', '.join(n for n in __all__ if n != 'Likelihood')}, or subclass it")

    # ---- to be given by subclasses -------------------------------------------------------
    def log_prob(self, y, f):
        """``log p(y | f)``, elementwise; ``y`` in the internal coding of :meth:`validate`."""
        raise NotImplementedError(f"{type(self).__name__} must implement log_prob(y, f)")

    def validate(self, y) -> np.ndarray:
        """Check ``y`` (1-D, finite, in the support) and return it as float64 internal codes.

        The default accepts any finite real value.
        """
        return finite_1d(y).astype(np.float64)

    # ---- expectations under N(f | m, v) -----------------------------------------------------
    def _latents(self) -> int:
        return int(getattr(self, "num_latents", 1))

    def _expect(self, g, m, v):
        """``E[g(f)]`` under ``N(m, v)``: one-dimensional Gauss–Hermite for one latent, ``g`` on
        f (..., n); for Q > 1 latents (``m, v`` of shape (..., Q), the rows' latents independent
        under q) the product rule (:func:`~gpvi.likelihoods.quadrature.expect_product`), ``g`` on
        f (..., n^Q, Q)."""
        Q = self._latents()
        if Q == 1:
            return expect(g, m, v, self.quadrature_points)
        return expect_product(g, m, v, product_order(Q, self.quadrature_points))

    def expected_log_prob(self, y, m, v):
        """``E_{N(f|m,v)}[log p(y|f)]`` elementwise; Gauss–Hermite unless overridden.

        A likelihood with ``num_latents = Q > 1`` gets, per row, ``f`` with a last axis of the Q
        latents (as :class:`~gpvi.likelihoods.softmax.Softmax`), and by default the product of
        one-dimensional rules over them (20² points for two latents, 10³ for three; four need
        ``quadrature_points`` ≤ 5 or an override, five or more a ``ValueError`` that suggests
        :class:`~gpvi.likelihoods.montecarlo.MonteCarlo`)."""
        return self._expect(lambda f: self.log_prob(y[..., None], f), m, v)

    def variational_moments(self, y, m, v):
        """``(E, ρ, λ)`` for 1-D arrays ``y, m, v`` of one shape.

        ``ρ = ∂E/∂m``, ``λ = 2 ∂E/∂v``, obtained by autodiff of :meth:`expected_log_prob`.
        """

        def total(m_, v_):
            e = self.expected_log_prob(y, m_, v_)
            return jnp.sum(e), e

        (_, e), (dm, dv) = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(m, v)
        return e, dm, 2.0 * dv

    def moments_and_mean_hessians(self, y, m, v):
        """``(E, ρ, λ, h)`` of a likelihood with Q > 1 latents per row, at rows ``m, v`` (n, Q):
        :meth:`variational_moments` and each row's ``h_i = ∂²E_i/∂m_i∂m_iᵀ`` (n, Q, Q), the
        curvature that couples the latents' means (see :func:`gpvi.objective.coupled_direction`).

        By automatic differentiation of :meth:`expected_log_prob` unless a subclass gives closed
        forms (:class:`gpvi.likelihoods.softmax.Softmax`)."""
        E, rho, lam = self.variational_moments(y, m, v)
        return E, rho, lam, mean_hessians_by_autodiff(self, y, m, v)

    def quadrature_moments(self, y, m, v):
        """``(E, ρ, λ)`` by Gauss–Hermite quadrature of ``log p`` and its first two
        f-derivatives (autodiff).  A reference implementation for checking closed forms;
        only valid for likelihoods twice differentiable in f."""
        n = self.quadrature_points

        def lp(yy, ff):
            return self.log_prob(yy, ff)

        d1 = jax.grad(lp, argnums=1)
        d2 = jax.grad(d1, argnums=1)
        vec = lambda g: jnp.vectorize(g)  # noqa: E731
        yy = y[..., None]
        e = expect(lambda f: lp(yy, f), m, v, n)
        r = expect(lambda f: vec(d1)(jnp.broadcast_to(yy, f.shape), f), m, v, n)
        l = expect(lambda f: vec(d2)(jnp.broadcast_to(yy, f.shape), f), m, v, n)
        return e, r, l

    # ---- predictions ---------------------------------------------------------------------
    def conditional_mean(self, f):
        """``E[y | f]`` (in the user's coding); used for predictive means."""
        raise NotImplementedError(f"{type(self).__name__} does not define conditional_mean")

    def conditional_variance(self, f):
        """``Var[y | f]``; used for predictive variances."""
        raise NotImplementedError(f"{type(self).__name__} does not define conditional_variance")

    def predict_mean_and_var(self, m, v):
        """Predictive mean and variance of y under ``f ~ N(m, v)`` (law of total variance)."""
        mean = self._expect(self.conditional_mean, m, v)
        second = self._expect(lambda f: self.conditional_variance(f) + self.conditional_mean(f) ** 2, m, v)
        return mean, jnp.maximum(second - mean**2, 0.0)

    def class_probabilities(self, m, v):
        """Predictive probability of each class (label) under ``f ~ N(m, v)``: one row per row
        of ``m``.  Likelihoods of labels (Bernoulli, Ordinal, Softmax) define it; for any other
        a ``ValueError``."""
        raise ValueError(f"predict_proba needs a likelihood of class labels (Bernoulli, Ordinal or Softmax), "
                         f"not {type(self).__name__}")

    def predictive_log_density(self, y, m, v):
        """``log ∫ p(y|f) N(f|m, v) df`` elementwise (Gauss–Hermite in log space; the product
        rule over the latents of a likelihood with several)."""
        Q = self._latents()
        if Q > 1:
            Z, W = product_rule(Q, product_order(Q, self.quadrature_points))
            f = m[..., None, :] + jnp.sqrt(v)[..., None, :] * jnp.asarray(Z)
            return jax.scipy.special.logsumexp(self.log_prob(y[..., None], f) + jnp.log(jnp.asarray(W)), axis=-1)
        z, w = gauss_hermite(self.quadrature_points)
        f = m[..., None] + jnp.sqrt(v)[..., None] * z
        return jax.scipy.special.logsumexp(self.log_prob(y[..., None], f) + jnp.log(w), axis=-1)

    def decode(self, codes):
        """Map internal codes (as produced by :meth:`validate`) back to user labels."""
        return codes
