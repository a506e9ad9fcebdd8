"""Mixture-of-diagonal-Gaussians posteriors (gpvi.mog): the entropy bound against numerical
integration, the K = 1 optimum against the closed-form mean-field solution, bad input."""
import jax.numpy as jnp
import numpy as np
import pytest

from gpvi import GP, kernels
from gpvi import likelihoods as L
from gpvi.mog import entropy_lower_bound, fit_mog, mixture_entropy_1d2d


@pytest.mark.parametrize("K, D", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2)])
def test_entropy_bound_below_true_entropy(K, D):
    rng = np.random.default_rng(K * 10 + D)
    for _ in range(3):
        means = rng.normal(0, 1.5, (K, D))
        var = rng.uniform(0.2, 2.0, (K, D))
        true = mixture_entropy_1d2d(means, var)
        bound = float(entropy_lower_bound(jnp.asarray(means), jnp.asarray(var)))
        assert bound <= true + 1e-6, (bound, true)
    # one Gaussian: the integration reproduces ½ Σ log(2πe s), and the bound is ½(1 − log 2) per
    # dimension below it
    if K == 1:
        exact = 0.5 * np.sum(np.log(2 * np.pi * np.e * var))
        assert abs(true - exact) < 1e-6
        assert abs(bound - (exact - 0.5 * D * (1 - np.log(2)))) < 1e-9


def test_far_apart_components_make_the_bound_tight():
    means = np.array([[-30.0], [30.0]])
    var = np.array([[1.0], [2.0]])
    true = mixture_entropy_1d2d(means, var)
    bound = float(entropy_lower_bound(jnp.asarray(means), jnp.asarray(var)))
    # separated: H = log 2 + mean of component entropies; the bound is ½(1 − log 2) below
    assert abs(true - (np.log(2) + 0.5 * np.mean(np.log(2 * np.pi * np.e * var)))) < 1e-6
    assert 0 < true - bound < 0.5 * (1 - np.log(2)) + 1e-6


def test_mix_on_gaussian_regression_is_the_mean_field_solution():
    # Gaussian likelihood: the best diagonal Gaussian has the exact posterior mean and variances
    # 1/diag(Λ), Λ = K⁻¹ + I/σ² (mean-field for a Gaussian target)
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (40, 1))
    y = np.sin(X[:, 0]) + 0.2 * rng.standard_normal(40)
    k, s2 = kernels.RBF(lengthscale=1.0), 0.1
    res = fit_mog(GP(k, L.Gaussian(variance=s2)), X, y, components=1)
    Kx = np.asarray(k(jnp.asarray(X), jnp.asarray(X))) + 1e-8 * np.eye(40)
    Lam = np.linalg.inv(Kx) + np.eye(40) / s2
    mean = np.linalg.solve(Lam, y / s2)
    np.testing.assert_allclose(res.means[0], mean, atol=2e-4)
    np.testing.assert_allclose(res.variances[0], 1.0 / np.diag(Lam), rtol=2e-3)
    # predictions at the training inputs reproduce the fitted marginals
    m, v = res.predict_f(X)
    np.testing.assert_allclose(m[0], res.means[0], atol=1e-5)


def test_mix2_classification_runs_and_predicts():
    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, (50, 1))
    y = (np.sin(2 * X[:, 0]) > 0).astype(float)
    res = fit_mog(GP(kernels.RBF(), L.Bernoulli()), X, y, components=2)
    assert res.means.shape == (2, 50) and np.all(res.variances > 0)
    p, _ = res.predict_y(X)
    assert ((p > 0.5) == (y > 0)).mean() > 0.9
    assert np.all(np.isfinite(res.log_predictive_density(X, y)))


@pytest.mark.parametrize("K", [0, -1, 1.5, True])
def test_bad_components(K):
    with pytest.raises(ValueError, match="components"):
        fit_mog(GP(kernels.RBF(), L.Gaussian()), np.zeros((3, 1)), np.zeros(3), components=K)


def test_fit_posterior_option():
    import gpvi

    X = np.linspace(-2, 2, 20)[:, None]
    y = np.sin(X[:, 0])
    res = gpvi.fit(GP(kernels.RBF(), L.Gaussian(variance=0.1)), X, y, posterior="mog", components=2)
    assert res.means.shape == (2, 20)
    with pytest.raises(ValueError, match="posterior"):
        gpvi.fit(GP(kernels.RBF(), L.Gaussian()), X, y, posterior="mixture")
    with pytest.raises(ValueError, match="components"):
        gpvi.fit(GP(kernels.RBF(), L.Gaussian()), X, y, posterior="mog", components=0)
