"""Quadratic surrogates of the logistic log-likelihood (Izmailov & Kropotov 2017, §4).

Both replace ``log σ(y f)`` (``y = ±1``) by a function that is quadratic in ``f`` for a fixed
per-point parameter ``ξ``:

    ``s(f; ξ) = α(ξ) + β(ξ) f − κ(ξ) f²``,  so  ``E_{N(f|m,v)}[s] = α + β m − κ (m² + v)``.

- **Jaakkola–Jordan** (JJ, a global lower bound, tight at ``f = ±ξ``):
  ``log σ(t) ≥ log σ(ξ) + (t − ξ)/2 − λ(ξ)(t² − ξ²)`` with ``λ(ξ) = tanh(ξ/2)/(4ξ)``
  (the paper prints ``tanh(ξ)``; only ``tanh(ξ/2)`` makes the bound tangent at ``t = ξ``, and
  the tests check the bound pointwise).  With ``t = y f`` and ``y² = 1``:
  ``α = log σ(ξ) − ξ/2 + λ ξ²``, ``β = y/2``, ``κ = λ(ξ)``.  For fixed ``q`` the expectation is
  maximised at ``ξ² = E f² = m² + v`` (``v`` the marginal *variance*; the paper's Eq. 14 writes
  ``S²`` for it and its Algorithm 1 squares the variance again; the authors' code uses
  ``√(m² + v)``, which is the maximiser — tested), where it simplifies to
  ``log σ(ξ) + (y m − ξ)/2``.
- **Taylor** (a local approximation, not a bound): the second-order expansion of ``log σ(y f)``
  at ``ξ`` (Eq. 15): with ``t = y ξ``, ``φ = y σ(−t)``, ``ψ = σ(t) σ(−t)/2``:
  ``α = log σ(t) − φ ξ − ψ ξ²``, ``β = φ + 2ψ ξ``, ``κ = ψ``; the paper expands at ``ξ = m``.

As *likelihood objects* (``JaakkolaJordan``, ``TaylorLogistic``) the surrogates feed the shared
data sums of :mod:`gpvi.objective` unchanged: ``variational_moments(y, m, v)`` returns
``(E, ρ, λ)`` with ξ at its update rule for the marginal ``(m, v)`` and ``ρ = ∂E/∂m``,
``λ = 2 ∂E/∂v`` taken **at that ξ held fixed**.  For JJ that is also the total derivative of
the ξ-maximised expectation (envelope theorem); for Taylor, whose ``ξ = m`` is not a maximiser,
``ρ = ∂ log σ(y f)/∂f`` and ``λ = ∂² log σ(y f)/∂f²`` at ``f = m``, the coefficients of the
expansion.  Since the surrogate is quadratic in ``f`` for fixed ξ, one undamped fixed-point /
Newton step from these sums is the exact maximiser of the surrogate bound over ``q`` for those
ξ (Eqs. 12–13 and 16–17) — the analytic update of :mod:`gpvi.engines.jj`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from gpvi.likelihoods.scalar import Bernoulli
from gpvi.likelihoods.base import Likelihood

__all__ = ["JaakkolaJordan", "TaylorLogistic", "jj_lambda", "jj_coefficients", "taylor_coefficients",
           "quadratic_expectation", "COEFFICIENTS", "SURROGATES", "optimal_xi"]


def jj_lambda(xi):
    """``λ(ξ) = tanh(ξ/2)/(4ξ) = (σ(ξ) − ½)/(2ξ)``, even in ξ, with ``λ(0) = 1/8`` (series
    below |ξ| = 1e-4, where the quotient loses digits)."""
    a = jnp.abs(xi)
    small = a < 1e-4
    safe = jnp.where(small, 1.0, a)
    return jnp.where(small, 0.125 - a * a / 96.0, jnp.tanh(0.5 * safe) / (4.0 * safe))


def jj_coefficients(y, xi):
    """``(α, β, κ)`` of the Jaakkola–Jordan bound at ``ξ`` for labels ``y = ±1`` (same shapes)."""
    lam = jj_lambda(xi)
    alpha = jax.nn.log_sigmoid(xi) - 0.5 * xi + lam * xi * xi
    return alpha, 0.5 * y * jnp.ones_like(xi), lam


def taylor_coefficients(y, xi):
    """``(α, β, κ)`` of the second-order Taylor expansion of ``log σ(y f)`` at ``f = ξ``."""
    t = y * xi
    s_pos, s_neg = jax.nn.sigmoid(t), jax.nn.sigmoid(-t)
    phi = y * s_neg
    psi = 0.5 * s_pos * s_neg
    alpha = jax.nn.log_sigmoid(t) - phi * xi - psi * xi * xi
    return alpha, phi + 2.0 * psi * xi, psi


COEFFICIENTS = {"jj": jj_coefficients, "taylor": taylor_coefficients}


def quadratic_expectation(coef, m, v):
    """``E_{N(f|m,v)}[α + β f − κ f²] = α + β m − κ (m² + v)``."""
    alpha, beta, kappa = coef
    return alpha + beta * m - kappa * (m * m + v)


def optimal_xi(kind: str, m, v):
    """The analytic ξ of each surrogate for marginals ``(m, v)``: ``√(m² + v)`` (JJ, the
    maximiser of the bound) or ``m`` (Taylor, the paper's expansion point)."""
    return jnp.sqrt(m * m + v) if kind == "jj" else m


class _Logistic(Likelihood):
    """Shared by the surrogates: the label coding and ``log_prob`` of Bernoulli(logit)."""

    def validate(self, y):
        return Bernoulli().validate(y)

    def log_prob(self, y, f):
        return jax.nn.log_sigmoid(y * f)

    def decode(self, codes):
        return Bernoulli().decode(codes)


class JaakkolaJordan(_Logistic):
    """Bernoulli(logit) with ``E[log σ(y f)]`` replaced by the Jaakkola–Jordan bound at the
    optimal ``ξ = √(m² + v)``: ``E = log σ(ξ) + (y m − ξ)/2``, ``ρ = y/2 − 2λ(ξ) m``,
    ``λ_gpvi = −2λ(ξ)`` (see the module docstring).  Everywhere at most the Gauss–Hermite
    expectation of the true likelihood."""

    def expected_log_prob(self, y, m, v):
        xi = jnp.sqrt(m * m + v)
        return jax.nn.log_sigmoid(xi) + 0.5 * (y * m - xi)

    def variational_moments(self, y, m, v):
        xi = jnp.sqrt(m * m + v)
        lam = jj_lambda(xi)
        return jax.nn.log_sigmoid(xi) + 0.5 * (y * m - xi), 0.5 * y - 2.0 * lam * m, -2.0 * lam


class TaylorLogistic(_Logistic):
    """Bernoulli(logit) with ``log σ(y f)`` replaced by its second-order expansion at ``f = m``:
    ``E = log σ(y m) − ψ(m) v``, ``ρ = y σ(−y m)``, ``λ_gpvi = −σ(m) σ(−m)`` (the expansion's
    coefficients; not the derivatives of ``E`` in ``m``, since ξ = m is not a maximiser)."""

    def expected_log_prob(self, y, m, v):
        t = y * m
        return jax.nn.log_sigmoid(t) - 0.5 * jax.nn.sigmoid(t) * jax.nn.sigmoid(-t) * v

    def variational_moments(self, y, m, v):
        t = y * m
        s_pos, s_neg = jax.nn.sigmoid(t), jax.nn.sigmoid(-t)
        return jax.nn.log_sigmoid(t) - 0.5 * s_pos * s_neg * v, y * s_neg, -s_pos * s_neg


SURROGATES = {"jj": JaakkolaJordan, "taylor": TaylorLogistic}
