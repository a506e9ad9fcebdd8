"""The dual engine (Khan et al. 2013 with the sparse augmentation of Sheth et al. 2015, §4).

Oracles, all independent of the engine's code: exact GP regression, Titsias' collapsed bound and
Bayesian linear regression in closed form (NumPy); the fpi engine's optimum; the dual function
written out densely in NumPy from ``A = L_M⁻¹ K_MN``; central finite differences; and a
brute-force 2-D grid search (NumPy, the same 20-point Gauss–Hermite rule) for the numeric
Bernoulli conjugate.
"""
import numpy as np
import pytest

# Whole-engine checks with many JAX compilations: in the full suite, not in the quick subset
# (`-m "not slow"`); `tests/fitting/test_fit_options.py` and the CLI tests keep a quick path through fit().
pytestmark = pytest.mark.slow
from scipy.special import gammaln, log_ndtr

import gpvi
from gpvi import likelihoods as L
from gpvi.engines import dual
from gpvi.objective import Objective, State

Z20, W20 = np.polynomial.hermite.hermgauss(20)
Z20, W20 = Z20 * np.sqrt(2.0), W20 / np.sqrt(np.pi)


def _data(rng, N, D=2):
    X = rng.uniform(-3, 3, (N, D))
    return X, np.sin(X[:, 0]) + 0.5 * np.cos(2 * X[:, 1])


def _jittered(K, jitter=1e-8):
    return K + jitter * np.mean(np.diag(K)) * np.eye(K.shape[0])


def _random_state(rng, d, vmax=1.0):
    """A random q(w) with V ⪯ vmax·I (so every v_i lies inside the Bernoulli ṽ box)."""
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    V = (Q * rng.uniform(0.05, vmax, d)) @ Q.T
    return State(np.asarray(0.7 * rng.standard_normal(d)), np.linalg.cholesky(V))


# ----------------------------------------------------------------------------------------
# Gaussian likelihood: exact closed forms
# ----------------------------------------------------------------------------------------
def test_gaussian_full_gp_equals_log_marginal_likelihood(rng):
    N = 120
    X, f = _data(rng, N)
    y = f + 0.3 * rng.standard_normal(N)
    kernel = gpvi.kernels.RBF(variance=1.2, lengthscale=0.8)
    noise, mu = 0.09, 0.3
    res = gpvi.fit(gpvi.GP(kernel=kernel, likelihood=L.Gaussian(variance=noise), mean=mu), X, y,
                   engine="dual", tol=1e-11, max_iter=2000)
    C = _jittered(np.asarray(kernel(X, X))) + noise * np.eye(N)
    r = y - mu
    ref = -0.5 * (N * np.log(2 * np.pi) + np.linalg.slogdet(C)[1] + r @ np.linalg.solve(C, r))
    assert abs(res.trace[0, 1] - ref) > 1.0  # the start is far from the optimum
    assert res.converged, res.message
    np.testing.assert_allclose(res.vlb, ref, rtol=1e-6)
    assert abs(res.extras["duality_gap"]) <= 1e-6 * abs(ref)
    np.testing.assert_allclose(res.extras["dual_objective"], ref, rtol=1e-6)
    # The dual optimum is α = (K + σ²I)⁻¹(y − μ) (whitened: A Aᵀ = K).
    m_ref = np.linalg.cholesky(_jittered(np.asarray(kernel(X, X)))).T @ np.linalg.solve(C, r)
    np.testing.assert_allclose(res.state.mean, m_ref, rtol=1e-4, atol=1e-5)


def test_gaussian_sparse_gp_equals_titsias_bound(rng):
    N, M = 300, 25
    X, f = _data(rng, N)
    y = f + 0.3 * rng.standard_normal(N)
    Z = X[rng.choice(N, M, replace=False)]
    kernel = gpvi.kernels.RBF(variance=1.3, lengthscale=0.9)
    noise, mu = 0.09, 0.2
    model = gpvi.SparseGP(kernel=kernel, likelihood=L.Gaussian(variance=noise), inducing=Z, mean=mu)
    res = gpvi.fit(model, X, y, engine="dual", tol=1e-11, max_iter=2000)
    Kmm = _jittered(np.asarray(kernel(Z, Z)))
    Knm = np.asarray(kernel(X, Z))
    Qnn = Knm @ np.linalg.solve(Kmm, Knm.T)
    C = Qnn + noise * np.eye(N)
    r = y - mu
    ref = (-0.5 * (N * np.log(2 * np.pi) + np.linalg.slogdet(C)[1] + r @ np.linalg.solve(C, r))
           - 0.5 * (np.sum(np.asarray(kernel.diag(X))) - np.trace(Qnn)) / noise)
    assert res.converged, res.message
    np.testing.assert_allclose(res.vlb, ref, rtol=1e-6)
    assert abs(res.extras["duality_gap"]) <= 1e-6 * abs(ref)


def test_gaussian_glm_equals_bayesian_linear_regression(rng):
    N = 200
    X, f = _data(rng, N)
    H = np.column_stack([np.ones(N), X, X[:, 0] * X[:, 1]])
    y = f + 0.4 * rng.standard_normal(N)
    sp2, noise = 2.0, 0.16
    res = gpvi.fit(gpvi.GLM(likelihood=L.Gaussian(variance=noise), prior_variance=sp2), H, y,
                   engine="dual", tol=1e-11)
    C = sp2 * H @ H.T + noise * np.eye(N)
    ref = -0.5 * (N * np.log(2 * np.pi) + np.linalg.slogdet(C)[1] + y @ np.linalg.solve(C, y))
    assert res.converged, res.message
    np.testing.assert_allclose(res.vlb, ref, rtol=1e-6)
    assert abs(res.extras["duality_gap"]) <= 1e-6 * abs(ref)


# ----------------------------------------------------------------------------------------
# Poisson: strong duality, against fpi
# ----------------------------------------------------------------------------------------
def _poisson(rng, N):
    X, f = _data(rng, N)
    return X, rng.poisson(np.exp(f))


@pytest.mark.parametrize("which", ["glm", "gp", "sparse"])
def test_poisson_dual_matches_fpi(rng, which):
    N = 150
    X, y = _poisson(rng, N)
    if which == "glm":
        # Large features: at the prior γ = e^{m+v/2} is huge, the case the simple start is for.
        X = np.column_stack([np.ones(N), X, X**2 / 3])
        model = gpvi.GLM(likelihood=L.Poisson(), prior_variance=1.0)
    elif which == "gp":
        model = gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=L.Poisson())
    else:
        model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=2.0, lengthscale=1.0),
                              likelihood=L.Poisson(), inducing=15, mean=0.1).initialise(X)
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-13, max_iter=1000)
    res = gpvi.fit(model, X, y, engine="dual", tol=1e-10, max_iter=3000)
    assert res.converged, res.message
    np.testing.assert_allclose(res.vlb, ref.vlb, rtol=1e-6)
    gap = res.extras["duality_gap"]
    assert -1e-9 * abs(ref.vlb) <= gap <= 1e-6 * abs(ref.vlb)
    # Weak duality against the (better) fpi optimum as well.
    assert res.extras["dual_objective"] >= ref.vlb - 1e-9 * abs(ref.vlb)


@pytest.mark.slow
def test_poisson_with_exposure_and_uncached_padded_chunks(rng):
    N = 130
    X, f = _data(rng, N)
    t = rng.uniform(0.5, 4.0, N)
    y = rng.poisson(t * np.exp(f))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=12).initialise(X)
    ref = gpvi.fit(model, X, y, exposure=t, engine="fpi", tol=1e-13)
    # 4 chunks of 33 rows (2 padded), projections recomputed in every pass.
    res = gpvi.fit(model, X, y, exposure=t, engine="dual", tol=1e-10, max_iter=3000, chunk_size=40,
                   cache_bytes=0)
    assert res.converged, res.message
    np.testing.assert_allclose(res.vlb, ref.vlb, rtol=1e-6)


# ----------------------------------------------------------------------------------------
# The dual function itself, written out densely in NumPy
# ----------------------------------------------------------------------------------------
def _dense_sparse_projection(kernel, X, Z, jitter=1e-8):
    Lm = np.linalg.cholesky(_jittered(np.asarray(kernel(Z, Z)), jitter))
    A = np.linalg.solve(Lm, np.asarray(kernel(Z, X))).T  # rows a_i
    c = np.maximum(np.asarray(kernel.diag(X)) - np.sum(A**2, 1), 0.0)
    return A, c


def _dense_dual_poisson(A, b, c, y, g):
    alpha = y - g
    m = A.T @ alpha
    P = np.eye(A.shape[1]) + (A.T * g) @ A
    return (0.5 * m @ m + alpha @ b - 0.5 * np.linalg.slogdet(P)[1] - 0.5 * g @ c
            + np.sum(g * np.log(g) - g - gammaln(y + 1)))


def _dense_dual_gaussian(A, b, c, y, alpha, s2):
    g = np.full_like(y, 1.0 / s2)
    m = A.T @ alpha
    P = np.eye(A.shape[1]) + (A.T * g) @ A
    return (0.5 * m @ m + alpha @ b - 0.5 * np.linalg.slogdet(P)[1] - 0.5 * g @ c
            + np.sum(-0.5 * np.log(2 * np.pi * s2) + 0.5 * s2 * alpha**2 - alpha * y))


@pytest.mark.parametrize("cached,blocks", [(True, None), (False, None), (True, 3), (False, 2)])
def test_dual_function_equals_dense_numpy_formula(rng, cached, blocks):
    N, M, mu = 90, 9, 0.3
    X, f = _data(rng, N)
    Z = X[:M]
    kernel = gpvi.kernels.Matern52(variance=1.4, lengthscale=1.1)
    A, c = _dense_sparse_projection(kernel, X, Z)
    b = np.full(N, mu)
    kw = {"chunk_size": 25, "cache_bytes": 2**30 if cached else 0, "blocks": blocks}
    yp = rng.poisson(np.exp(f)).astype(float)
    obj = Objective(gpvi.SparseGP(kernel=kernel, likelihood=L.Poisson(), inducing=Z, mean=mu), X, yp, **kw)
    assert obj.cached == cached
    g = np.exp(rng.normal(0.0, 0.7, N))
    D, _ = dual.dual_objective(obj, g)
    np.testing.assert_allclose(D, _dense_dual_poisson(A, b, c, yp, g), rtol=1e-10)
    yg = f + 0.2 * rng.standard_normal(N)
    obj = Objective(gpvi.SparseGP(kernel=kernel, likelihood=L.Gaussian(variance=0.3), inducing=Z, mean=mu),
                    X, yg, **kw)
    al = rng.standard_normal(N)
    D, _ = dual.dual_objective(obj, al)
    np.testing.assert_allclose(D, _dense_dual_gaussian(A, b, c, yg, al, 0.3), rtol=1e-10)
    # The primal point of the dual variables: m = Σα_i a_i, V = (I + Σγ_i a_i a_iᵀ)⁻¹.
    st = dual.recover_primal(obj, al)
    np.testing.assert_allclose(st.mean, A.T @ al, rtol=1e-10, atol=1e-12)
    V = np.linalg.inv(np.eye(M) + A.T @ A / 0.3)
    np.testing.assert_allclose(st.chol @ st.chol.T, V, rtol=1e-8, atol=1e-12)


def _central_differences(fun, x, idx, h):
    out = []
    for i in idx:
        e = np.zeros_like(x)
        e[i] = h * max(1.0, abs(x[i]))
        out.append((fun(x + e) - fun(x - e)) / (2 * e[i]))
    return np.array(out)


@pytest.mark.parametrize("kind", ["poisson", "gaussian"])
def test_dual_gradient_equals_finite_differences(rng, kind):
    N = 70
    X, f = _data(rng, N)
    lik = L.Poisson() if kind == "poisson" else L.Gaussian(variance=0.2)
    y = rng.poisson(np.exp(f)).astype(float) if kind == "poisson" else f + 0.3 * rng.standard_normal(N)
    obj = Objective(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=X[:10], mean=0.2), X, y)
    x = np.exp(rng.normal(0, 0.5, N)) if kind == "poisson" else rng.standard_normal(N)
    _, g = dual.dual_objective(obj, x)
    idx = rng.choice(N, 8, replace=False)
    fd = _central_differences(lambda z: dual.dual_objective(obj, z)[0], x, idx, 1e-6)
    np.testing.assert_allclose(g[idx], fd, rtol=1e-6, atol=1e-7)


def test_logistic_dual_gradient_equals_finite_differences(rng):
    """Where the maximiser in f* does not switch between the two ends of the ṽ box within ±h."""
    N = 40
    X, f = _data(rng, N)
    lik = L.Bernoulli()
    y = lik.validate((rng.uniform(size=N) < 1 / (1 + np.exp(-2 * f))).astype(int))
    obj = Objective(gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=X[:8]), X, y)
    x = np.concatenate([y * rng.uniform(0.1, 0.9, N), rng.uniform(0.02, 0.23, N)])
    _, g = dual.dual_objective(obj, x)
    idx = np.concatenate([rng.choice(N, 5, replace=False), N + rng.choice(N, 5, replace=False)])
    fd1 = _central_differences(lambda z: dual.dual_objective(obj, z)[0], x, idx, 1e-5)
    fd2 = _central_differences(lambda z: dual.dual_objective(obj, z)[0], x, idx, 2e-6)
    smooth = np.abs(fd1 - fd2) <= 1e-6 * (1 + np.abs(fd1))  # no branch switch near x
    assert smooth.sum() >= 6
    np.testing.assert_allclose(g[idx][smooth], fd1[smooth], rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------------------
# Weak duality
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["poisson", "logit", "probit"])
def test_weak_duality_at_random_points(rng, kind):
    N = 60
    X, f = _data(rng, N)
    if kind == "poisson":
        lik, y = L.Poisson(), rng.poisson(np.exp(f)).astype(float)
    else:
        lik = L.Bernoulli(link=kind)
        y = lik.validate((rng.uniform(size=N) < 1 / (1 + np.exp(-2 * f))).astype(int))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=1.5), likelihood=lik, inducing=X[:12], mean=0.1)
    obj = Objective(model, X, y)
    best_primal = gpvi.fit(model, X, y, engine="fpi", tol=1e-12).vlb
    for _ in range(5):
        if kind == "poisson":
            x = np.exp(rng.normal(0.0, 1.0, N))
        else:
            hi = 0.999 if kind == "logit" else 5.0
            x = np.concatenate([y * rng.uniform(1e-3, hi, N),
                                rng.uniform(0.0, 0.25 if kind == "logit" else 1.0, N)])
        D, _ = dual.dual_objective(obj, x)
        assert D >= best_primal
        for _ in range(3):
            st = _random_state(rng, 12)
            assert D >= float(obj.vlb(st))
        # The dual's own primal point is a primal point too.
        assert D >= float(obj.vlb(dual.recover_primal(obj, x)))


# ----------------------------------------------------------------------------------------
# The numeric Bernoulli conjugate against brute force
# ----------------------------------------------------------------------------------------
def _E(link, t, v):
    """E_{N(f|t,v)}[log p(+1|f)] by the 20-point Gauss–Hermite rule (NumPy)."""
    F = np.asarray(t)[..., None] + np.sqrt(np.asarray(v))[..., None] * Z20
    lp = -np.logaddexp(0.0, -F) if link == "logit" else log_ndtr(F)
    return np.sum(W20 * lp, -1)


def _score(link, F):
    if link == "logit":
        return 1.0 / (1.0 + np.exp(F))
    return np.exp(-0.5 * F**2 - 0.5 * np.log(2 * np.pi) - log_ndtr(F))


def _rho_gamma(link, t, v):
    """(ρ, γ_E) = (∂E/∂t, −2∂E/∂v) of the quadrature rule, by central differences."""
    h = 1e-6
    rho = (_E(link, t + h, v) - _E(link, t - h, v)) / (2 * h)
    hv = 1e-6 * v
    gam = -2 * (_E(link, t, v + hv) - _E(link, t, v - hv)) / (2 * hv)
    return float(rho), float(gam)


def _brute_conjugate(link, a, g, vbar):
    """sup over t ∈ [−12, 12], ṽ ∈ [VMIN, v̄] by a 2-D grid (Δt = 0.05, Δlog ṽ ≈ 0.1), refined on
    a finer grid (Δt = 2.5e-4) around the best coarse point of the lower end row, of the upper
    end row and of the interior each (maxima in different basins can be within the coarse
    grid's error of each other)."""
    lv = (np.log(dual.VMIN), np.log(vbar))

    def grid(T, U):
        TT, UU = np.meshgrid(T, U, indexing="ij")
        VV = np.exp(UU)
        return _E(link, TT, VV) - a * TT + 0.5 * g * VV, TT, UU

    T = np.linspace(-12, 12, 481)
    U = np.linspace(*lv, 241)
    H, TT, UU = grid(T, U)
    dt, du = T[1] - T[0], U[1] - U[0]
    best = (-np.inf, None, None)
    for cols in (slice(0, 1), slice(-1, None), slice(1, -1)):
        Hs = H[:, cols]
        j = np.unravel_index(np.argmax(Hs), Hs.shape)
        t0, u0 = TT[:, cols][j], UU[:, cols][j]
        Hf, Tf, Uf = grid(np.linspace(t0 - 2 * dt, t0 + 2 * dt, 401),
                          np.unique(np.clip(np.linspace(u0 - 2 * du, u0 + 2 * du, 161), *lv)))
        k = np.unravel_index(np.argmax(Hf), Hf.shape)
        if Hf[k] > best[0]:
            best = (Hf[k], Tf[k], np.exp(Uf[k]))
    return best


_OURS = {}


def _ours(link, a, g, vbar):
    import jax
    import jax.numpy as jnp

    if link not in _OURS:
        lik = L.Bernoulli(link=link)
        _OURS[link] = jax.jit(lambda a, g, vb: dual.bernoulli_conjugate(lik, a, g, vb))
    out = _OURS[link](jnp.asarray([a]), jnp.asarray([g]), jnp.asarray([vbar]))
    return tuple(float(o[0]) for o in out)


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_bernoulli_conjugate_matches_brute_force_grid(rng, link):
    vbar = 3.0
    for _ in range(6):
        a = rng.uniform(0.05, 0.95) if link == "logit" else rng.uniform(0.05, 2.0)
        g = rng.uniform(0.0, 0.25 if link == "logit" else 1.0)
        fb, tb, vb = _brute_conjugate(link, a, g, vbar)
        fo, to, vo = _ours(link, a, g, vbar)
        # The value is a supremum: ours is never below the grid's, and the refined grid comes
        # within 1e-6 of it.
        assert fo >= fb - 1e-12
        assert fo - fb <= 1e-6
        # The reported maximiser attains the value.
        np.testing.assert_allclose(_E(link, to, vo) - a * to + 0.5 * g * vo, fo, rtol=0, atol=1e-12)
        assert abs(to - tb) <= 1e-2 and abs(np.log(vo / vb)) <= 1e-2


@pytest.mark.parametrize("link", ["logit", "probit"])
@pytest.mark.parametrize("end", ["upper", "lower"])
def test_bernoulli_conjugate_recovers_a_maximiser(rng, link, end):
    """At ``(α, γ) = (ρ, γ_E ± δ)`` of a point ``(m̃, ṽ)`` on an end of the ṽ box that the
    brute-force grid confirms as the global maximiser, f* returns that point.

    (E has no interior local maximiser for these links — see the next test — so the
    maximisers of f* are on the ends of the box.)"""
    vbar = 2.0
    found = 0
    for t in np.linspace(-4.0, 4.0, 9):
        v = vbar if end == "upper" else dual.VMIN
        rho, gam = _rho_gamma(link, t, v)
        g = gam + 0.02 if end == "upper" else max(gam - 0.02, 0.0)
        fb, tb, vb = _brute_conjugate(link, rho, g, vbar)
        if not (abs(tb - t) <= 1e-3 and abs(np.log(vb / v)) <= 1e-9):
            continue  # not the global maximiser at these (α, γ)
        found += 1
        fo, to, vo = _ours(link, rho, g, vbar)
        np.testing.assert_allclose(to, t, atol=1e-6)
        np.testing.assert_allclose(vo, v, rtol=1e-9)
        np.testing.assert_allclose(fo, _E(link, t, v) - rho * t + 0.5 * g * v, atol=1e-10)
        assert fo >= fb - 1e-12
    assert found >= 3


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_bernoulli_expected_log_prob_is_not_jointly_concave(link):
    """Why strong duality fails for binary labels: the Hessian of E(m, v) (Gauss–Hermite,
    exact derivatives of the rule) is indefinite throughout, so E − α m + γ v/2 has no interior
    local maximum and f* always sits on an end of the ṽ box."""
    for t in np.linspace(-4, 4, 9):
        for v in [0.01, 0.1, 0.5, 1.0, 2.0, 4.0]:
            F = t + np.sqrt(v) * Z20
            r = _score(link, F)
            d2 = -r * (1 - r) if link == "logit" else -r * (F + r)
            Ett = np.sum(W20 * d2)
            Etv = np.sum(W20 * d2 * Z20) / (2 * np.sqrt(v))
            Evv = np.sum(W20 * d2 * Z20**2) / (4 * v) - np.sum(W20 * r * Z20) / (4 * v**1.5)
            assert np.linalg.eigvalsh([[Ett, Etv], [Etv, Evv]])[1] > 0


# ----------------------------------------------------------------------------------------
# Binary labels: strong duality fails — reported, not hidden
# ----------------------------------------------------------------------------------------
def test_one_point_logistic_has_a_duality_gap_and_the_engine_says_so():
    """One observation, ``f = 4w``: the primal optimum (m*, v*) is not the global maximiser of
    E − ρ* m̃ + γ* ṽ/2 (brute force), so no saddle point exists and D > VLB* at every dual
    point; the engine must return converged=False with the gap in its message."""
    X, y = np.array([[4.0]]), np.array([1])
    model = gpvi.GLM(likelihood=L.Bernoulli())
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-14)
    m_star, v_star = 4.0 * float(ref.state.mean[0]), 16.0 * float(ref.state.chol[0, 0] ** 2)
    rho, gam = _rho_gamma("logit", m_star, v_star)
    own = _E("logit", m_star, v_star) - rho * m_star + 0.5 * gam * v_star
    fb, _, _ = _brute_conjugate("logit", rho, gam, 16.0)
    assert fb > own + 1e-3
    res = gpvi.fit(model, X, y, engine="dual", tol=1e-9)
    assert not res.converged
    assert "duality gap" in res.message
    assert res.extras["duality_gap"] > 1e-3
    assert res.extras["dual_objective"] > ref.vlb + 1e-3  # weak duality, strictly
    assert res.vlb <= ref.vlb + 1e-12


@pytest.mark.slow
def test_logistic_gp_is_consistent(rng):
    """Either the dual reaches fpi's VLB or it says it did not (converged=False, the gap)."""
    N = 50
    X, f = _data(rng, N)
    y = (rng.uniform(size=N) < 1 / (1 + np.exp(-2 * f))).astype(int)
    model = gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=L.Bernoulli())
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-12)
    res = gpvi.fit(model, X, y, engine="dual", max_iter=300)
    gap = res.extras["duality_gap"]
    assert np.isfinite(res.vlb) and np.isfinite(gap)
    if res.converged:
        np.testing.assert_allclose(res.vlb, ref.vlb, rtol=1e-6)
        assert gap <= 1e-6 * max(1.0, abs(res.vlb))
    else:
        assert "duality gap" in res.message
        assert gap > 1e-6 * max(1.0, abs(res.vlb)) or "L-BFGS-B" in res.message or "max_iter" in res.message
    # Whatever happened, weak duality holds and the primal point is feasible.
    assert res.vlb <= ref.vlb + 1e-9 * abs(ref.vlb)
    assert res.extras["dual_objective"] >= ref.vlb - 1e-9 * abs(ref.vlb)


# ----------------------------------------------------------------------------------------
# The engine in the library
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lik", [L.Ordinal(edges=np.array([-1.0, 0.0, 1.0])), L.StudentT(df=3.0, scale=0.3)])
def test_likelihoods_without_a_conjugate_are_refused(rng, lik):
    X, f = _data(rng, 40)
    y = (np.searchsorted([-1.0, 0.0, 1.0], f) if isinstance(lik, L.Ordinal)
         else f + 0.3 * rng.standard_t(3.0, size=40))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=5)
    with pytest.raises(ValueError, match=f"Fenchel conjugate.*{type(lik).__name__} has none.*fpi, fpb or gradient"):
        gpvi.fit(model, X, y, engine="dual")


@pytest.mark.slow
def test_fit_with_dual_engine_reports_trace_callback_and_extras(rng):
    N = 100
    X, y = _poisson(rng, N)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=10).initialise(X)
    calls = []
    res = gpvi.fit(model, X, y, engine="dual", tol=1e-9, engine_options={"history": 10},
                   callback=lambda i, v, t: calls.append((i, v)))
    assert res.engine == "dual" and res.converged, res.message
    assert res.trace.shape == (res.iterations + 1, 2)
    assert [c[0] for c in calls] == list(range(res.iterations + 1))
    np.testing.assert_allclose(res.trace[-1, 1], res.vlb)
    assert set(res.extras) >= {"dual_objective", "duality_gap"}
    np.testing.assert_allclose(res.extras["dual_objective"] - res.vlb, res.extras["duality_gap"])
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-12)
    Xs = rng.uniform(-3, 3, (7, 2))
    np.testing.assert_allclose(res.predict_f(Xs)[0], ref.predict_f(Xs)[0], rtol=1e-3, atol=1e-4)
    short = gpvi.fit(model, X, y, engine="dual", tol=1e-14, max_iter=2)
    assert not short.converged and "max_iter" in short.message and short.iterations == 2


def test_warm_start_at_the_optimum_stops_at_once(rng):
    N = 80
    X, y = _poisson(rng, N)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=8).initialise(X)
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-13)
    res = gpvi.fit(model, X, y, engine="dual", init=ref.state, tol=1e-8)
    assert res.converged and res.iterations == 0, res.message
    np.testing.assert_allclose(res.vlb, ref.vlb, rtol=1e-9)


@pytest.mark.slow
def test_hyperparameter_learning_with_the_dual_engine(rng):
    N = 80
    X, f = _data(rng, N)
    y = f + 0.3 * rng.standard_normal(N)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Gaussian(variance=0.5), inducing=8).initialise(X)
    names = ["likelihood.variance", "kernel.lengthscale"]
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-10, learn_hyperparameters=names)
    res = gpvi.fit(model, X, y, engine="dual", tol=1e-10, learn_hyperparameters=names)
    np.testing.assert_allclose(res.vlb, ref.vlb, rtol=1e-6)
    np.testing.assert_allclose(float(res.model.likelihood.variance), float(ref.model.likelihood.variance), rtol=1e-3)
