"""Metrics against hand-computed values; predictions against Monte Carlo and identities."""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi import metrics


def test_metrics_hand_computed():
    y = np.array([0.0, 2.0, 4.0, 1.0])
    yhat = np.array([1.0, 2.0, 2.0, 2.0])
    assert metrics.mae(y, yhat) == pytest.approx((1 + 0 + 2 + 1) / 4)
    assert metrics.sse(y, yhat) == pytest.approx(1 + 0 + 4 + 1)
    assert metrics.rmse(y, yhat) == pytest.approx(np.sqrt(6 / 4))
    assert metrics.nmse(y, yhat) == pytest.approx((6 / 4) / np.var(y))
    # MFE: |y − ŷ| / max(y, 1) → 1/1, 0/2, 2/4, 1/1
    assert metrics.mfe(y, yhat) == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert metrics.error_rate([1, 0, 1, 1], [1, 1, 1, 0]) == pytest.approx(0.5)
    assert metrics.mze is metrics.error_rate
    assert metrics.nlpd([-1.0, -3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="length"):
        metrics.mae([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        metrics.rmse([], [])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.uniform(-2, 2, (300, 1))
    f = np.sin(2 * X[:, 0])
    return rng, X, f


def _mc(lik, m, v, rng, n=400_000):
    f = m + np.sqrt(v) * rng.standard_normal(n)
    return f


def test_bernoulli_probabilities(data):
    rng, X, f = data
    y = (rng.uniform(size=300) < 1 / (1 + np.exp(-3 * f))).astype(int)
    fit = gpvi.fit(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Bernoulli(), inducing=10), X, y)
    Xs = np.array([[-1.0], [0.3], [1.2]])
    p = fit.predict_proba(Xs)
    np.testing.assert_allclose(p.sum(1), 1.0)
    m, v = fit.predict_f(Xs)
    for i in range(3):  # P(y=1) = E[σ(f)] by Monte Carlo
        ff = _mc(None, m[i], v[i], rng)
        assert p[i, 1] == pytest.approx(np.mean(1 / (1 + np.exp(-ff))), abs=3e-3)
    # log predictive density of the observed class equals log of its probability
    np.testing.assert_allclose(fit.log_predictive_density(Xs, [1, 0, 1]), np.log([p[0, 1], p[1, 0], p[2, 1]]), rtol=1e-6)


def test_ordinal_probabilities_and_mean(data):
    rng, X, f = data
    y = np.digitize(2 * f + 0.5 * rng.logistic(size=300), [-1.0, 1.0])
    lik = L.Ordinal(edges=np.array([-1.0, 1.0]), shape=2.0)
    fit = gpvi.fit(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=10), X, y)
    Xs = np.array([[-1.0], [0.0], [1.0]])
    p = fit.predict_proba(Xs)
    assert p.shape == (3, 3)
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-8)
    mean, _ = fit.predict_y(Xs)
    np.testing.assert_allclose(mean, p @ np.arange(3), rtol=1e-10)
    assert np.argmax(p[0]) == 0 and np.argmax(p[2]) == 2  # follows sin(2x)


def test_poisson_predictive_moments_against_monte_carlo(data):
    rng, X, f = data
    y = rng.poisson(np.exp(f))
    fit = gpvi.fit(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=10), X, y)
    Xs = np.array([[0.7]])
    m, v = fit.predict_f(Xs)
    mean, var = fit.predict_y(Xs)
    ff = _mc(None, m[0], v[0], rng)
    counts = rng.poisson(np.exp(ff))
    assert mean[0] == pytest.approx(counts.mean(), rel=1e-2)
    assert var[0] == pytest.approx(counts.var(), rel=2e-2)


def test_progress_display_writes_to_stderr(data, capsys):
    rng, X, f = data
    y = rng.poisson(np.exp(f))
    gpvi.fit(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=5), X, y, progress=True)
    err = capsys.readouterr().err
    assert "gpvi fpi" in err and "vlb" in err
