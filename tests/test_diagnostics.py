"""gpvi.diagnostics (Sheth & Khardon 2016, §3) and the stochastic-volatility likelihood.

Independent truths: γ = E[−∂²log p] integrated with ``scipy.integrate.quad`` from second
derivatives written out by hand here, finite differences of those quad values for ∂γ/∂v,
the Gaussian-density closed form of the Laplace γ, and the monotone bracketing of the
fixed-point iterates that Theorem 1's proof derives from Conditions 1 + 2a.
"""
import numpy as np
import pytest
from scipy import integrate, stats

import gpvi
from gpvi import diagnostics as D
from gpvi import likelihoods as L

SQ3 = 1.0 / np.sqrt(3.0)


def _quad_normal(fn, m, v):
    """∫ fn(f) N(f | m, v) df by adaptive quadrature over m ± 40 sd."""
    sd = np.sqrt(v)
    val, _ = integrate.quad(lambda f: fn(f) * stats.norm.pdf(f, m, sd), m - 40 * sd, m + 40 * sd,
                            limit=400, epsabs=0.0, epsrel=1e-12, points=[m])
    return val


# −∂²/∂f² log p(y|f), derived by hand (not from the code under test).
def _neg_d2_poisson(y, f):
    return np.exp(f)


def _neg_d2_exponential(y, f):  # log p = −f − y e^{−f}
    return y * np.exp(-f)


def _neg_d2_sv(y, f):  # log p = −½(log 2π + f + y² e^{−f})
    return 0.5 * y**2 * np.exp(-f)


def _neg_d2_logistic(y, f):
    s = 1.0 / (1.0 + np.exp(-f))
    return s * (1.0 - s)


def _neg_d2_studentt(y, f, nu=3.0, s=SQ3):
    r2, a = (y - f) ** 2, nu * s * s
    return (nu + 1.0) * (a - r2) / (a + r2) ** 2


POINTS = [(-1.5, 0.3), (0.0, 1.0), (0.7, 2.5), (2.0, 0.05), (-0.4, 6.0)]


@pytest.mark.parametrize("lik, d2, ys", [
    (L.Poisson(), _neg_d2_poisson, [0.0, 4.0]),
    (L.Exponential(), _neg_d2_exponential, [0.3, 2.0]),
    (L.StochasticVolatility(), _neg_d2_sv, [-1.3, 0.4]),
], ids=["poisson", "exponential", "sv"])
@pytest.mark.slow
def test_closed_form_gamma_equals_quad(lik, d2, ys):
    assert D.has_closed_form(lik)
    for y in ys:
        m = np.array([p[0] for p in POINTS])
        v = np.array([p[1] for p in POINTS])
        got = D.gamma(lik, y, m, v)
        want = [_quad_normal(lambda f, y=y: d2(y, f), mi, vi) for mi, vi in POINTS]
        np.testing.assert_allclose(got, want, rtol=1e-9)
        # ∂γ/∂v against central differences of the quad values.
        h = 1e-4
        g = lambda vv, mi, y=y: _quad_normal(lambda f: d2(y, f), mi, vv)  # noqa: E731
        fd = [(g(vi + h, mi) - g(vi - h, mi)) / (2 * h) for mi, vi in POINTS]
        np.testing.assert_allclose(D.gamma_slope(lik, y, m, v), fd, rtol=1e-6, atol=1e-12)


def test_remark1_closed_forms():
    m, v = np.linspace(-3, 3, 7), np.linspace(0.1, 5, 7)
    np.testing.assert_allclose(D.gamma(L.Poisson(), 2, m, v), np.exp(m + v / 2), rtol=1e-12)
    # gpvi's exponential has rate e^{−f} (mean e^f): the paper's y e^{m+v/2} with m → −m.
    np.testing.assert_allclose(D.gamma(L.Exponential(), 1.7, m, v), 1.7 * np.exp(-m + v / 2), rtol=1e-12)
    np.testing.assert_allclose(D.gamma(L.StochasticVolatility(), -0.8, m, v), 0.5 * 0.64 * np.exp(-m + v / 2),
                               rtol=1e-12)
    np.testing.assert_allclose(D.gamma(L.Gaussian(variance=0.25), 1.0, m, v), 4.0, rtol=1e-12)
    np.testing.assert_allclose(D.gamma_slope(L.Gaussian(variance=0.25), 1.0, m, v), 0.0, atol=1e-12)


def test_laplace_gamma_is_twice_the_gaussian_density():
    # E|y − f| has ∂/∂v = N(y | m, v) (heat equation), so γ = 2 N(y | m, v) / b.
    b, y = 0.7, 0.3
    m = np.array([-2.0, 0.0, 0.3, 1.0, 4.0])
    v = np.array([0.01, 0.5, 2.0, 3.0, 10.0])
    np.testing.assert_allclose(D.gamma(L.Laplace(scale=b), y, m, v), 2 * stats.norm.pdf(y, m, np.sqrt(v)) / b,
                               rtol=1e-10)


@pytest.mark.parametrize("lik, d2, y, rtol", [
    (L.Bernoulli(), _neg_d2_logistic, 1, 1e-7),
    # Student-t's log p has poles at f = y ± i·s√ν close to the real axis: Gauss–Hermite
    # converges more slowly at large v (200 points: ~1e-5 relative at v = 6).
    (L.StudentT(df=3.0, scale=SQ3), _neg_d2_studentt, 0.0, 1e-4),
], ids=["logistic", "studentt"])
def test_quadrature_gamma_equals_quad(lik, d2, y, rtol):
    assert not D.has_closed_form(lik)
    pts = POINTS + [(3.0, 0.01), (-2.5, 0.2)]  # Student-t: γ < 0 here
    m = np.array([p[0] for p in pts])
    v = np.array([p[1] for p in pts])
    want = np.array([_quad_normal(lambda f, y=y: d2(y, f), mi, vi) for mi, vi in pts])
    np.testing.assert_allclose(D.gamma(lik, y, m, v), want, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(D.gamma(lik, y, m, v, quadrature=1000), want, rtol=1e-8, atol=1e-12)
    if isinstance(lik, L.StudentT):
        assert np.any(want < 0)


def test_logistic_sign_map_near_zero_and_in_the_tails():
    """Fig. 1a: γ decreasing in v near m = 0 for small v, increasing for large |m|;
    checked against finite differences of a quad γ."""
    lik = L.Bernoulli()
    pts = [(0.0, 0.05), (0.5, 0.2), (-0.3, 0.5), (6.0, 0.5), (-7.0, 1.0), (8.0, 0.05)]
    m = np.array([p[0] for p in pts])
    v = np.array([p[1] for p in pts])
    h = 1e-4
    fd = np.array([(_quad_normal(lambda f: _neg_d2_logistic(1, f), mi, vi + h)
                    - _quad_normal(lambda f: _neg_d2_logistic(1, f), mi, vi - h)) / (2 * h) for mi, vi in pts])
    assert np.all(fd[:3] < 0) and np.all(fd[3:] > 0)
    for yy in (0, 1):  # the logistic γ does not depend on the label
        got = D.gamma_slope(lik, yy, m, v)
        np.testing.assert_allclose(got, fd, rtol=1e-5)
        np.testing.assert_allclose(D.gamma_slope(lik, yy, m, v, method="fd"), fd, rtol=1e-4)
    rep = D.check_conditions(lik, grid=(41, 40))
    i0 = np.argmin(np.abs(rep.m))
    assert np.all(rep.sign[:, i0, :3] == -1)  # m = 0, smallest v
    assert np.all(rep.sign[:, 0, :] == 1) and np.all(rep.sign[:, -1, :] == 1)  # m = ±10
    np.testing.assert_array_equal(rep.sign[0], rep.sign[1])


def test_checker_verdicts():
    poisson = D.check_conditions(L.Poisson(), grid=(30, 30))
    assert poisson.closed_form and poisson.condition1 and poisson.condition2a and not poisson.condition2b
    assert poisson.fraction_fail_2a == 0 and poisson.fraction_fail_2b == 1
    assert "2-cycle" in poisson.summary() and "Condition 2a holds" in poisson.summary()

    sv = D.check_conditions(L.StochasticVolatility(), y=[-2.0, 0.5, 3.0], grid=(30, 30))
    assert sv.condition1 and sv.condition2a and not sv.condition2b
    np.testing.assert_array_equal(sv.y_values, [-2.0, 0.5, 3.0])

    st = D.check_conditions(L.StudentT(df=3.0, scale=SQ3), grid=(30, 30))
    assert st.method != "closed form" and st.quadrature_points == D.DEFAULT_QUADRATURE
    assert not st.condition1 and 0 < st.fraction_fail_1 < 1
    assert not st.condition2a and not st.condition2b
    assert "Condition 1 fails" in st.summary()

    logit = D.check_conditions(L.Bernoulli(), grid=(30, 30))
    assert logit.condition1 and not logit.condition2a and not logit.condition2b
    assert 0 < logit.fraction_fail_2a < 1 and 0 < logit.fraction_fail_2b < 1
    assert "no guarantee" in logit.summary()

    gauss = D.check_conditions(L.Gaussian(variance=2.0), grid=(10, 10))
    assert gauss.condition1 and gauss.condition2a and gauss.condition2b
    assert np.all(gauss.sign == 0) and "part 2" in gauss.theorem

    lap = D.check_conditions(L.Laplace(scale=1.0), grid=(30, 30))
    assert lap.closed_form and lap.condition1 and not lap.condition2a and not lap.condition2b
    # Laplace slope sign is sign((y − m)² − v): check it directly.
    M, V = np.meshgrid(lap.m, lap.v, indexing="ij")
    clear = (np.abs(M**2 - V) > 1e-6) & (lap.gamma[0] > 0)  # γ underflows to 0 far out at small v
    np.testing.assert_array_equal(lap.sign[0][clear], np.sign(M**2 - V)[clear])


def test_check_conditions_y_handling_and_ordinal():
    # Bernoulli labels in user coding; ordinal with list-valued edges (traced under jit).
    r = D.check_conditions(L.Bernoulli(link="probit"), y=[0, 1, 1, 0], grid=(8, 8))
    np.testing.assert_array_equal(r.y_values, [-1.0, 1.0])
    o = D.check_conditions(L.Ordinal(edges=[-1.0, 0.0, 1.0]), grid=(12, 12))
    np.testing.assert_array_equal(o.y_values, [0, 1, 2, 3])
    assert o.condition1 and o.gamma.shape == (4, 12, 12)
    many = D.check_conditions(L.Gaussian(), y=np.linspace(-1, 1, 101), grid=(5, 5), max_values=7)
    assert many.y_subsampled and many.y_values.size == 7
    assert many.y_values[0] == -1 and many.y_values[-1] == 1
    d = many.as_dict()
    assert d["grid"] == [5, 5] and "summary" in d and "gamma" not in d
    assert np.shape(many.as_dict(arrays=True)["gamma"]) == (7, 5, 5)


def test_fd_and_forced_quadrature_agree_with_closed_form():
    m, v = np.array([-1.0, 0.5, 2.0]), np.array([0.2, 1.0, 4.0])
    lik = L.Poisson()
    np.testing.assert_allclose(D.gamma(lik, 3, m, v, quadrature=100), D.gamma(lik, 3, m, v), rtol=1e-10)
    np.testing.assert_allclose(D.gamma_slope(lik, 3, m, v, method="fd"), D.gamma_slope(lik, 3, m, v), rtol=1e-7)
    # Broadcasting: (2, 1) y against (3,) m, v.
    assert D.gamma(L.Bernoulli(), np.array([[0], [1]]), m, v).shape == (2, 3)


def test_bad_input_is_a_clear_value_error():
    with pytest.raises(ValueError, match="v .*positive"):
        D.gamma(L.Poisson(), 1, 0.0, 0.0)
    with pytest.raises(ValueError, match="Bernoulli support"):
        D.gamma(L.Bernoulli(), 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="m contains NaN"):
        D.gamma(L.Poisson(), 1, np.nan, 1.0)
    with pytest.raises(ValueError, match="method"):
        D.gamma_slope(L.Poisson(), 1, 0.0, 1.0, method="spline")
    with pytest.raises(ValueError, match="quadrature"):
        D.gamma(L.Bernoulli(), 1, 0.0, 1.0, quadrature=1)
    with pytest.raises(ValueError, match="likelihood"):
        D.gamma("logit", 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="v_range"):
        D.check_conditions(L.Poisson(), v_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="grid"):
        D.check_conditions(L.Poisson(), grid=(1, 10))

    class Custom(L.Likelihood):
        def log_prob(self, y, f):
            return -((y - f) ** 2)

    with pytest.raises(ValueError, match="pass y="):
        D.check_conditions(Custom())
    assert D.check_conditions(Custom(), y=[0.0], grid=(5, 5)).condition2b  # γ = 2 everywhere


@pytest.fixture(scope="module")
def poisson_gp():
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (60, 1))
    y = rng.poisson(np.exp(np.sin(2 * X[:, 0]) + 0.5))
    fit = gpvi.fit(gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=0.8), likelihood=L.Poisson()), X, y, tol=1e-9)
    return fit, X, y


def test_check_fit_poisson_gp(poisson_gp):
    fit, X, y = poisson_gp
    c = D.check_fit(fit, X, y)
    m, v = fit.predict_f(X)
    np.testing.assert_allclose(c.m, m)
    np.testing.assert_allclose(c.gamma, np.exp(m + v / 2), rtol=1e-10)
    assert c.fraction_increasing == 1.0 and c.condition1 and c.condition2a and not c.condition2b
    assert c.diagnostics == fit.diagnostics
    assert "increasing in v at 100%" in c.summary()
    # A subset fit checks the subset's rows.
    sub = gpvi.fit(gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=0.8), likelihood=L.Poisson()), X, y,
                   subset=np.arange(0, 60, 3), max_iter=3)
    cs = D.check_fit(sub, X, y)
    assert cs.m.shape == (20,)
    np.testing.assert_array_equal(cs.y, y[::3])


def test_check_fit_logistic_glm_first_iteration():
    rng = np.random.default_rng(4)
    X = np.column_stack([np.ones(300), rng.standard_normal((300, 4))])
    y = (X @ np.array([0.2, 2.0, -1.5, 1.0, 0.5]) + rng.logistic(size=300) > 0).astype(float)
    fit = gpvi.fit(gpvi.GLM(likelihood=L.Bernoulli(), prior_variance=1.0), X, y, engine="fpi", max_iter=1)
    c = D.check_fit(fit, X, y)
    assert c.fraction_increasing + c.fraction_decreasing + c.fraction_flat == pytest.approx(1.0)
    s = D.gamma_slope(L.Bernoulli(), y, c.m, c.v)
    np.testing.assert_array_equal(c.sign, np.sign(s))
    assert c.condition1
    assert c.condition2b == (c.fraction_increasing == 0)
    with pytest.raises(ValueError, match="FitResult"):
        D.check_fit("not a fit", X, y)


# ---- stochastic volatility ---------------------------------------------------------------
@pytest.mark.slow
def test_sv_expected_log_prob_and_moments_equal_quad():
    lik = L.StochasticVolatility()
    for y, m, v in [(0.7, -0.5, 0.3), (-2.0, 1.0, 2.0), (0.05, 0.0, 0.01), (3.0, -2.0, 5.0)]:
        logp = lambda f, y=y: stats.norm.logpdf(y, 0.0, np.exp(f / 2))  # noqa: E731
        want = _quad_normal(logp, m, v)
        ya, ma, va = (np.array([t]) for t in (y, m, v))
        assert float(lik.expected_log_prob(ya, ma, va)[0]) == pytest.approx(want, rel=1e-10, abs=1e-12)
        e, rho, lam = lik.variational_moments(ya, ma, va)
        # ρ = E[∂ log p] and λ = E[∂² log p] with the derivatives written out by hand.
        rho_ref = _quad_normal(lambda f, y=y: -0.5 + 0.5 * y**2 * np.exp(-f), m, v)
        assert float(rho[0]) == pytest.approx(rho_ref, rel=1e-9)
        assert float(lam[0]) == pytest.approx(-_quad_normal(lambda f, y=y: _neg_d2_sv(y, f), m, v), rel=1e-9)
        assert float(e[0]) == pytest.approx(want, rel=1e-10, abs=1e-12)
        dens = _quad_normal(lambda f, y=y: stats.norm.pdf(y, 0.0, np.exp(f / 2)), m, v)
        # Base-class Gauss–Hermite in log space: slow to converge for outlying y at large v.
        plp = float(lik.replace(quadrature_points=200).predictive_log_density(ya, ma, va)[0])
        assert plp == pytest.approx(np.log(dens), abs=1e-6)
        mean, var = lik.predict_mean_and_var(ma, va)
        assert float(mean[0]) == 0.0
        assert float(var[0]) == pytest.approx(_quad_normal(np.exp, m, v), rel=1e-9)


def test_sv_validation():
    lik = L.StochasticVolatility()
    np.testing.assert_array_equal(lik.validate([1, -2, 0]), [1.0, -2.0, 0.0])
    with pytest.raises(ValueError, match="NaN or infinite"):
        lik.validate([1.0, np.inf])
    with pytest.raises(ValueError, match="1-D"):
        lik.validate(np.zeros((2, 2)))


@pytest.mark.slow
def test_sv_gp_fit_fp_converges_and_matches_gradient():
    rng = np.random.default_rng(5)
    X = np.sort(rng.uniform(0, 10, 120))[:, None]
    f = 1.5 * np.sin(X[:, 0])
    y = rng.standard_normal(120) * np.exp(f / 2)
    model = gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=1.5), likelihood=L.StochasticVolatility())
    fp = gpvi.fit(model, X, y, engine="fpi", tol=1e-10, max_iter=200)
    assert fp.converged and fp.iterations < 50
    assert np.all(np.diff(fp.trace[:, 1]) > -1e-9)  # monotone ascent
    grad = gpvi.fit(model, X, y, engine="gradient", tol=1e-12, max_iter=5000)
    assert fp.vlb == pytest.approx(grad.vlb, abs=1e-5)
    m, _ = fp.predict_f(X)
    assert np.corrcoef(m, f)[0, 1] > 0.8  # recovers the log-variance
    c = D.check_fit(fp, X, y)
    assert c.condition1 and c.condition2a and c.fraction_increasing == 1.0


@pytest.mark.parametrize("lik, make_y", [
    (L.StochasticVolatility(), lambda r, f: r.standard_normal(f.size) * np.exp(f / 2)),
    (L.Poisson(), lambda r, f: r.poisson(np.exp(f)).astype(float)),
], ids=["sv", "poisson"])
def test_theorem1_bracketing_of_fp_iterates(lik, make_y):
    """C1 + 2a ⇒ T(Σ) ⪯ T³(Σ) ⪯ … ⪯ T⁴(Σ) ⪯ T²(Σ) ⪯ Σ for fixed m (Eq. 13), with
    T(V) = (I + Σ_i γ_i(m_i, v_i(V)) a_i a_iᵀ)⁻¹ in whitened GP coordinates and γ from gamma()."""
    rng = np.random.default_rng(6)
    n = 25
    x = np.sort(rng.uniform(0, 5, n))
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-8 * np.eye(n)
    A = np.linalg.cholesky(K)  # rows a_i
    y = make_y(rng, np.sin(x))
    mvec = A @ rng.standard_normal(n) * 0.5
    mi = A @ mvec

    def T(V):
        vi = np.einsum("ij,jk,ik->i", A, V, A)
        g = D.gamma(lik, y, mi, vi)
        return np.linalg.inv(np.eye(n) + (A.T * g) @ A)

    seq = [np.eye(n)]
    for _ in range(8):
        seq.append(T(seq[-1]))

    def psd(M):
        return np.min(np.linalg.eigvalsh(0.5 * (M + M.T))) > -1e-10

    for k in range(0, 5, 2):
        assert psd(seq[k] - seq[k + 2])  # even iterates decrease
        assert psd(seq[k + 3] - seq[k + 1])  # odd iterates increase
        assert psd(seq[k + 2] - seq[k + 1])  # odd below even


# ---- plot -----------------------------------------------------------------------------------
def test_plot_condition_map(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection, QuadMesh

    from gpvi.plots import plot_condition_map

    rep = D.check_conditions(L.Bernoulli(), y=[1], grid=(30, 20))
    pts = (np.array([0.0, 1.0, -5.0]), np.array([0.5, 1.0, 3.0]))
    ax = plot_condition_map(rep, points=pts)
    mesh = [c for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(mesh) == 1
    np.testing.assert_array_equal(np.asarray(mesh[0].get_array()).reshape(20, 30), rep.sign[0].T)
    scat = [c for c in ax.collections if isinstance(c, PathCollection)]
    np.testing.assert_allclose(scat[0].get_offsets(), np.column_stack(pts))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "γ decreasing in v" in labels and "γ increasing in v" in labels
    assert ax.get_xlabel() == "m" and ax.get_ylabel() == "v"
    path = tmp_path / "map.png"
    ax.figure.savefig(path)
    plt.close(ax.figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Probit: the sign differs between labels somewhere -> a "depends on y" class.
    pr = D.check_conditions(L.Bernoulli(link="probit"), grid=(20, 20))
    assert np.any(pr.combined_sign == 2)
    ax = plot_condition_map(pr, points=np.zeros((4, 2)) + 1.0, y_index=1)
    np.testing.assert_array_equal(np.asarray(ax.collections[0].get_array()).reshape(20, 20), pr.sign[1].T)
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="ConditionReport"):
        plot_condition_map("nope")
    with pytest.raises(ValueError, match="y_index"):
        plot_condition_map(pr, y_index=5)
