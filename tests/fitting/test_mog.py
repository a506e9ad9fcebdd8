"""Mixture-of-diagonal-Gaussians posteriors (gpvi.fitting.mog): the entropy bound against numerical
integration, the K = 1 optimum against the closed-form mean-field solution, bad input, and the
result as one of gpvi.fit's results (trace, callback, offsets, model files)."""
import jax.numpy as jnp
import numpy as np
import pytest

from gpvi import GP, kernels
from gpvi import likelihoods as L
from gpvi.fitting.mog import entropy_lower_bound, fit_mog, mixture_entropy_1d2d


@pytest.mark.parametrize("K, D", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2)])
@pytest.mark.slow
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
    np.testing.assert_allclose(m, res.means[0], atol=1e-5)
    mk, vk = res.predict_components(X)
    assert mk.shape == (1, 40) and np.array_equal(mk[0], m) and np.array_equal(vk[0], v)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    m_mix, v_mix = mix.predict_components(X)
    assert m_mix.shape == (1, 30, 3) and np.all(v_mix > 0)
    m_f, v_f = mix.predict_f(X)  # the mixture's moments, (n, Q) as a Gaussian posterior's
    assert m_f.shape == v_f.shape == (30, 3)
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


# ---- the result: one of gpvi.fit's results --------------------------------------------------------
def _bernoulli(n=24, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 1))
    return X, (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * np.sin(X[:, 0])))).astype(float)


@pytest.fixture(scope="module")
def mog_fits():
    """A one-latent fit (Bernoulli, K = 2) with the callback's calls, and a several-latent one
    (softmax, 3 classes, K = 1)."""
    import gpvi
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    X, y = _bernoulli()
    calls = []
    one = gpvi.fit(GP(kernels.RBF(), L.Bernoulli()), X, y, posterior="mog", components=2,
                   callback=lambda *a: calls.append(a))
    Xs, ys = _three_class(21)
    model = MultiLatent.full([kernels.RBF(lengthscale=0.8)] * 3, Softmax(num_classes=3))
    several = gpvi.fit(model, Xs, ys, posterior="mog", components=1)
    return {"one": (one, X, y, calls), "several": (several, Xs, ys, None)}


def _predictions(fit, X, y):
    out = {}
    out["f_mean"], out["f_var"] = fit.predict_f(X)
    out["c_mean"], out["c_var"] = fit.predict_components(X)
    out["y_mean"], out["y_var"] = fit.predict_y(X)
    out["proba"] = fit.predict_proba(X)
    out["lpd"] = fit.log_predictive_density(X, y)
    return out


@pytest.mark.parametrize("which", ["one", "several"])
@pytest.mark.slow
def test_mog_result_is_a_fit_result_that_saves_loads_and_predicts_bit_for_bit(mog_fits, which, tmp_path):
    import gpvi
    from gpvi.fitting.mog import MoGResult

    fit, X, y, _ = mog_fits[which]
    assert isinstance(fit, gpvi.FitResult) and isinstance(fit, MoGResult)
    assert fit.state is None and fit.engine == "mog" and np.isnan(fit.gap)
    assert fit.extras == {"components": fit.components} and fit.input_dim == 1
    assert fit.trace.shape == (fit.iterations + 1, 2) and fit.evaluations >= fit.iterations
    assert fit.diagnostics["damped"] is False and "MoGResult(" in repr(fit)
    path = gpvi.io.save(fit, tmp_path / "mog.gpvi")
    back = gpvi.io.load(path)
    assert type(back) is MoGResult
    for name in ("vlb", "iterations", "converged", "message", "engine", "evaluations", "hyperparameter_rounds",
                 "input_dim", "extras", "seconds"):
        assert getattr(back, name) == getattr(fit, name), name
    for name in ("trace", "X", "means", "variances"):
        np.testing.assert_array_equal(getattr(back, name), getattr(fit, name), err_msg=name)
    want, got = _predictions(fit, X[::2] + 0.1, y[::2]), _predictions(back, X[::2] + 0.1, y[::2])
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    n, K = X[::2].shape[0], fit.components
    if which == "one":
        assert want["f_mean"].shape == (n,) and want["c_mean"].shape == (K, n) and want["proba"].shape == (n, 2)
    else:
        assert want["f_mean"].shape == (n, 3) and want["c_mean"].shape == (K, n, 3) and want["proba"].shape == (n, 3)
    np.testing.assert_allclose(want["proba"].sum(1), 1.0)
    # the mixture's latent moments are the components' by the law of total variance
    np.testing.assert_allclose(want["f_mean"], want["c_mean"].mean(0))
    np.testing.assert_allclose(want["f_var"], (want["c_var"] + want["c_mean"] ** 2).mean(0) - want["f_mean"] ** 2,
                               rtol=1e-9, atol=1e-12)


def _check_calls(fit, calls):
    # iteration 0 (the start), then one call per L-BFGS-B iteration, as the rows of the trace
    assert [c[0] for c in calls] == list(range(fit.iterations + 1))
    np.testing.assert_array_equal([c[1] for c in calls], fit.trace[:, 1])
    np.testing.assert_array_equal([c[2] for c in calls], fit.trace[:, 0])
    assert np.all(np.diff(fit.trace[:, 0]) >= 0) and fit.trace[-1, 1] == fit.vlb
    assert fit.trace[-1, 1] > fit.trace[0, 1] and 0 < fit.trace[-1, 0] <= fit.seconds


@pytest.mark.slow
def test_mog_callback_follows_the_trace(mog_fits):
    fit, *_, calls = mog_fits["one"]
    _check_calls(fit, calls)
    assert fit.hyperparameter_rounds == 0 and fit.converged


def test_mog_progress_bar(capsys):
    import gpvi

    X, y = _bernoulli(12)
    fit = gpvi.fit(GP(kernels.RBF(), L.Bernoulli()), X, y, posterior="mog", progress=True)
    assert "gpvi mog" in capsys.readouterr().err and fit.iterations > 0


@pytest.mark.slow
def test_mog_predictions_with_an_offset(mog_fits):
    for which in ("one", "several"):
        fit, X, y, _ = mog_fits[which]
        m, v = fit.predict_f(X)
        m1, v1 = fit.predict_f(X, offset=np.full(X.shape[0], 0.5))  # added to every latent
        np.testing.assert_allclose(m1, m + 0.5, atol=1e-12)
        np.testing.assert_allclose(v1, v, rtol=1e-12)
        assert np.all(np.isfinite(fit.log_predictive_density(X, y, offset=0.5)))
        with pytest.raises(ValueError, match="offset"):
            fit.predict_y(X, offset=np.zeros(3))
        with pytest.raises(ValueError, match="columns"):
            fit.predict_proba(np.zeros((2, 3)))
        with pytest.raises(ValueError, match="rows"):
            fit.log_predictive_density(X, y[:-1])


def test_mog_refuses_gaussian_path_options():
    import gpvi

    X, y = _bernoulli(10)
    model = GP(kernels.RBF(), L.Bernoulli())
    for options in ({"engine": "gradient"}, {"executor": "local"}, {"offset": np.zeros(10)}, {"max_iter": 20},
                    {"subset": 5}, {"init": "laplace"}, {"tol_nats": 1e-3}, {"engine_options": {"history": 5}}):
        with pytest.raises(ValueError, match=f"{next(iter(options))} does not apply with posterior='mog'"):
            gpvi.fit(model, X, y, posterior="mog", **options)
    with pytest.raises(ValueError, match="callback"):
        gpvi.fit(model, X, y, posterior="mog", callback=3)
    # the defaults, spelled out, are fine; with learned hyperparameters the calls and the trace
    # run on from q alone into the joint search
    calls = []
    fit = gpvi.fit(model, X, y, posterior="mog", engine="fpi", tol=1e-6, max_iter=None, init="prior",
                   engine_options={}, learn_hyperparameters="kernel.variance", callback=lambda *a: calls.append(a))
    _check_calls(fit, calls)
    assert 0 < fit.hyperparameter_rounds < fit.iterations


@pytest.mark.slow
def test_damaged_mog_files_are_refused(mog_fits, tmp_path):
    import gpvi
    from gpvi.fitting.codec import fit_result_to_arrays, mog_result_from_arrays, mog_result_to_arrays

    fit = mog_fits["one"][0]
    with pytest.raises(ValueError, match="mog_result_to_arrays"):
        fit_result_to_arrays(fit)
    meta, arrays = mog_result_to_arrays(fit)
    mog_result_from_arrays(meta, arrays)  # as written: fine
    for key, bad in (("mog.means", arrays["mog.means"][:1]), ("mog.variances", -arrays["mog.variances"]),
                     ("mog.X", np.zeros((3, 2))), ("mog.trace", np.zeros(3))):
        with pytest.raises(ValueError):
            mog_result_from_arrays(meta, {**arrays, key: bad})
    with pytest.raises(ValueError, match=r"shape \(3, 24\)"):  # K = 3 components in a file of 2
        mog_result_from_arrays({**meta, "extras": {"components": 3}}, arrays)
    with pytest.raises(ValueError, match="components"):
        mog_result_from_arrays({**meta, "extras": {}}, arrays)
    with pytest.raises(ValueError, match="scalars"):
        mog_result_from_arrays({**meta, "scalars": {**meta["scalars"], "iterations": -1}}, arrays)
    # a file whose model is not a full GP is damaged, and says so
    from gpvi.fitting.codec import encode

    sparse = gpvi.SparseGP(kernels.RBF(), L.Bernoulli(), inducing=np.zeros((2, 1)))
    arr2 = dict(arrays)
    meta2 = {**meta, "model": encode(sparse, arr2, "mog.model")}
    with pytest.raises(ValueError, match="full GP"):
        mog_result_from_arrays(meta2, arr2)
