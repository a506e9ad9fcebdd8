"""The heteroscedastic Gaussian likelihood: input-dependent noise from a second latent function.

Two latent values per row, ``f = (f, g)``: the mean ``f`` and the log noise *scale* ``g``,

    y ~ N(f, exp(2 g)),      log p(y | f, g) = −½ log 2π − g − ½ (y − f)² e^{−2g}

(GPflow's and GPJax's ``HeteroscedasticGaussian`` with an exponential link on the scale).  Under
the factorised posterior of :class:`gpvi.models.multilatent.MultiLatent` each row's marginals
are independent, ``q(f) = N(m_f, v_f)`` and ``q(g) = N(m_g, v_g)``, and every quantity the
engines need has a closed form (``r = y − m_f``, ``s = r² + v_f``, ``a = E[e^{−2g}] =
exp(−2 m_g + 2 v_g)``):

- ``E = E_q[log p] = −½ log 2π − m_g − ½ s a``;
- ``ρ = ∂E/∂m = (r a, s a − 1)`` and ``λ = 2 ∂E/∂v = (−a, −2 s a)`` (both λ ≤ 0, so the
  per-latent precisions of the fixed-point engines stay positive definite);
- the curvature in the means that couples the two latents (used by the fixed-point engine's
  joint Newton direction, :func:`gpvi.objective.coupled_direction`):
  ``h = ∂²E/∂m∂mᵀ = [[−a, −2 r a], [−2 r a, −2 s a]]``.  It is *not* negative definite in
  general (``det h = 2 a² (v_f − r²)``): ``log p`` is not jointly concave in ``(f, g)``, and the
  engines' safeguards handle directions without positive curvature.

Predictions (``y`` at a new input, ``f, g`` from the posterior marginals):

- ``E[y] = m_f`` and ``Var[y] = v_f + E[e^{2g}] = v_f + exp(2 m_g + 2 v_g)`` (law of total
  variance, closed form);
- the predictive density ``p(y) = ∫ N(y | m_f, v_f + e^{2g}) N(g | m_g, v_g) dg``: ``f`` is
  integrated out exactly, ``g`` by a one-dimensional Gauss–Hermite rule in log space
  (``quadrature_points`` nodes; against adaptive quadrature the default 20 were within 3e-7
  nats, 40 within 4e-11, 60 to rounding; there is no closed form — the marginal is a scale
  mixture of normals).  The base class's product rule over ``(f, g)`` was off by up to 0.13
  nats, as ``N(y | f, e^{2g})`` can be too narrow in ``f`` for nodes placed by ``q(f)``.

Wrapped in :class:`gpvi.MonteCarlo` the expectations are sampled from ``log_prob`` instead;
predictions are delegated to this class.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from gpvi.likelihoods.base import LOG2PI, Likelihood
from gpvi.likelihoods.quadrature import gauss_hermite

__all__ = ["HeteroscedasticGaussian"]


class HeteroscedasticGaussian(Likelihood):
    """``y ~ N(f, exp(2 g))``: two latent functions per row, the mean ``f`` (latent 0) and the log
    noise standard deviation ``g`` (latent 1); see :mod:`gpvi.likelihoods.heteroscedastic` for the
    closed forms.  No parameters of its own (the noise level is the second latent function: give
    its GP a constant prior mean near ``log`` of the typical noise s.d.).

    Build a model as ``gpvi.MultiLatent.full([kernel_f, kernel_g], HeteroscedasticGaussian(),
    mean=[0.0, log_noise_sd])`` (or ``.sparse``); ``predict_y`` gives ``(m_f, v_f + exp(2 m_g + 2 v_g))``.
    """

    #: the latent function that is the log noise standard deviation (the front ends' default
    #: hyperprior puts its noise prior on that latent's GP; :func:`gpvi.priors.weak`)
    noise_latent = 1

    @property
    def num_latents(self) -> int:
        return 2

    # ---- the model -----------------------------------------------------------------------
    def log_prob(self, y, f):
        """``log N(y | f₀, exp(2 f₁))`` for ``y`` (…) and latents ``f`` (…, 2)."""
        mu, g = f[..., 0], f[..., 1]
        return -0.5 * LOG2PI - g - 0.5 * ((y - mu) * jnp.exp(-g)) ** 2

    def conditional_mean(self, f):
        return f[..., 0]

    def conditional_variance(self, f):
        return jnp.exp(2.0 * f[..., 1])

    # ---- closed-form expectations under q(f) = N(m_f, v_f), q(g) = N(m_g, v_g) ----------------
    @staticmethod
    def _terms(y, m, v):
        r = y - m[..., 0]
        s = r * r + v[..., 0]
        a = jnp.exp(-2.0 * m[..., 1] + 2.0 * v[..., 1])  # E[e^{−2g}]
        return r, s, a

    def expected_log_prob(self, y, m, v):
        """``E_q[log p(y|f,g)] = −½ log 2π − m_g − ½ ((y − m_f)² + v_f) exp(−2 m_g + 2 v_g)``,
        ``m, v`` of shape (…, 2)."""
        _, s, a = self._terms(y, m, v)
        return -0.5 * LOG2PI - m[..., 1] - 0.5 * s * a

    def variational_moments(self, y, m, v):
        """``(E, ρ, λ)``: ``ρ = (r a, s a − 1)``, ``λ = 2 ∂E/∂v = (−a, −2 s a)`` (the exact
        derivatives of :meth:`expected_log_prob`)."""
        E, rho, lam, _ = self._moments(y, m, v)
        return E, rho, lam

    def moments_and_mean_hessians(self, y, m, v):
        """As :meth:`variational_moments`, with ``h = [[−a, −2ra], [−2ra, −2sa]]`` (n, 2, 2)."""
        return self._moments(y, m, v)

    def _moments(self, y, m, v):
        r, s, a = self._terms(y, m, v)
        E = -0.5 * LOG2PI - m[..., 1] - 0.5 * s * a
        ra, sa = r * a, s * a
        rho = jnp.stack([ra, sa - 1.0], axis=-1)
        lam = jnp.stack([-a, -2.0 * sa], axis=-1)
        h = jnp.stack([jnp.stack([-a, -2.0 * ra], axis=-1), jnp.stack([-2.0 * ra, -2.0 * sa], axis=-1)], axis=-2)
        return E, rho, lam, h

    # ---- predictions -------------------------------------------------------------------------
    def predict_mean_and_var(self, m, v):
        """``(m_f, v_f + exp(2 m_g + 2 v_g))``: the predictive mean and variance of ``y``."""
        return m[..., 0], v[..., 0] + jnp.exp(2.0 * m[..., 1] + 2.0 * v[..., 1])

    def predictive_log_density(self, y, m, v):
        """``log ∫ N(y | m_f, v_f + e^{2g}) N(g | m_g, v_g) dg``: ``f`` integrated exactly, ``g``
        by ``quadrature_points``-node Gauss–Hermite (logsumexp over the nodes)."""
        z, w = gauss_hermite(self.quadrature_points)
        g = m[..., 1, None] + jnp.sqrt(v[..., 1])[..., None] * z
        s2 = v[..., 0, None] + jnp.exp(2.0 * g)
        r = jnp.asarray(y)[..., None] - m[..., 0, None]
        lp = -0.5 * (LOG2PI + jnp.log(s2) + r * r / s2)
        return jax.scipy.special.logsumexp(lp + jnp.log(w), axis=-1)

