"""fit() options added for the paper reproductions: subset of data, engine options, γ clipping,
and the per-fit record of safeguard events."""
import numpy as np
import pytest

import gpvi


def _poisson(rng, N=120):
    X = rng.uniform(-2, 2, size=(N, 1))
    y = rng.poisson(np.exp(np.sin(2 * X[:, 0])))
    return X, y


def _model():
    return gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=0.7), likelihood=gpvi.likelihoods.Poisson())


def test_subset_int_equals_fit_on_those_rows(rng):
    X, y = _poisson(rng)
    res = gpvi.fit(_model(), X, y, subset=40, seed=3, tol=1e-10)
    assert res.subset.shape == (40,) and np.unique(res.subset).size == 40
    direct = gpvi.fit(_model(), X[res.subset], y[res.subset], tol=1e-10)
    assert res.vlb == pytest.approx(direct.vlb, rel=1e-10)
    # Predictions come from the subset posterior: the same as the direct fit's.
    np.testing.assert_allclose(res.predict_f(X[:5])[0], direct.predict_f(X[:5])[0], rtol=1e-8, atol=1e-10)


def test_subset_indices_and_offsets_follow(rng):
    X, y = _poisson(rng)
    idx = np.arange(0, 120, 3)
    off = rng.normal(size=120) * 0.1
    res = gpvi.fit(_model(), X, y, subset=idx, offset=off, tol=1e-10)
    direct = gpvi.fit(_model(), X[idx], y[idx], offset=off[idx], tol=1e-10)
    assert res.vlb == pytest.approx(direct.vlb, rel=1e-10)
    np.testing.assert_array_equal(res.subset, idx)


@pytest.mark.parametrize("bad, match", [
    (0, "subset"), (500, "subset"), (2.5, "subset"), (np.array([1, 1, 2]), "repeated"),
    (np.array([0, 999]), "outside"), (np.array([0.5, 1.0]), "integer"), (True, "subset"),
])
def test_subset_rejects_bad_values(rng, bad, match):
    X, y = _poisson(rng)
    with pytest.raises(ValueError, match=match):
        gpvi.fit(_model(), X, y, subset=bad)


def test_engine_options_are_checked(rng):
    X, y = _poisson(rng, 30)
    with pytest.raises(ValueError, match="engine_options"):
        gpvi.fit(_model(), X, y, engine_options={"no_such_option": 1})
    with pytest.raises(ValueError, match="engine_options"):
        gpvi.fit(_model(), X, y, engine_options={"tol": 1e-3})
    with pytest.raises(ValueError, match="engine_options"):
        gpvi.fit(_model(), X, y, engine_options=[("history", 3)])
    with pytest.raises(ValueError, match="clip_gamma"):
        gpvi.fit(_model(), X, y, engine_options={"clip_gamma": "sometimes"})
    res = gpvi.fit(_model(), X, y, engine="gradient", engine_options={"history": 5})
    assert res.converged


def test_clip_gamma_always_is_a_no_op_for_log_concave(rng):
    # Poisson has γ > 0 everywhere, so clipping at 0 changes nothing but is counted.
    X, y = _poisson(rng)
    auto = gpvi.fit(_model(), X, y, tol=1e-10)
    always = gpvi.fit(_model(), X, y, tol=1e-10, engine_options={"clip_gamma": "always"})
    assert always.vlb == pytest.approx(auto.vlb, rel=1e-10)
    assert auto.clipped == 0 and always.clipped >= always.iterations
    assert always.diagnostics["clipped"] and not auto.diagnostics["clipped"]


@pytest.mark.slow
def test_student_t_clipping_recorded(rng):
    # Student-t is not log-concave: far from the optimum I − S can be indefinite, and then the
    # step uses γ clipped at 0.  Either way the record says what happened.
    X = np.linspace(-3, 3, 80)[:, None]
    y = np.sin(X[:, 0]) + 0.05 * rng.standard_t(2, size=80)
    y[::10] += 8.0  # outliers: γ_i < 0 there
    model = gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=1.0),
                    likelihood=gpvi.likelihoods.StudentT(df=3.0, scale=0.1))
    res = gpvi.fit(model, X, y, engine="fpi", engine_options={"clip_gamma": "always"}, max_iter=200)
    d = res.diagnostics
    assert set(d) == {"damped", "cycled", "clipped", "backtracks", "cycles", "clipped_steps"}
    assert d["clipped"] and d["clipped_steps"] == res.clipped > 0
    assert np.isfinite(res.vlb)


def test_init_string_checked(rng):
    X, y = _poisson(rng, 30)
    with pytest.raises(ValueError, match="init"):
        gpvi.fit(_model(), X, y, init="posterior")
    res = gpvi.fit(_model(), X, y, init="prior")
    assert res.converged


def test_public_api_as_documented(rng):
    # The entry points exactly as the README and issue 2 write them: kernel and likelihood
    # positional, everything else by keyword.
    X = rng.standard_normal((120, 2))
    y = (X[:, 0] + 0.3 * rng.standard_normal(120) > 0).astype(float)
    Z = X[:8]
    kernel = gpvi.kernels.RBF(variance=1.0, lengthscale=1.0)
    lik = gpvi.likelihoods.Bernoulli()
    models = [gpvi.SparseGP(kernel, lik, inducing=Z, mean=0.0), gpvi.GP(kernel, lik, mean=0.0),
              gpvi.GLM(lik, prior_variance=0.1)]
    fits = []
    for model in models:
        fits.append(fit := gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=False, tol=1e-6, max_iter=500))
        assert fit.converged and np.isfinite(fit.vlb) and fit.iterations >= 1
        assert fit.trace.shape == (fit.iterations + 1, 2)
        mean, var = fit.predict_f(X[:5])
        assert mean.shape == var.shape == (5,) and np.all(var > 0)
        assert np.all(np.isfinite(fit.log_predictive_density(X[:5], y[:5])))
    assert np.array_equal(np.asarray(fits[0].model.inducing), Z)  # used exactly as given
    with pytest.raises(TypeError):
        gpvi.GP(kernel, lik, 0.0)  # the mean is keyword-only


@pytest.mark.parametrize("components", [3, 0, 2.0, True])
def test_components_without_the_mixture_posterior_is_refused(components):
    """Issue 30 §2: ``components=3`` with the default Gaussian posterior was silently ignored."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 1))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="only with posterior='mog'"):
        gpvi.fit(gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Bernoulli()), X, y, components=components)
