"""Gaussian likelihoods learn hyperparameters on the collapsed bound (gpvi.fitting.collapsed).

Truths: the engine's VLB at its converged q (the bound is the VLB at the optimal q), SciPy's
multivariate normal density, scikit-learn's exact GP evidence and its own optimiser, and the
profile-bound search that fit() used before (gpvi.fitting.hyper.profile, run by disabling the dispatch).
"""
from unittest import mock

import numpy as np
import pytest
import scipy.stats

import gpvi
from gpvi.fitting import collapsed as collapsed
from gpvi import likelihoods as L
from gpvi._compile import bucket


def _data(rng, N=60, D=2):
    X = rng.normal(size=(N, D))
    y = np.sin(1.5 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=N)
    return X, y


def _models(X):
    lik = L.Gaussian(variance=0.3)
    return {
        "gp": gpvi.GP(gpvi.kernels.RBF(variance=0.8, lengthscale=[1.2, 0.7]), lik, mean=0.1),
        "sparse": gpvi.SparseGP(gpvi.kernels.RBF(variance=0.8, lengthscale=[1.2, 0.7]), lik,
                                inducing=X[:9], mean=0.1),
        "glm": gpvi.GLM(lik, prior_variance=0.7),
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gp", "sparse", "glm"])
def test_bound_is_the_vlb_at_the_optimal_q(rng, kind):
    X, y = _data(rng)
    offset = 0.2 * rng.normal(size=X.shape[0])
    model = _models(X)[kind]
    res = gpvi.fit(model, X, y, offset=offset, tol=1e-12)
    bound = collapsed.collapsed_bound(model, X, y, offset)
    assert bound == pytest.approx(res.vlb, rel=1e-10, abs=1e-9)


def test_gp_bound_is_the_exact_evidence(rng):
    X, y = _data(rng, N=37)  # padded to a bucket of 40 rows: padding must not change it
    assert bucket(37) > 37
    model = _models(X)["gp"]
    K = np.asarray(model.kernel(X, X))
    nugget = model.jitter * np.mean(np.diag(K))
    truth = scipy.stats.multivariate_normal(np.full(37, 0.1), K + (nugget + 0.3) * np.eye(37)).logpdf(y)
    assert collapsed.collapsed_bound(model, X, y) == pytest.approx(truth, rel=1e-10)


def test_glm_bound_is_the_linear_regression_evidence(rng):
    X, y = _data(rng, N=50, D=3)
    model = _models(X)["glm"]
    cov = 0.7 * X @ X.T + 0.3 * np.eye(50)
    truth = scipy.stats.multivariate_normal(np.zeros(50), cov).logpdf(y)
    assert collapsed.collapsed_bound(model, X, y) == pytest.approx(truth, rel=1e-10)


@pytest.mark.slow
def test_learned_optimum_is_the_exact_gp_optimum(rng):
    """Same optimum as scikit-learn's GaussianProcessRegressor (same kernel family, same start):
    scikit-learn's own evidence at gpvi's θ is at least its value at its own optimum, to 1e-6
    relative, and equals gpvi's final bound to 1e-6 relative."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    X, y = _data(rng, N=80)
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=[1.0, 1.0]), L.Gaussian(variance=0.1))
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance"]  # constant mean stays 0
    res = gpvi.fit(model, X, y, learn_hyperparameters=names)
    assert "collapsed bound" in res.message and res.converged

    k = ConstantKernel(1.0, (1e-5, 1e5)) * RBF([1.0, 1.0], (1e-5, 1e5)) + WhiteKernel(0.1, (1e-8, 1e5))
    gpr = GaussianProcessRegressor(k, alpha=1e-10, normalize_y=False, random_state=0).fit(X, y)
    theirs = gpr.log_marginal_likelihood_value_
    p = res.model.parameters()
    ours_theta = np.log(np.r_[float(p["kernel.variance"]), np.asarray(p["kernel.lengthscale"]),
                              float(p["likelihood.variance"])])
    at_ours = gpr.log_marginal_likelihood(ours_theta)
    assert at_ours >= theirs - 1e-6 * abs(theirs)
    assert res.vlb == pytest.approx(at_ours, rel=1e-6)
    assert res.vlb == pytest.approx(theirs, rel=1e-6)
    # the learned noise variance is scikit-learn's as well
    assert float(p["likelihood.variance"]) == pytest.approx(np.exp(gpr.kernel_.theta[-1]), rel=1e-2)


@pytest.mark.parametrize("kind", ["gp", "sparse"])
@pytest.mark.slow
def test_same_optimum_as_the_profile_search(rng, kind):
    X, y = _data(rng)
    model = _models(X)[kind]
    fast = gpvi.fit(model, X, y, learn_hyperparameters=True)
    with mock.patch.object(collapsed, "applies", lambda *a: False):
        slow = gpvi.fit(model, X, y, learn_hyperparameters=True)
    assert "collapsed" in fast.message and "collapsed" not in slow.message
    assert fast.vlb == pytest.approx(slow.vlb, rel=1e-7)
    a, b = fast.model.parameters(), slow.model.parameters()
    for name in ("kernel.variance", "kernel.lengthscale", "likelihood.variance", "mean"):
        np.testing.assert_allclose(np.asarray(a[name]), np.asarray(b[name]), rtol=2e-3)
    # q is the engine's at the learned θ: the bound there is the final VLB
    assert collapsed.collapsed_bound(fast.model, X, y) == pytest.approx(fast.vlb, rel=1e-10)


def test_non_gaussian_and_laplace_keep_the_profile_search(rng):
    X, y = _data(rng, N=30)
    assert not collapsed.applies(gpvi.GP(gpvi.kernels.RBF(), L.Bernoulli()), "fpi")
    assert not collapsed.applies(_models(X)["gp"], "laplace")
    assert collapsed.applies(_models(X)["gp"], "gradient")
    with pytest.raises(ValueError, match="Gaussian likelihood"):
        collapsed.collapsed_bound(gpvi.GP(gpvi.kernels.RBF(), L.Poisson()), X, np.ones(30))


def test_collapsed_bound_refuses_bad_targets_with_one_error():
    """Issue 30 §2: y shorter than X gave a raw broadcasting TypeError and NaN in y a NaN bound."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 1))
    model = gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Gaussian())
    with pytest.raises(ValueError, match="30 rows but y has 10"):
        collapsed.collapsed_bound(model, X, np.zeros(10))
    with pytest.raises(ValueError, match="NaN"):
        collapsed.collapsed_bound(model, X, np.r_[np.nan, np.zeros(29)])
    with pytest.raises(ValueError, match="offset"):
        collapsed.collapsed_bound(model, X, np.zeros(30), offset=np.zeros(7))


@pytest.mark.slow
def test_sparse_bound_gradient_against_finite_differences_of_a_dense_titsias_bound(rng):
    """The compiled sparse bound (projections L⁻¹K(Z, X) as a product with L⁻¹, whose derivative
    is in closed form) against Titsias' bound written densely in NumPy, log N(y | μ, Q + σ²I) −
    tr(K − Q)/(2σ²) with Q = K_xz K_zz⁻¹ K_zx, and its gradient against central differences of
    that NumPy bound; inducing inputs in near pairs make K(Z, Z) ill-conditioned (~1e6)."""
    from scipy.linalg import cho_factor, cho_solve

    from gpvi._module import flatten_params, unflatten_params

    X, y = _data(rng)
    Z = np.concatenate([X[:5], X[:5] + 0.02 * rng.normal(size=(5, 2))])
    model = gpvi.SparseGP(gpvi.kernels.RBF(variance=0.8, lengthscale=[1.2, 0.7]), L.Gaussian(variance=0.3),
                          inducing=Z, mean=0.1)
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance", "inducing"]
    data = collapsed._padded_data(model, X, y, np.zeros(len(y)), 2048)
    theta = flatten_params(model, names)

    def dense(th):
        m = unflatten_params(model, th)
        k = m.kernel
        Zm = np.asarray(m.inducing)
        Kzz = np.asarray(k(Zm, Zm))
        Kzz = Kzz + 1e-8 * np.mean(np.diag(Kzz)) * np.eye(len(Zm))  # the model's jitter
        Kzx = np.asarray(k(Zm, X))
        Q = Kzx.T @ cho_solve(cho_factor(Kzz, lower=True), Kzx)
        s2 = float(m.likelihood.variance)
        r = y - float(m.mean)
        C = Q + s2 * np.eye(len(y))
        cf = cho_factor(C, lower=True)
        logN = -0.5 * (r @ cho_solve(cf, r) + 2 * np.sum(np.log(np.diag(cf[0]))) + len(y) * np.log(2 * np.pi))
        return logN - 0.5 * (np.sum(np.asarray(k.diag(X))) - np.trace(Q)) / s2

    assert np.linalg.cond(np.asarray(model.kernel(Z, Z))) > 1e5
    value, grad = collapsed._value_and_grad(theta, model, data)
    assert -float(value) == pytest.approx(dense(theta), rel=1e-9)
    for n in names:
        base = np.asarray(theta[n], dtype=float)
        fd = np.zeros(base.size)
        for i in range(base.size):
            h = 1e-5 * max(1.0, abs(base.flat[i]))
            up, dn = base.copy(), base.copy()
            up.flat[i] += h
            dn.flat[i] -= h
            fd[i] = (dense({**theta, n: up}) - dense({**theta, n: dn})) / (2 * h)
        np.testing.assert_allclose(-np.ravel(np.asarray(grad[n])), fd, rtol=1e-5,
                                   atol=1e-6 * max(1.0, np.max(np.abs(fd))), err_msg=n)


@pytest.mark.slow  # two learned sparse fits (4 s): the quick subset stays under two minutes
def test_searches_over_many_unknowns_keep_more_correction_pairs(rng):
    """L-BFGS-B keeps SciPy's 10 correction pairs for a few hyperparameters and more for a search
    over inducing inputs (gpvi.fitting.lbfgs.memory): the collapsed search (Gaussian) and the
    profile search (Bernoulli) both pass it to SciPy.  Counted here from the problem's sizes:
    M·D inducing coordinates, D lengthscales, the kernel variance, the noise variance and the mean."""
    import scipy.optimize
    from gpvi.fitting.lbfgs import memory

    assert [memory(n) for n in (1, 200, 219, 220, 401, 4106, 10**6)] == [10, 10, 10, 11, 20, 200, 200]
    real, seen = scipy.optimize.minimize, []

    def spy(*args, **kwargs):
        seen.append((args[1].size, kwargs["options"].get("maxcor")))
        return real(*args, **kwargs)

    N, D, M = 300, 10, 30
    X = rng.normal(size=(N, D))
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    kern = gpvi.kernels.RBF(variance=1.0, lengthscale=np.ones(D))
    cases = [(gpvi.SparseGP(kern, L.Gaussian(variance=0.1), inducing=M), f + 0.1 * rng.normal(size=N),
              M * D + D + 3),
             (gpvi.SparseGP(kern, L.Bernoulli(), inducing=M), (f > 0).astype(float), M * D + D + 2)]
    for model, y, unknowns in cases:
        seen.clear()
        with mock.patch.object(scipy.optimize, "minimize", spy):
            fit = gpvi.fit(model, X, y, learn_hyperparameters=True, learn_inducing=True, max_rounds=3)
        assert np.isfinite(fit.vlb)
        assert seen == [(unknowns, unknowns // 20)], seen  # one pair per 20 unknowns: 15 and 15 here
