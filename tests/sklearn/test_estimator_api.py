"""The estimators' scikit-learn API of issue 33: fitted ``kernel_``, ``likelihood_``, ``vlb_``
(absent before fit), ``GPRegressor.predict(return_cov=True)`` against a closed-form NumPy GP
posterior, its PSD covariance whose diagonal is ``return_std**2``, ``sample_y`` against the
predictive moments by Monte Carlo, and the attributes of a saved and loaded estimator."""
import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

import gpvi
from gpvi import GPClassifier, GPRegressor, kernels
from gpvi.fitting.collapsed import collapsed_bound


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) * [1.0, 2.0] + [0.5, -1.0]
    y = 3.0 + 2.0 * np.sin(1.5 * X[:, 0]) + 0.2 * X[:, 1] + 0.2 * rng.normal(size=n)
    return X, y


@pytest.fixture(scope="module")
def reg():
    X, y = _data()
    return GPRegressor().fit(X, y), X, y


def _rbf(A, B, variance, lengthscale):
    """The ARD RBF kernel in NumPy: ``s² exp(−½ Σ_d (a_d − b_d)² / ℓ_d²)``."""
    d = (A[:, None, :] - B[None, :, :]) / np.asarray(lengthscale)
    return variance * np.exp(-0.5 * np.sum(d**2, axis=-1))


def test_fitted_attributes_absent_before_fit():
    est = GPRegressor()
    for name in ("kernel_", "likelihood_", "vlb_", "fit_result_"):
        assert not hasattr(est, name)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    with pytest.raises(NotFittedError):
        est.kernel_


def test_kernel_and_likelihood_are_the_learned_ones(reg):
    est, X, y = reg
    check_is_fitted(est)
    k = est.kernel_
    assert isinstance(k, kernels.Kernel) and type(k) is kernels.RBF
    learned = est.fit_result_.model.kernel.parameters()
    assert set(k.parameters()) == set(learned)
    for name, value in k.parameters().items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(learned[name]))
    # learned: not the starting values (variance 1, lengthscales at the median distance)
    assert not np.isclose(float(k.variance), 1.0)
    assert isinstance(est.likelihood_, gpvi.likelihoods.Gaussian)
    assert isinstance(est.vlb_, float)
    # independent check: the exact log marginal likelihood of a GP built from kernel_ and
    # likelihood_ on the standardised data is the fit's bound (Gaussian noise, full GP: the VLB
    # at the optimal q is the evidence)
    Xs = (X - est.x_mean_) / est.x_scale_
    ys = (y - est.y_mean_) / est.y_scale_
    model = gpvi.GP(k, est.likelihood_, mean=est.fit_result_.model.mean)
    assert collapsed_bound(model, Xs, ys) == pytest.approx(est.vlb_, rel=1e-7, abs=1e-7)


def test_return_std_and_return_cov_are_exclusive(reg):
    est, X, _ = reg
    with pytest.raises(ValueError, match="At most one"):
        est.predict(X[:3], return_std=True, return_cov=True)
    with pytest.raises(RuntimeError):  # scikit-learn's class for it
        est.predict(X[:3], return_std=True, return_cov=True)


def test_return_cov_is_psd_and_its_diagonal_is_the_std_squared(reg):
    est, X, _ = reg
    Xt = np.random.default_rng(1).normal(size=(9, 2)) * 2.0
    Xt = np.concatenate([Xt, X[:3], Xt[:1]])  # training rows and a repeated row too
    mean_std, std = est.predict(Xt, return_std=True)
    mean_cov, cov = est.predict(Xt, return_cov=True)
    np.testing.assert_array_equal(mean_cov, est.predict(Xt))
    np.testing.assert_allclose(mean_cov, mean_std, rtol=0, atol=0)
    assert cov.shape == (len(Xt), len(Xt))
    np.testing.assert_array_equal(cov, cov.T)
    assert np.linalg.eigvalsh(cov).min() >= -1e-10
    np.testing.assert_allclose(np.diag(cov), std**2, rtol=1e-10, atol=1e-10)
    # the repeated row: its two rows of cov agree off the diagonal (the same latent, independent noise)
    np.testing.assert_allclose(cov[0, 1:-1], cov[-1, 1:-1], rtol=1e-8, atol=1e-12)
    assert cov[0, -1] < cov[0, 0]


def test_return_cov_is_the_closed_form_gp_posterior(reg):
    est, X, y = reg
    assert est.model_kind_ == "full"
    Xt = np.random.default_rng(2).normal(size=(7, 2)) * 1.5
    mean, cov = est.predict(Xt, return_cov=True)
    # the oracle: the GP posterior predictive of y in NumPy, from the learned kernel's numbers
    k = est.kernel_
    s2 = float(est.likelihood_.variance)
    mu = float(est.fit_result_.model.mean)
    Xs = (X - est.x_mean_) / est.x_scale_
    Ts = (Xt - est.x_mean_) / est.x_scale_
    ys = (y - est.y_mean_) / est.y_scale_
    var, ell = float(k.variance), np.asarray(k.lengthscale)
    Kxx = _rbf(Xs, Xs, var, ell) + s2 * np.eye(len(Xs))
    Ktx = _rbf(Ts, Xs, var, ell)
    Ktt = _rbf(Ts, Ts, var, ell)
    m_oracle = mu + Ktx @ np.linalg.solve(Kxx, ys - mu)
    c_oracle = Ktt - Ktx @ np.linalg.solve(Kxx, Ktx.T) + s2 * np.eye(len(Ts))
    scale = est.y_scale_
    np.testing.assert_allclose(mean, m_oracle * scale + est.y_mean_, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(cov, c_oracle * scale**2, rtol=1e-5, atol=1e-6 * scale**2)


def test_sample_y_matches_the_predictive_moments(reg):
    est, X, _ = reg
    Xt = np.random.default_rng(3).normal(size=(5, 2))
    S = 20000
    draws = est.sample_y(Xt, n_samples=S, random_state=7)
    assert draws.shape == (5, S)
    np.testing.assert_array_equal(draws, est.sample_y(Xt, n_samples=S, random_state=7))  # reproducible
    assert not np.array_equal(draws, est.sample_y(Xt, n_samples=S, random_state=8))
    assert est.sample_y(Xt).shape == (5, 1)
    mean, cov = est.predict(Xt, return_cov=True)
    sd = np.sqrt(np.diag(cov))
    # the sample mean within 5 standard errors, each sample covariance within 5 of its standard
    # errors (for Gaussian draws Var(c_ij) ≈ (c_ii c_jj + c_ij²) / S)
    assert np.all(np.abs(draws.mean(axis=1) - mean) < 5 * sd / np.sqrt(S))
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / S)
    assert np.all(np.abs(np.cov(draws) - cov) < 5 * se)
    with pytest.raises(ValueError, match="n_samples"):
        est.sample_y(Xt, n_samples=0)


def test_sample_y_with_laplace_noise_has_the_predictive_variance():
    X, y = _data(30, seed=4)
    est = GPRegressor(noise="laplace", learn_hyperparameters=False).fit(X, y)
    Xt = X[:4]
    mean, std = est.predict(Xt, return_std=True)
    _, cov = est.predict(Xt, return_cov=True)
    np.testing.assert_allclose(np.diag(cov), std**2, rtol=1e-10, atol=1e-10)
    assert np.linalg.eigvalsh(cov).min() >= -1e-10
    S = 40000
    draws = est.sample_y(Xt, n_samples=S, random_state=0)
    assert np.all(np.abs(draws.mean(axis=1) - mean) < 5 * std / np.sqrt(S))
    # Laplace noise has kurtosis 6: the variance's standard error is larger than a Gaussian's
    np.testing.assert_allclose(draws.var(axis=1), std**2, rtol=0.06)


def test_saved_estimator_keeps_the_fitted_attributes(reg, tmp_path):
    est, X, _ = reg
    back = gpvi.io.load(gpvi.io.save(est, tmp_path / "reg.gpvi"))
    check_is_fitted(back)
    assert repr(back.kernel_) == repr(est.kernel_)
    assert repr(back.likelihood_) == repr(est.likelihood_)
    assert back.vlb_ == est.vlb_
    Xt = X[:5] + 0.1
    for a, b in zip(back.predict(Xt, return_cov=True), est.predict(Xt, return_cov=True)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_classifier_kernels_and_probabilities():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 2))
    yb = np.where(X[:, 0] > 0, "b", "a")
    clf = GPClassifier(learn_hyperparameters=False).fit(X, yb)
    assert isinstance(clf.kernel_, kernels.Kernel)
    assert isinstance(clf.likelihood_, gpvi.likelihoods.Bernoulli)
    p = clf.predict_proba(X[:5])
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    # three classes: one latent GP (and kernel) per class, in classes_ order
    y3 = np.digitize(X[:, 0], [-0.4, 0.4])
    clf3 = GPClassifier(learn_hyperparameters=False).fit(X, y3)
    ks = clf3.kernel_
    assert isinstance(ks, list) and len(ks) == 3 and all(isinstance(k, kernels.Kernel) for k in ks)
    assert [repr(k) for k in ks] == [repr(lat.kernel) for lat in clf3.fit_result_.model.latents]
    assert clf3.predict_proba(X[:5]).shape == (5, 3)
    doc = GPClassifier.predict_proba.__doc__
    assert "Two classes" in doc and "More classes" in doc and "classes_" in doc


def test_sparse_return_cov_with_inducing_inputs_at_the_data_is_the_gp_posterior():
    # M = N k-means centres are the training inputs: the sparse posterior is the full GP's
    X, y = _data(24, seed=6)
    est = GPRegressor(model="sparse", inducing=24, learn_hyperparameters=False).fit(X, y)
    assert est.model_kind_ == "sparse"
    Xs = (X - est.x_mean_) / est.x_scale_
    Z = np.asarray(est.fit_result_.model.inducing)
    assert np.allclose(np.sort(Z, axis=0), np.sort(Xs, axis=0), atol=1e-10)
    Xt = np.random.default_rng(7).normal(size=(6, 2))
    mean, cov = est.predict(Xt, return_cov=True)
    k, s2, mu = est.kernel_, float(est.likelihood_.variance), float(est.fit_result_.model.mean)
    Ts = (Xt - est.x_mean_) / est.x_scale_
    ys = (y - est.y_mean_) / est.y_scale_
    var, ell = float(k.variance), np.asarray(k.lengthscale)
    Kxx = _rbf(Xs, Xs, var, ell) + s2 * np.eye(len(Xs))
    Ktx = _rbf(Ts, Xs, var, ell)
    c_oracle = _rbf(Ts, Ts, var, ell) - Ktx @ np.linalg.solve(Kxx, Ktx.T) + s2 * np.eye(len(Ts))
    m_oracle = mu + Ktx @ np.linalg.solve(Kxx, ys - mu)
    scale = est.y_scale_
    np.testing.assert_allclose(mean, m_oracle * scale + est.y_mean_, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(cov, c_oracle * scale**2, rtol=1e-4, atol=1e-5 * scale**2)
    assert np.linalg.eigvalsh(cov).min() >= -1e-10
