"""Mixture-of-diagonal-Gaussians posteriors (gpvi.fitting.mog): the entropy bound against numerical
integration, the K = 1 optimum against the closed-form mean-field solution, bad input."""
import jax.numpy as jnp
import numpy as np
import pytest

from gpvi import GP, kernels
from gpvi import likelihoods as L
from gpvi.fitting.mog import entropy_lower_bound, fit_mog, mixture_entropy_1d2d


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


def _three_class(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 1))
    F = 2.0 * np.stack([np.sin(X[:, 0]), np.cos(X[:, 0]), 0.3 * X[:, 0]], 1)
    P = np.exp(F) / np.exp(F).sum(1, keepdims=True)
    return X, np.array([rng.choice(3, p=p) for p in P]).astype(float)


def test_mix_with_several_latents_softmax():
    """MIX/MIX2 over a MultiLatent of Q = 3 full GPs (softmax, the paper's USPS setting).

    With K = 1 the MoG bound at any (means, variances) equals gpvi's Gaussian VLB of the same q
    written as a whitened State (``w_q = L_q⁻¹(f_q − μ_q)``, ``chol = L_q⁻¹ diag √s_q``): two
    separate code paths.  MIX's optimum is then a special case of FULL's, so it is at most FULL's
    optimum; with Q = 1 the MultiLatent path gives the single-GP bound; predictions are
    probabilities."""
    import gpvi
    from gpvi import Objective
    from gpvi.fitting.mog import _bound
    from gpvi.models.multilatent import MultiLatent
    from gpvi.objective import State
    from gpvi.likelihoods.softmax import Softmax

    X, y = _three_class(30)
    model = MultiLatent.full([kernels.RBF(lengthscale=0.5), kernels.RBF(lengthscale=0.8),
                              kernels.RBF(variance=2.0, lengthscale=0.6)], Softmax(num_classes=3),
                             mean=[0.0, 0.2, -0.1])
    rng = np.random.default_rng(5)
    u = 0.5 * rng.standard_normal((1, 3, 30))
    logvar = np.log(rng.uniform(0.05, 0.5, (1, 3, 30)))
    bound, means = _bound(jnp.asarray(u), jnp.asarray(logvar), model, jnp.asarray(X), jnp.asarray(y), 1)
    obj = Objective(model, X, y)
    Ls = [np.linalg.cholesky(np.asarray(lat.kernel(jnp.asarray(X))) + lat.jitter * np.mean(np.diag(
        np.asarray(lat.kernel(jnp.asarray(X))))) * np.eye(30)) for lat in model.latents]
    mean_w = np.stack([np.linalg.solve(Ls[q], np.asarray(means[0, q]) - model.latents[q].mean) for q in range(3)])
    chol_w = np.stack([np.linalg.solve(Ls[q], np.diag(np.exp(0.5 * logvar[0, q]))) for q in range(3)])
    vlb = float(obj.vlb(State(jnp.asarray(mean_w), jnp.asarray(np.tril(chol_w)))))
    assert abs(float(bound) - vlb) < 1e-7 * abs(vlb), (float(bound), vlb)

    full = gpvi.fit(model, X, y, engine="fpi", tol=1e-10)
    mix = fit_mog(model, X, y, components=1)
    assert mix.means.shape == (1, 3, 30) and mix.variances.shape == (1, 3, 30)
    assert float(bound) <= mix.vlb <= full.vlb + 1e-6, (float(bound), mix.vlb, full.vlb)
    m_mix, v_mix = mix.predict_f(X)
    assert m_mix.shape == (1, 30, 3) and np.all(v_mix > 0)
    mix2 = fit_mog(model, X, y, components=2)
    p = mix2.predict_proba(X)
    assert p.shape == (30, 3) and np.allclose(p.sum(1), 1.0) and (p.argmax(1) == y).mean() > 0.5
    assert np.all(np.isfinite(mix2.log_predictive_density(X, y)))
    # Q = 1 through MultiLatent equals the single GP
    yb = (y == 0).astype(float)
    single = fit_mog(GP(kernels.RBF(), L.Bernoulli()), X, yb, components=2)
    multi = fit_mog(MultiLatent.full([kernels.RBF()], L.Bernoulli()), X, yb, components=2)
    assert abs(single.vlb - multi.vlb) < 1e-8 * abs(single.vlb)
    np.testing.assert_allclose(multi.means, single.means, atol=1e-6)  # (K, N) for one latent either way


def test_mog_refuses_sparse_latents():
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    X, y = _three_class(12)
    model = MultiLatent.sparse([kernels.RBF()] * 3, Softmax(num_classes=3), inducing=X[:4])
    with pytest.raises(ValueError, match="full GPs"):
        fit_mog(model, X, y, components=2)
