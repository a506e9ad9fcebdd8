"""Warped Gaussian likelihood (gpvi.warped), GPRegressor(noise="warped") and the LGCP helpers
(gpvi.pointprocess), against numerical integration, quadrature and finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

import gpvi
from gpvi import GP, Warped, kernels
from gpvi import likelihoods as L
from gpvi.pointprocess import bin_events, intensity_moments


def _warp():
    return Warped(L.Gaussian(variance=0.3), a=[1.5, 0.7], b=[0.8, 2.0], c=[0.5, -1.0], quadrature_points=60)


@pytest.mark.slow
def test_density_integrates_to_one_and_is_a_change_of_variables():
    w = _warp()
    ys = np.linspace(-30, 30, 200001)
    for f in (-2.0, 0.0, 1.3):
        p = np.exp(np.asarray(w.log_prob(jnp.asarray(ys), f)))
        assert abs(scipy.integrate.trapezoid(p, ys) - 1.0) < 1e-6
    # the Jacobian equals the derivative of the warping (autodiff of t, an independent route)
    y = jnp.linspace(-4, 4, 9)
    dt = jax.vmap(jax.grad(lambda u: w.warp(u)))(y)
    np.testing.assert_allclose(np.exp(np.asarray(w.log_jacobian(y))), np.asarray(dt), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(w.unwarp(w.warp(y))), np.asarray(y), atol=1e-12)


@pytest.mark.slow
def test_expectation_matches_quadrature_of_log_prob():
    w = _warp()
    y, m, v = jnp.asarray([-1.0, 0.4, 2.5]), jnp.asarray([0.0, 1.0, -0.5]), jnp.asarray([0.2, 1.0, 0.5])
    e_ref, r_ref, l_ref = w.quadrature_moments(y, m, v)  # Gauss–Hermite of log p and its derivatives
    e, r, l = w.variational_moments(y, m, v)
    for a, b in ((e, e_ref), (r, r_ref), (l, l_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_predictions_in_y_space_by_numerical_integration():
    w = _warp()
    m, v = 0.7, 0.4
    mean, var = (float(t[0]) for t in w.predict_mean_and_var(jnp.asarray([m]), jnp.asarray([v])))
    ys = np.linspace(-25, 25, 400001)
    p = np.exp(np.asarray(w.predictive_log_density(jnp.asarray(ys), m, v)))
    assert abs(scipy.integrate.trapezoid(p, ys) - 1.0) < 1e-6
    ref_mean = scipy.integrate.trapezoid(ys * p, ys)
    ref_var = scipy.integrate.trapezoid((ys - ref_mean) ** 2 * p, ys)
    assert abs(mean - ref_mean) < 1e-5 and abs(var - ref_var) < 1e-4 * ref_var
    # the median is t⁻¹(m): half the predictive mass below it
    med = float(w.predict_median(jnp.asarray([m]), None)[0])
    assert abs(scipy.integrate.trapezoid(np.where(ys < med, p, 0.0), ys) - 0.5) < 1e-4


def test_warping_parameter_gradients_by_finite_differences():
    y, m, v = jnp.asarray([-1.0, 0.4, 2.5]), jnp.asarray([0.0, 1.0, -0.5]), jnp.asarray([0.2, 1.0, 0.5])

    def total(a, b, c):
        return jnp.sum(Warped(L.Gaussian(variance=0.3), a=a, b=b, c=c).expected_log_prob(y, m, v))

    args = [jnp.asarray([1.5, 0.7]), jnp.asarray([0.8, 2.0]), jnp.asarray([0.5, -1.0])]
    grads = jax.grad(total, argnums=(0, 1, 2))(*args)
    h = 1e-6
    for k in range(3):
        for j in range(2):
            up = [a.at[j].add(h) if i == k else a for i, a in enumerate(args)]
            dn = [a.at[j].add(-h) if i == k else a for i, a in enumerate(args)]
            fd = (float(total(*up)) - float(total(*dn))) / (2 * h)
            assert abs(float(grads[k][j]) - fd) < 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize("kw, word", [
    (dict(a=[-1.0], b=[1.0], c=[0.0]), "monotone"), (dict(a=[1.0], b=[0.0], c=[0.0]), "monotone"),
    (dict(a=[1.0, 1.0], b=[1.0], c=[0.0]), "one length"), (dict(a=[np.nan], b=[1.0], c=[0.0]), "finite"),
])
def test_bad_warping(kw, word):
    with pytest.raises(ValueError, match=word):
        Warped(L.Gaussian(), **kw)
    with pytest.raises(ValueError, match="likelihood"):
        Warped(L.Poisson())


@pytest.mark.slow
def test_warped_regressor_beats_plain_gp_on_warped_data():
    # y = t⁻¹(f + noise) for a strongly skewing monotone map: a warped GP should assign the
    # held-out data a clearly higher density than plain GP regression
    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, (240, 1))
    z = np.sin(1.5 * X[:, 0]) + 0.15 * rng.standard_normal(240)
    y = np.exp(1.2 * z)  # log-normal-like targets: t = log is monotone
    Xtr, ytr, Xte, yte = X[:160], y[:160], X[160:], y[160:]

    def nlpd(est):
        mean, sd = est.predict(Xte, return_std=True)
        fr = est.fit_result_
        m, v = fr.predict_f((Xte - est.x_mean_) / est.x_scale_)
        yt = (yte - est.y_mean_) / est.y_scale_
        lp = np.asarray(fr.model.likelihood.predictive_log_density(jnp.asarray(yt), jnp.asarray(m), jnp.asarray(v)))
        return float(np.mean(-(lp - np.log(est.y_scale_))))

    plain = gpvi.GPRegressor(noise="gaussian").fit(Xtr, ytr)
    warped = gpvi.GPRegressor(noise="warped").fit(Xtr, ytr)
    assert isinstance(warped.fit_result_.model.likelihood, Warped)
    assert nlpd(warped) < nlpd(plain) - 0.2, (nlpd(warped), nlpd(plain))
    pred = warped.predict(Xte)
    assert pred.shape == (80,) and np.all(np.isfinite(pred))


# ---- LGCP ------------------------------------------------------------------------------------
def test_bin_events_counts_and_exposure():
    t = np.array([0.1, 0.2, 2.5, 9.99, 5.0, 5.0])
    c, n, e = bin_events(t, start=0.0, stop=10.0, num_bins=4)
    np.testing.assert_allclose(c, [1.25, 3.75, 6.25, 8.75])
    np.testing.assert_array_equal(n, [2, 1, 2, 1])
    np.testing.assert_allclose(e, 2.5)
    c, n, e = bin_events(t, start=0.0, stop=10.0, bin_width=3.0)
    np.testing.assert_array_equal(n, [3, 2, 0, 1])
    np.testing.assert_allclose(e, [3, 3, 3, 1])
    assert n.sum() == t.size and abs(e.sum() - 10.0) < 1e-12


@pytest.mark.parametrize("kw, word", [
    (dict(num_bins=0), "num_bins"), (dict(), "exactly one"), (dict(num_bins=3, bin_width=1.0), "exactly one"),
    (dict(bin_width=-1.0), "bin_width"), (dict(num_bins=3, stop=0.5), "outside"),
])
def test_bin_events_bad_input(kw, word):
    with pytest.raises(ValueError, match=word):
        bin_events([0.1, 0.7, 0.9], start=0.0, **{"stop": 1.0, **kw})


def test_lgcp_recipe_recovers_a_constant_rate():
    rng = np.random.default_rng(0)
    T, rate = 1000.0, 0.3
    times = np.sort(rng.uniform(0, T, rng.poisson(rate * T)))
    c, n, e = bin_events(times, start=0.0, stop=T, num_bins=50)
    model = GP(kernels.RBF(variance=0.1, lengthscale=500.0), L.Poisson(), mean=float(np.log(times.size / T)))
    res = gpvi.fit(model, c[:, None], n, exposure=e)
    m, v = res.predict_f(c[:, None])
    mean, var = (np.asarray(a) for a in intensity_moments(m, v))
    # the posterior intensity stays near the empirical rate (a smooth prior, 300 events)
    assert np.all(np.abs(mean / (times.size / T) - 1.0) < 0.35)
    # the paper's parameterisation (no exposure, the bin width in the prior mean) is the same
    # model for equal bins: the same posterior, shifted by log(width)
    per_bin = gpvi.fit(model.replace(mean=float(np.log(times.size / 50))), c[:, None], n)
    m2, v2 = per_bin.predict_f(c[:, None])
    np.testing.assert_allclose(m2 - np.log(e), m, atol=1e-5)
    np.testing.assert_allclose(v2, v, rtol=1e-5)
    assert abs(per_bin.vlb - res.vlb) < 1e-6 * abs(res.vlb)
    # the lognormal moments, against sampling
    mc = np.exp(m[0] + np.sqrt(v[0]) * rng.standard_normal(400000))
    assert abs(mc.mean() - mean[0]) < 0.01 * mean[0] and abs(mc.var() - var[0]) < 0.05 * var[0]


@pytest.mark.slow
def test_warped_and_montecarlo_models_save_and_load(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = np.exp(X[:, 0] + 0.1 * rng.normal(size=40))
    est = gpvi.GPRegressor(noise="warped", max_rounds=3).fit(X, y)
    gpvi.io.save(est, tmp_path / "w.gpvi")
    back = gpvi.io.load(tmp_path / "w.gpvi")
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    assert isinstance(back.fit_result_.model.likelihood, Warped)
    res = gpvi.fit(GP(kernels.RBF(), gpvi.MonteCarlo(L.Bernoulli(), num_samples=64, seed=5)), X, X[:, 1] > 0)
    gpvi.io.save(res, tmp_path / "m.gpvi")
    lik = gpvi.io.load(tmp_path / "m.gpvi").model.likelihood
    assert isinstance(lik, gpvi.MonteCarlo) and lik.num_samples == 64 and lik.seed == 5
