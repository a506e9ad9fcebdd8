"""A user's likelihood with several latents per row (written from log_prob alone): the default
expectations use a product Gauss–Hermite rule over the latents (issue 30 §2: a hand-written
heteroscedastic likelihood died with "Incompatible shapes for broadcasting"), checked against
closed forms, against Monte Carlo, and refused where a product rule cannot run."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi.likelihoods.base import Likelihood
from gpvi.likelihoods.quadrature import expect_product, product_order


class Hetero(Likelihood):
    """y ~ N(f₀, exp(2 f₁)): mean and log noise scale, two latents per row."""

    @property
    def num_latents(self):
        return 2

    def log_prob(self, y, f):
        mu, g = f[..., 0], f[..., 1]
        return -0.5 * math.log(2 * math.pi) - g - 0.5 * ((y - mu) * jnp.exp(-g)) ** 2

    def conditional_mean(self, f):
        return f[..., 0]

    def conditional_variance(self, f):
        return jnp.exp(2 * f[..., 1])


class FiveLatents(Likelihood):
    @property
    def num_latents(self):
        return 5

    def log_prob(self, y, f):
        return -0.5 * (y - jnp.sum(f, axis=-1)) ** 2


def test_product_rule_is_exact_on_closed_forms():
    rng = np.random.default_rng(0)
    m = jnp.asarray(rng.normal(size=(7, 3)))
    v = jnp.asarray(rng.uniform(0.1, 0.8, size=(7, 3)))
    # E[exp(a·f)] = exp(a·m + ½ Σ a² v); E[f₀² f₁ f₂] = (m₀² + v₀) m₁ m₂
    a = jnp.array([1.0, -0.5, 0.3])
    got = expect_product(lambda f: jnp.exp(f @ a), m, v, product_order(3))
    np.testing.assert_allclose(got, jnp.exp(m @ a + 0.5 * (v @ a ** 2)), rtol=1e-9)
    got = expect_product(lambda f: f[..., 0] ** 2 * f[..., 1] * f[..., 2], m, v, 10)
    np.testing.assert_allclose(got, (m[:, 0] ** 2 + v[:, 0]) * m[:, 1] * m[:, 2], rtol=1e-10, atol=1e-12)
    assert product_order(2) == 20 and product_order(3) == 10 and product_order(4) == 5


@pytest.mark.slow
def test_expectations_and_predictions_of_a_two_latent_likelihood_match_closed_forms():
    rng = np.random.default_rng(1)
    n = 9
    y = jnp.asarray(rng.normal(size=n))
    m = jnp.asarray(rng.normal(scale=0.5, size=(n, 2)))
    v = jnp.asarray(rng.uniform(0.05, 0.4, size=(n, 2)))
    lik = Hetero()
    # E[log p] = −½ log 2π − m₁ − ½((y − m₀)² + v₀) exp(−2m₁ + 2v₁)
    closed = -0.5 * math.log(2 * math.pi) - m[:, 1] - 0.5 * ((y - m[:, 0]) ** 2 + v[:, 0]) * jnp.exp(-2 * m[:, 1] + 2 * v[:, 1])
    np.testing.assert_allclose(lik.expected_log_prob(y, m, v), closed, rtol=1e-8)
    E, rho, lam = lik.variational_moments(y, m, v)
    assert E.shape == (n,) and rho.shape == lam.shape == (n, 2)
    # ρ₀ = ∂E/∂m₀ = (y − m₀) exp(−2m₁ + 2v₁)
    np.testing.assert_allclose(rho[:, 0], (y - m[:, 0]) * jnp.exp(-2 * m[:, 1] + 2 * v[:, 1]), rtol=1e-8)
    mean, var = lik.predict_mean_and_var(m, v)
    np.testing.assert_allclose(mean, m[:, 0], rtol=1e-10)
    np.testing.assert_allclose(var, v[:, 0] + jnp.exp(2 * m[:, 1] + 2 * v[:, 1]), rtol=1e-8)


@pytest.mark.slow
def test_hand_written_heteroscedastic_fit_agrees_with_monte_carlo():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(120, 1))
    y = np.sin(2 * X[:, 0]) + np.exp(-1 + 0.5 * X[:, 0]) * rng.normal(size=120)
    fits = {}
    for name, lik in (("quadrature", Hetero()), ("mc", gpvi.MonteCarlo(Hetero(), num_samples=2000))):
        model = gpvi.MultiLatent.full(gpvi.kernels.RBF(lengthscale=1.0), lik)
        fits[name] = gpvi.fit(model, X, y)
        assert fits[name].converged
    q, mc = fits["quadrature"], fits["mc"]
    assert abs(q.vlb - mc.vlb) < 0.05 * abs(q.vlb) ** 0.5
    for f in (q, mc):
        mean, var = f.predict_y(X[:6])
        assert mean.shape == var.shape == (6,)
    np.testing.assert_allclose(q.predict_y(X[:6])[0], mc.predict_y(X[:6])[0], atol=5e-3)
    lpd = q.model.likelihood.predictive_log_density(jnp.asarray(y[:6]), *map(jnp.asarray, q.predict_f(X[:6])))
    assert lpd.shape == (6,) and np.all(np.isfinite(lpd))


def test_five_latents_are_refused_with_a_way_out():
    with pytest.raises(ValueError, match="MonteCarlo"):
        FiveLatents().expected_log_prob(jnp.zeros(3), jnp.zeros((3, 5)), jnp.ones((3, 5)))
