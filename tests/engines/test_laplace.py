"""The Laplace engine against independent truths.

Oracles: exact GP regression and the subset-of-regressors marginal (closed forms in NumPy),
GPML Algorithms 3.1/3.2 (Rasmussen & Williams 2006) written here in NumPy, SciPy's
minimiser on the negative log posterior, central finite differences, and the variational
engines (whose optimum bounds the VLB of any Gaussian, the Laplace one included).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Whole-engine checks with many JAX compilations: in the full suite, not in the quick subset
# (`-m "not slow"`); `tests/fitting/test_fit_options.py` and the CLI tests keep a quick path through fit().
pytestmark = pytest.mark.slow
import scipy.optimize
from scipy.special import expit, gammaln

import gpvi
from gpvi import likelihoods as L
from gpvi.engines.laplace import laplace_log_marginal, laplace_log_marginal_at
from gpvi.objective import Objective, make_chunks, prior_state


def _jittered(K, jitter=1e-8):
    # gpvi adds jitter·mean(diag K) to the prior covariance (a nugget); the oracle uses the same.
    return K + jitter * np.mean(np.diag(K)) * np.eye(K.shape[0])


def _gauss_logpdf(r, C):
    c = np.linalg.cholesky(C)
    a = np.linalg.solve(c, r)
    return -0.5 * a @ a - np.sum(np.log(np.diag(c))) - 0.5 * len(r) * np.log(2 * np.pi)


def _binary_data(rng, N, D=1, scale=2.0):
    X = rng.uniform(-3, 3, (N, D))
    f = scale * np.sin(X[:, 0]) + (0.5 * X[:, 1] if D > 1 else 0.0)
    y = (rng.uniform(size=N) < expit(f)).astype(int)
    return X, y


# ---- Gaussian likelihood: closed forms -------------------------------------------------------
def test_gaussian_full_gp_log_marginal_is_exact(rng):
    N = 60
    X = rng.uniform(-3, 3, (N, 2))
    y = np.sin(X[:, 0]) + 0.3 * rng.standard_normal(N)
    kernel = gpvi.kernels.Matern52(variance=1.3, lengthscale=[0.9, 1.7])
    noise, mu = 0.1, 0.4
    model = gpvi.GP(kernel=kernel, likelihood=L.Gaussian(variance=noise), mean=mu)
    K = _jittered(np.asarray(kernel(X, X)))
    ref = _gauss_logpdf(y - mu, K + noise * np.eye(N))
    np.testing.assert_allclose(float(laplace_log_marginal(model, X, y)), ref, rtol=1e-8)
    res = gpvi.fit(model, X, y, engine="laplace", tol=1e-12)
    assert res.converged
    np.testing.assert_allclose(res.extras["log_marginal"], ref, rtol=1e-8)
    # For Gaussian noise the Laplace approximation is the exact posterior, so its VLB is the
    # log marginal likelihood too (the bound is tight).
    np.testing.assert_allclose(res.vlb, ref, rtol=1e-8)


def test_gaussian_sparse_log_marginal_is_the_subset_of_regressors_marginal(rng):
    # The Laplace approximation of the sparse model is that of the projected (SoR) model,
    # whose marginal is N(y | μ, Q_nn + σ²I) with Q_nn = K_nm K_mm⁻¹ K_mn (c_i ignored).
    N, M = 150, 12
    X = rng.uniform(-3, 3, (N, 1))
    y = np.cos(2 * X[:, 0]) + 0.2 * rng.standard_normal(N)
    Z = np.linspace(-3, 3, M)[:, None]
    kernel = gpvi.kernels.RBF(variance=0.8, lengthscale=0.6)
    model = gpvi.SparseGP(kernel=kernel, likelihood=L.Gaussian(variance=0.05), inducing=Z, mean=-0.2)
    Kmm = _jittered(np.asarray(kernel(Z, Z)))
    Knm = np.asarray(kernel(X, Z))
    Q = Knm @ np.linalg.solve(Kmm, Knm.T)
    ref = _gauss_logpdf(y + 0.2, Q + 0.05 * np.eye(N))
    np.testing.assert_allclose(float(laplace_log_marginal(model, X, y)), ref, rtol=1e-8)


def _gaussian_models(rng):
    N = 200
    X = rng.uniform(-3, 3, (N, 2))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.2 * rng.standard_normal(N)
    k = gpvi.kernels.RBF(variance=1.1, lengthscale=[1.0, 1.4])
    lik = L.Gaussian(variance=0.06)
    Xg = np.column_stack([np.ones(N), X, X**2])
    return {
        "GLM": (gpvi.GLM(likelihood=lik, prior_variance=2.0), Xg, y),
        "GP": (gpvi.GP(kernel=k, likelihood=lik, mean=0.1), X, y),
        "SparseGP": (gpvi.SparseGP(kernel=k, likelihood=lik, inducing=X[:25], mean=0.1), X, y),
    }


@pytest.mark.parametrize("kind", ["GLM", "GP", "SparseGP"])
def test_gaussian_laplace_vlb_equals_fixed_point_optimum(rng, kind):
    # For Gaussian noise the Laplace posterior is the VLB optimum (for the sparse model: the
    # Titsias optimum), so its VLB equals the fpi optimum.
    model, X, y = _gaussian_models(rng)[kind]
    lap = gpvi.fit(model, X, y, engine="laplace", tol=1e-12)
    fpi = gpvi.fit(model, X, y, engine="fpi", tol=1e-12)
    assert lap.converged and fpi.converged
    assert abs(lap.trace[0, 1] - fpi.vlb) > 1.0  # the start is far from the optimum
    np.testing.assert_allclose(lap.vlb, fpi.vlb, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(lap.state.mean), np.asarray(fpi.state.mean), rtol=1e-6, atol=1e-8)
    # Newton is exact in one step on a quadratic Ψ.
    assert lap.extras["newton_iterations"] <= 2


# ---- logistic GP: GPML Algorithms 3.1 and 3.2 -----------------------------------------------
def _gpml_alg_3_1(K, y, tol=1e-14, max_iter=100):
    """Mode f̂ and log q(y|X) of the logistic GP Laplace approximation (RW2006, Alg. 3.1)."""
    t = (y + 1) / 2  # y in {−1, +1}
    f = np.zeros(len(y))
    obj_old = -np.inf
    for _ in range(max_iter):
        pi = expit(f)
        W = pi * (1 - pi)
        sW = np.sqrt(W)
        B = np.eye(len(y)) + sW[:, None] * K * sW[None, :]
        Lb = np.linalg.cholesky(B)
        b = W * f + (t - pi)
        a = b - sW * np.linalg.solve(Lb.T, np.linalg.solve(Lb, sW * (K @ b)))
        f = K @ a
        obj = -0.5 * a @ f + np.sum(-np.logaddexp(0, -y * f))
        if abs(obj - obj_old) < tol:
            break
        obj_old = obj
    pi = expit(f)
    W = pi * (1 - pi)
    sW = np.sqrt(W)
    Lb = np.linalg.cholesky(np.eye(len(y)) + sW[:, None] * K * sW[None, :])
    a = np.linalg.solve(K, f)
    log_z = -0.5 * a @ f + np.sum(-np.logaddexp(0, -y * f)) - np.sum(np.log(np.diag(Lb)))
    return f, log_z, (t - pi), sW, Lb


def test_logistic_gp_matches_gpml_algorithms_3_1_and_3_2(rng):
    N = 40
    X, y01 = _binary_data(rng, N)
    y = 2.0 * y01 - 1.0
    kernel = gpvi.kernels.RBF(variance=2.5, lengthscale=0.8)
    model = gpvi.GP(kernel=kernel, likelihood=L.Bernoulli(), mean=0.0)
    K = _jittered(np.asarray(kernel(X, X)))
    f_hat, log_z, grad, sW, Lb = _gpml_alg_3_1(K, y)

    res = gpvi.fit(model, X, y01, engine="laplace", tol=1e-12)
    assert res.converged and res.extras["hessian"] == "exact"
    m_train, _ = res.predict_f(X)
    np.testing.assert_allclose(m_train, f_hat, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(res.extras["log_marginal"], log_z, rtol=1e-8)
    # Chunked sums with padding (6 chunks of 7 rows for 40, 2 of them padding) give the same value.
    np.testing.assert_allclose(float(laplace_log_marginal(model, X, y01, chunk_size=7)), log_z, rtol=1e-8)

    # Algorithm 3.2: predictive latent mean and variance at new inputs.
    Xs = np.linspace(-3.5, 3.5, 25)[:, None]
    Ks = np.asarray(kernel(X, Xs))
    nugget = K[0, 0] - float(np.asarray(kernel(X[:1], X[:1]))[0, 0])
    mean_ref = Ks.T @ grad
    v = np.linalg.solve(Lb, sW[:, None] * Ks)
    var_ref = np.asarray(kernel.diag(Xs)) + nugget - np.sum(v * v, 0)
    m, var = res.predict_f(Xs)
    np.testing.assert_allclose(m, mean_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var, var_ref, rtol=1e-8, atol=1e-10)


# ---- Poisson GLM: mode against SciPy -------------------------------------------------------
def test_poisson_glm_mode_matches_scipy(rng):
    N, sp2 = 300, 0.5
    X = np.column_stack([np.ones(N), rng.standard_normal((N, 3))])
    beta = np.array([0.5, 0.4, -0.3, 0.2])
    y = rng.poisson(np.exp(X @ beta))

    def neg_psi(b):
        f = X @ b
        return -(np.sum(y * f - np.exp(f) - gammaln(y + 1)) - 0.5 * b @ b / sp2)

    def neg_psi_grad(b):
        return -(X.T @ (y - np.exp(X @ b)) - b / sp2)

    ref = scipy.optimize.minimize(neg_psi, np.zeros(4), jac=neg_psi_grad, method="BFGS",
                                  options={"gtol": 1e-11})
    res = gpvi.fit(gpvi.GLM(likelihood=L.Poisson(), prior_variance=sp2), X, y, engine="laplace", tol=1e-12)
    assert res.converged
    Xs = np.eye(4)  # f at unit vectors = the weights themselves
    m, var = res.predict_f(Xs)
    np.testing.assert_allclose(m, ref.x, rtol=1e-6, atol=1e-8)
    # Covariance: the inverse Hessian of −Ψ at the mode, in closed form.
    Hb = X.T @ (np.exp(X @ ref.x)[:, None] * X) + np.eye(4) / sp2
    np.testing.assert_allclose(var, np.diag(np.linalg.inv(Hb)), rtol=1e-6)
    # Log marginal in β-coordinates: log p(y|β̂) + log N(β̂|0, σ²I) + ½ d log 2π − ½ log|Hb|.
    log_z = -ref.fun - 2 * np.log(2 * np.pi * sp2) + 2 * np.log(2 * np.pi) - 0.5 * np.linalg.slogdet(Hb)[1]
    np.testing.assert_allclose(res.extras["log_marginal"], log_z, rtol=1e-9)


# ---- hyperparameter gradients against finite differences ---------------------------------
def _gp_with(kind, theta, X):
    log_var, log_ls = theta[0], theta[1]
    kernel = gpvi.kernels.RBF(variance=jnp.exp(log_var), lengthscale=jnp.exp(log_ls))
    if kind == "logit":
        return gpvi.GP(kernel=kernel, likelihood=L.Bernoulli(), mean=0.0)
    return gpvi.GP(kernel=kernel, likelihood=L.Poisson(), mean=theta[2])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["logit", "poisson"])
def test_log_marginal_gradient_matches_finite_differences(rng, kind):
    N = 40
    X = rng.uniform(-3, 3, (N, 1))
    if kind == "logit":
        y = (rng.uniform(size=N) < expit(3 * np.sin(X[:, 0]))).astype(int)
        theta = np.log([1.5, 0.9])
    else:
        y = rng.poisson(np.exp(0.5 + np.sin(2 * X[:, 0])))
        theta = np.array([np.log(0.8), np.log(0.7), 0.3])

    def value(t):
        return laplace_log_marginal(_gp_with(kind, t, X), X, y)

    val, grad = jax.value_and_grad(value)(jnp.asarray(theta))
    grad = np.asarray(grad)
    h = 1e-5
    fd = np.array([(float(value(theta + h * e)) - float(value(theta - h * e))) / (2 * h)
                   for e in np.eye(len(theta))])
    assert np.all(np.abs(fd) > 0.1)  # a gradient far from zero: the check can fail
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    # The value under autodiff is the plain value.
    np.testing.assert_allclose(float(val), float(value(theta)), rtol=1e-12)


@pytest.mark.slow
def test_one_newton_step_gives_the_implicit_derivative(rng):
    # Holding the mode fixed (no Newton step) would miss the implicit term dŵ/dθ; the
    # one-step construction must differ from that and agree with finite differences
    # (checked above).  Here: the naive derivative is measurably different.
    N = 40
    X = rng.uniform(-3, 3, (N, 1))
    y = rng.poisson(np.exp(0.5 + np.sin(2 * X[:, 0])))
    theta = jnp.asarray(np.array([np.log(0.8), np.log(0.7), 0.3]))
    chunks = make_chunks(X, y)
    mode = Objective(_gp_with("poisson", theta, X), X, y)
    w = gpvi.engines.ENGINES["laplace"](mode, prior_state(N), tol=1e-13).state.mean

    def naive(t):
        mdl = _gp_with("poisson", t, X)
        prior = mdl.prior_cache(jnp.asarray(X))
        At, b, _ = mdl.project(prior, jnp.asarray(X))
        f = w @ At + b
        lam = jnp.exp(f)
        H = jnp.eye(N) + (At * lam) @ At.T
        return jnp.sum(y * f - lam - gammaln(y + 1)) - 0.5 * w @ w - 0.5 * jnp.linalg.slogdet(H)[1]

    g_naive = np.asarray(jax.grad(naive)(theta))
    g_step = np.asarray(jax.grad(lambda t: laplace_log_marginal_at(_gp_with("poisson", t, X), X, chunks, w))(theta))
    np.testing.assert_allclose(float(naive(theta)),
                               float(laplace_log_marginal_at(_gp_with("poisson", theta, X), X, chunks, w)),
                               rtol=1e-10)
    assert np.max(np.abs(g_naive - g_step)) > 1e-3 * np.max(np.abs(g_step))


def test_uncached_chunked_passes_agree_with_cached(rng):
    # The engine over padded chunks with projections recomputed per pass (cache_bytes=0)
    # reaches the same Laplace approximation as over one cached chunk; callback sees each row.
    N = 90
    X = rng.uniform(-3, 3, (N, 2))
    y = rng.poisson(np.exp(0.3 + np.sin(X[:, 0])))
    model = gpvi.SparseGP(kernel=gpvi.kernels.Matern32(variance=0.7, lengthscale=1.2),
                          likelihood=L.Poisson(), inducing=X[:15], mean=0.2)
    run = gpvi.engines.ENGINES["laplace"]
    a = run(Objective(model, X, y), prior_state(15), tol=1e-12)
    seen = []
    obj = Objective(model, X, y, chunk_size=13, cache_bytes=0, blocks=3)  # 3 row blocks of 5
    assert not obj.cached and obj.chunks.mask.shape == (7, 13)  # one padded row
    b = run(obj, prior_state(15), tol=1e-12, callback=lambda i, v, t: seen.append((i, v)))
    assert a.converged and b.converged
    np.testing.assert_allclose(np.asarray(b.state.mean), np.asarray(a.state.mean), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(b.state.chol), np.asarray(a.state.chol), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.extras["log_marginal"], a.extras["log_marginal"], rtol=1e-10)
    np.testing.assert_allclose(b.vlb, a.vlb, rtol=1e-10)
    assert [v for _, v in seen] == list(b.trace[:, 1])
    # The log marginal from the engine and from the standalone function agree.
    np.testing.assert_allclose(float(laplace_log_marginal(model, X, y, chunk_size=13)), a.extras["log_marginal"],
                               rtol=1e-10)


# ---- the engine inside fit ----------------------------------------------------------------
def _binary_models(rng):
    N = 150
    X, y = _binary_data(rng, N, D=2)
    k = gpvi.kernels.RBF(variance=2.0, lengthscale=[1.0, 1.5])
    lik = L.Bernoulli()
    return {
        "GLM": (gpvi.GLM(likelihood=lik), np.column_stack([np.ones(N), X]), y),
        "GP": (gpvi.GP(kernel=k, likelihood=lik), X, y),
        "SparseGP": (gpvi.SparseGP(kernel=k, likelihood=lik, inducing=20), X, y),
    }


@pytest.mark.parametrize("kind", ["GLM", pytest.param("GP", marks=pytest.mark.slow),
                                  pytest.param("SparseGP", marks=pytest.mark.slow)])
def test_fit_laplace_and_laplace_initialisation(rng, kind):
    model, X, y = _binary_models(rng)[kind]
    lap = gpvi.fit(model, X, y, engine="laplace", tol=1e-10)
    assert lap.converged and lap.engine == "laplace"
    assert lap.trace.shape[1] == 2 and lap.trace.shape[0] == lap.iterations + 1
    assert np.all(np.diff(lap.trace[:, 0]) >= 0)
    assert np.isfinite(lap.extras["log_marginal"])
    prior = gpvi.fit(model, X, y, engine="fpi", tol=1e-12, max_iter=2000)
    # The VLB optimum bounds the VLB of every Gaussian, the Laplace one included; and the
    # Laplace approximation is a good one for logistic models (within a few nats here).
    assert lap.vlb <= prior.vlb + 1e-9 * abs(prior.vlb)
    assert lap.vlb > prior.vlb - 0.05 * abs(prior.vlb)
    warm = gpvi.fit(model, X, y, engine="fpi", init="laplace", tol=1e-12, max_iter=2000)
    np.testing.assert_allclose(warm.vlb, prior.vlb, rtol=1e-8)
    # The Laplace start is already close: the first VLB of the warm run is the Laplace VLB.
    np.testing.assert_allclose(warm.trace[0, 1], lap.vlb, rtol=1e-8)


def test_laplace_likelihood_is_rejected_clearly(rng):
    X = rng.standard_normal((30, 2))
    y = X[:, 0] + rng.laplace(size=30)
    model = gpvi.GLM(likelihood=L.Laplace(scale=1.0))
    for call in (lambda: gpvi.fit(model, X, y, engine="laplace"),
                 lambda: gpvi.fit(model, X, y, init="laplace"),
                 lambda: laplace_log_marginal(model, X, y)):
        with pytest.raises(ValueError, match="Laplace likelihood.*variational engine"):
            call()


class _AbsLoss(L.Likelihood):
    """A user likelihood with log p piecewise linear in f (h = 0 almost everywhere)."""

    def log_prob(self, y, f):
        return -jnp.abs(y - f)


def test_user_likelihood_without_curvature_is_rejected(rng):
    X = rng.standard_normal((30, 2))
    y = X[:, 0] + 0.3
    with pytest.raises(ValueError, match="_AbsLoss likelihood has .*= 0 at every data point"):
        gpvi.fit(gpvi.GLM(likelihood=_AbsLoss()), X, y, engine="laplace")


@pytest.mark.slow
def test_student_t_runs_with_clipped_newton_matrix(rng):
    N = 120
    X = np.column_stack([np.ones(N), rng.uniform(-2, 2, N)])
    y = X @ np.array([0.3, 1.0]) + 0.2 * rng.standard_normal(N)
    y[:8] += rng.choice([-8.0, 8.0], 8)  # outliers: h_i > 0 there
    lik = L.StudentT(df=3.0, scale=0.3)
    res = gpvi.fit(gpvi.GLM(likelihood=lik, prior_variance=4.0), X, y, engine="laplace", tol=1e-12)
    assert res.converged
    assert res.clipped > 0 and res.diagnostics["clipped"]
    assert res.extras["hessian"] == "exact"
    # The mode is a stationary point of the log posterior, checked in NumPy at the weights.
    beta, _ = res.predict_f(np.eye(2))
    r = (y - X @ beta) / 0.3
    score = X.T @ ((3.0 + 1.0) * r / (3.0 + r**2) / 0.3) - beta / 4.0
    np.testing.assert_allclose(score, 0.0, atol=1e-7)
    # ... and a maximum (the exact H at it is positive definite: hessian == "exact"); as a
    # Gaussian, its VLB is bounded by the variational optimum.
    fpi = gpvi.fit(gpvi.GLM(likelihood=lik, prior_variance=4.0), X, y, engine="fpi", tol=1e-12)
    assert res.vlb <= fpi.vlb + 1e-9 * abs(fpi.vlb)


@pytest.mark.slow
def test_learning_hyperparameters_raises_the_laplace_log_marginal(rng):
    N = 60
    X = rng.uniform(-3, 3, (N, 1))
    y = (rng.uniform(size=N) < expit(3 * np.sin(1.5 * X[:, 0]))).astype(int)
    model = gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=2.0), likelihood=L.Bernoulli())
    fixed = gpvi.fit(model, X, y, engine="laplace", tol=1e-10)
    learned = gpvi.fit(model, X, y, engine="laplace", tol=1e-10, max_rounds=50,
                       learn_hyperparameters=["kernel.variance", "kernel.lengthscale"])
    assert learned.hyperparameter_rounds >= 1
    assert learned.extras["log_marginal"] > fixed.extras["log_marginal"] + 1.0
    # The reported log marginal is that of the returned model, and it is a stationary point:
    # the autodiff gradient of laplace_log_marginal in (log variance, log lengthscale) vanishes.
    lv = float(np.log(learned.model.kernel.variance))
    ll = float(np.log(learned.model.kernel.lengthscale))

    def value(t):
        return laplace_log_marginal(_gp_with("logit", t, X), X, y)

    np.testing.assert_allclose(float(value(jnp.array([lv, ll]))), learned.extras["log_marginal"], rtol=1e-7)
    g = np.asarray(jax.grad(value)(jnp.array([lv, ll])))
    assert np.max(np.abs(g)) < 1e-3
    # An independent optimiser (Nelder–Mead on the values alone) finds no better point.
    ref = scipy.optimize.minimize(lambda t: -float(value(t)), np.array([0.0, np.log(2.0)]),
                                  method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-8})
    np.testing.assert_allclose(learned.extras["log_marginal"], -ref.fun, atol=1e-4)


# ---- hyperparameters learned on separable data (issue 14 §4) ---------------------------------
def test_log_marginal_minus_vlb_is_the_taylor_error_under_the_laplace_posterior(rng):
    # The identity behind check_learned_hyperparameters: Ψ(ŵ) − ½log|H| − VLB(N(ŵ, H⁻¹)) equals
    # Σ_i E_q[T_i(f_i) − log p(y_i|f_i)], T_i the second-order Taylor expansion of log p at the
    # mode, here in NumPy by 200-point Gauss–Hermite quadrature of the latent marginals (gpvi's
    # VLB with 100 points, so that neither quadrature error shows).
    N = 80
    X = np.column_stack([np.ones(N), rng.uniform(-3, 3, N)])
    y = (rng.uniform(size=N) < expit(3.0 * X[:, 1])).astype(int)
    z, w = np.polynomial.hermite_e.hermegauss(200)
    for prior_variance in (1.0, 30.0):
        model = gpvi.GLM(likelihood=L.Bernoulli(quadrature_points=100), prior_variance=prior_variance)
        lap = gpvi.fit(model, X, y, engine="laplace", tol=1e-12)
        m, v = lap.predict_f(X)
        p = expit(m)
        f = m[:, None] + np.sqrt(v)[:, None] * z
        logp = np.where(y[:, None] == 1, -np.logaddexp(0, -f), -np.logaddexp(0, f))
        expected_logp = logp @ w / np.sqrt(2 * np.pi)
        logp_mode = np.where(y == 1, -np.logaddexp(0, -m), -np.logaddexp(0, m))
        expected_taylor = logp_mode - 0.5 * p * (1 - p) * v  # h = −p(1−p); the linear term has mean 0
        np.testing.assert_allclose(lap.extras["log_marginal"] - lap.vlb,
                                   np.sum(expected_taylor - expected_logp), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("kind", ["GP", "GLM"])
def test_learning_on_separable_data_is_refused_not_reported_converged(rng, kind):
    # 200 separable points, y = 1 exactly where x > 0.  The Laplace log marginal is largest at a
    # huge latent scale (GP: kernel variance ≈ 5e4), where the Laplace Gaussian keeps nearly the
    # prior variance: before the check, a converged fit predicted P(y=1 | x=2) ≈ 0.5.
    N = 200
    x = rng.uniform(-3, 3, N)
    y = (x > 0).astype(int)
    if kind == "GP":
        model = gpvi.GP(kernel=gpvi.kernels.RBF(), likelihood=L.Bernoulli())
        X, at = x[:, None], np.array([[2.0], [-2.0]])
    else:
        model = gpvi.GLM(likelihood=L.Bernoulli())
        X, at = np.column_stack([np.ones(N), x]), np.array([[1.0, 2.0], [1.0, -2.0]])
    with pytest.raises(ValueError, match=r"(?s)engine='laplace' cannot learn.*contradicts itself"
                                         r".*separable.*engine='fpi'"):
        gpvi.fit(model, X, y, engine="laplace", learn_hyperparameters=True)
    # At fixed, moderate hyperparameters the Laplace fit of the same data is sound ...
    fixed = gpvi.fit(model, X, y, engine="laplace")
    assert fixed.converged and abs(fixed.extras["log_marginal"] - fixed.vlb) < 1.0
    p = fixed.predict_proba(at)[:, 1]
    assert p[0] > 0.9 and p[1] < 0.1
    # ... and the way out the message names learns sensible probabilities.
    fpi = gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=True)
    p = fpi.predict_proba(at)[:, 1]
    assert p[0] > 0.99 and p[1] < 0.01
