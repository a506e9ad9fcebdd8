"""``GPRegressor(noise="heteroscedastic")`` (issue 33): noise that grows with x is learned, so
the test NLPD beats the homoscedastic GP's; the predictive std follows the true noise; the
default hyperprior puts its noise prior on the log-noise latent; ``return_cov`` and
``sample_y`` are consistent with ``return_std``."""
import numpy as np
import pytest

import gpvi
from gpvi import GPRegressor, priors


def _data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 4.0, size=n)
    sd = 0.05 + 0.3 * x  # noise s.d. from 0.05 to 1.25
    y = np.sin(1.5 * x) + sd * rng.normal(size=n)
    return x[:, None], y, sd


@pytest.fixture(scope="module")
def fits():
    X, y, _ = _data(100, 0)
    het = GPRegressor(noise="heteroscedastic").fit(X, y)
    hom = GPRegressor().fit(X, y)
    return het, hom


def _nlpd(mean, std, y):
    return float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * ((y - mean) / std) ** 2))


@pytest.mark.slow
def test_heteroscedastic_noise_beats_the_homoscedastic_gp_on_test_nlpd(fits):
    het, hom = fits
    Xt, yt, sd = _data(400, 1)
    m_het, s_het = het.predict(Xt, return_std=True)
    m_hom, s_hom = hom.predict(Xt, return_std=True)
    assert np.all(np.isfinite(s_het)) and np.all(s_het > 0)
    assert _nlpd(m_het, s_het, yt) < _nlpd(m_hom, s_hom, yt) - 0.1
    # the predictive std grows with the noise: small at x near 0, large at x near 4
    lo, hi = Xt[:, 0] < 1.0, Xt[:, 0] > 3.0
    assert np.median(s_het[hi]) > 2.5 * np.median(s_het[lo])
    # ... close to the true noise s.d. where the noise dominates (x > 3: 0.95 to 1.25)
    assert 0.6 < np.median(s_het[hi]) / np.median(sd[hi]) < 1.5
    assert het.fit_result_.converged


@pytest.mark.slow
def test_the_default_hyperprior_targets_the_log_noise_latent(fits):
    het, _ = fits
    prior = priors.weak(het.fit_result_.model, noise=True, dimensions=1)
    assert prior["latents.1.mean"] == priors.Normal(np.log(0.1), 1.5)
    assert prior["latents.1.kernel.variance"] == priors.LogNormal(np.log(0.25), 1.0)
    assert prior["latents.0.kernel.variance"] == priors.LogNormal(0.0, 2.0)
    assert "log_prior" in het.fit_result_.extras


@pytest.mark.slow
def test_return_cov_and_sample_y_agree_with_return_std(fits):
    het, _ = fits
    Xt = np.linspace(0.2, 3.8, 7)[:, None]
    mean, std = het.predict(Xt, return_std=True)
    mean_c, cov = het.predict(Xt, return_cov=True)
    np.testing.assert_allclose(mean_c, mean, rtol=1e-12)
    np.testing.assert_allclose(np.diag(cov), std**2, rtol=1e-10)
    assert np.linalg.eigvalsh(cov).min() > -1e-10
    draws = het.sample_y(Xt, n_samples=20000, random_state=3)
    assert draws.shape == (7, 20000)
    # y = f + e^g ε: mean m_f and variance v_f + E[e^{2g}] = the predictive's, within MC error
    se = std / np.sqrt(20000)
    assert np.all(np.abs(draws.mean(axis=1) - mean) < 4.5 * se)
    np.testing.assert_allclose(draws.var(axis=1), std**2, rtol=0.06)


def test_heteroscedastic_is_a_listed_noise():
    with pytest.raises(ValueError, match="heteroscedastic"):
        GPRegressor(noise="bogus").fit(np.zeros((5, 1)), np.arange(5.0))
    assert gpvi.HeteroscedasticGaussian().num_latents == 2
