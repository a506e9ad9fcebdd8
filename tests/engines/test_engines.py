"""Engines against closed forms and against each other.

Oracles: Titsias' (2009) collapsed bound and exact GP regression (written here in NumPy,
independently of gpvi's code), and cross-engine agreement on the same objective.
"""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from problems import jittered as _jittered, problem as _problem, regression_data as _regression_data, titsias_bound as _titsias_bound

ENGINES = ["fpi", "fpb", "gradient"]


@pytest.mark.parametrize("engine", ["fpi", "fpb"])
def test_sparse_gaussian_equals_titsias_bound(rng, engine):
    X, f = _regression_data(rng, 600)
    y = f + 0.3 * rng.standard_normal(600)
    Z = X[rng.choice(600, 40, replace=False)]
    kernel = gpvi.kernels.RBF(variance=1.3, lengthscale=0.9)
    model = gpvi.SparseGP(kernel=kernel, likelihood=L.Gaussian(variance=0.09), inducing=Z, mean=0.2)
    res = gpvi.fit(model, X, y, engine=engine, tol=1e-12)
    ref = _titsias_bound(kernel, X, y, Z, 0.09, 0.2)
    start = res.trace[0, 1]
    assert abs(start - ref) > 1.0  # the prior is far from the optimum: the check can fail
    assert res.converged
    np.testing.assert_allclose(res.vlb, ref, rtol=1e-8)
    # Gaussian likelihood: one FP/Newton step is exact.
    np.testing.assert_allclose(res.trace[1, 1], ref, rtol=1e-8)


@pytest.mark.parametrize("engine", ["fpi", "fpb"])
@pytest.mark.slow
def test_full_gp_gaussian_equals_exact_regression(rng, engine):
    N = 200
    X, f = _regression_data(rng, N)
    y = f + 0.2 * rng.standard_normal(N)
    Xs = rng.uniform(-3, 3, (50, 2))
    kernel = gpvi.kernels.Matern52(variance=0.8, lengthscale=[1.1, 0.7])
    noise, mu = 0.04, -0.3
    res = gpvi.fit(gpvi.GP(kernel=kernel, likelihood=L.Gaussian(variance=noise), mean=mu), X, y,
                   engine=engine, tol=1e-12)
    K = _jittered(np.asarray(kernel(X, X)))
    C = K + noise * np.eye(N)
    r = y - mu
    _, logdet = np.linalg.slogdet(C)
    log_ml = -0.5 * (N * np.log(2 * np.pi) + logdet + r @ np.linalg.solve(C, r))
    np.testing.assert_allclose(res.vlb, log_ml, rtol=1e-8)
    Ks = np.asarray(kernel(X, Xs))
    mean_ref = mu + Ks.T @ np.linalg.solve(C, r)
    nugget = K[0, 0] - np.asarray(kernel(X[:1], X[:1]))[0, 0]  # the jitter is a nugget of the prior
    var_ref = np.asarray(kernel.diag(Xs)) + nugget - np.sum(Ks * np.linalg.solve(C, Ks), 0)
    m, v = res.predict_f(Xs)
    np.testing.assert_allclose(m, mean_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(v, var_ref, rtol=1e-8, atol=1e-10)
    my, vy = res.predict_y(Xs)
    np.testing.assert_allclose(vy, var_ref + noise, rtol=1e-8)
    # Predictive density of Gaussian regression in closed form.
    ys = rng.standard_normal(50)
    lpd_ref = -0.5 * (np.log(2 * np.pi * (var_ref + noise)) + (ys - mean_ref) ** 2 / (var_ref + noise))
    np.testing.assert_allclose(res.log_predictive_density(Xs, ys), lpd_ref, rtol=1e-8)


def test_sparse_with_inducing_at_data_equals_full_gp(rng):
    X, f = _regression_data(rng, 80)
    y = (rng.uniform(size=80) < 1 / (1 + np.exp(-2 * f))).astype(int)
    kernel = gpvi.kernels.RBF(variance=1.5, lengthscale=1.2)
    full = gpvi.fit(gpvi.GP(kernel=kernel, likelihood=L.Bernoulli()), X, y, tol=1e-12)
    sparse = gpvi.fit(gpvi.SparseGP(kernel=kernel, likelihood=L.Bernoulli(), inducing=X), X, y, tol=1e-12)
    np.testing.assert_allclose(sparse.vlb, full.vlb, rtol=1e-7)
    Xs = rng.uniform(-3, 3, (20, 2))
    np.testing.assert_allclose(sparse.predict_f(Xs)[0], full.predict_f(Xs)[0], rtol=1e-5, atol=1e-7)


KINDS = ["logit", "probit", "poisson", "ordinal", "laplace", "studentt"]


def _agree(results, rtol):
    vlbs = np.array([r.vlb for r in results.values()])
    best = vlbs.max()
    for name, r in results.items():
        assert np.isfinite(r.vlb), name
        assert abs(r.vlb - best) <= rtol * abs(best), (name, r.vlb, best, {k: v.vlb for k, v in results.items()})


def _fit_all(model, X, y, **kw):
    model = model.initialise(X)  # one k-means placement shared by all engines
    return {e: gpvi.fit(model, X, y, engine=e, tol=1e-11, max_iter=3000, **kw) for e in ENGINES}


@pytest.mark.parametrize("kind", KINDS + ["exponential"])
@pytest.mark.slow
def test_engines_agree_sparse_small(rng, kind):
    lik, X, y = _problem(kind, rng, 400)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=lik, inducing=20)
    _agree(_fit_all(model, X, y), 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_engines_agree_sparse_acceptance(rng, kind):
    """Issue #2 acceptance 2: N ≥ 2000, M ≥ 50, fixed hyperparameters."""
    lik, X, y = _problem(kind, rng, 2000)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=lik, inducing=50)
    _agree(_fit_all(model, X, y), 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["logit", "poisson"])
def test_engines_agree_full_gp_and_glm(rng, kind):
    """Issue #2 acceptance 2: full GP with N = 500 and a GLM, logistic and Poisson."""
    lik, X, y = _problem(kind, rng, 500)
    _agree(_fit_all(gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=lik), X, y), 1e-6)
    H = np.column_stack([np.ones(500), X, X**2])
    _agree(_fit_all(gpvi.GLM(likelihood=lik, prior_variance=1.0), H, y), 1e-6)


@pytest.mark.parametrize("kind", ["logit", "poisson"])
def test_engines_agree_glm_small(rng, kind):
    lik, X, y = _problem(kind, rng, 300)
    H = np.column_stack([np.ones(300), X])
    _agree(_fit_all(gpvi.GLM(likelihood=lik, prior_variance=2.0), H, y), 1e-6)


@pytest.mark.parametrize("engine", ["fpi", "fpb"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_fixed_point_never_lowers_the_vlb(rng, kind, engine):
    lik, X, y = _problem(kind, rng, 300)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(lengthscale=0.7, variance=2.0), likelihood=lik, inducing=25)
    res = gpvi.fit(model, X, y, engine=engine, tol=1e-10, max_iter=1000)
    steps = np.diff(res.trace[:, 1])
    assert np.all(steps >= -1e-9 * abs(res.vlb)), steps.min()
    assert res.vlb >= res.trace[0, 1]
    assert res.converged, res.message


@pytest.mark.slow
def test_student_t_safeguards_are_used_and_counted(rng):
    """Student-t is not log-concave: undamped FP steps from the prior can lower the VLB.

    The engine must recover (backtrack) and still reach the gradient engine's optimum."""
    N = 300
    X = rng.uniform(-3, 3, (N, 1))
    y = np.sin(2 * X[:, 0]) + 0.05 * rng.standard_t(1.5, size=N)
    y[::15] += rng.choice([-8.0, 8.0], size=y[::15].shape)  # gross outliers
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=4.0, lengthscale=0.3),
                          likelihood=L.StudentT(df=3.0, scale=0.05), inducing=30).initialise(X)
    fpi = gpvi.fit(model, X, y, engine="fpi", tol=1e-11, max_iter=2000)
    grad = gpvi.fit(model, X, y, engine="gradient", tol=1e-12, max_iter=5000)
    assert fpi.backtracks + fpi.cycles > 0
    assert np.all(np.diff(fpi.trace[:, 1]) >= -1e-9 * abs(fpi.vlb))
    np.testing.assert_allclose(fpi.vlb, grad.vlb, rtol=1e-6)


def test_fit_reports_iterations_trace_and_message(rng):
    lik, X, y = _problem("logit", rng, 200)
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=10)
    calls = []
    res = gpvi.fit(model, X, y, tol=1e-8, callback=lambda i, v, t: calls.append((i, v, t)))
    assert res.trace.shape == (res.iterations + 1, 2)
    assert np.all(np.diff(res.trace[:, 0]) >= 0)
    assert [c[0] for c in calls] == list(range(res.iterations + 1))
    np.testing.assert_allclose([c[1] for c in calls], res.trace[:, 1])
    assert res.converged and "estimated gap" in res.message
    assert 0 <= res.gap <= 0.1 * 1e-8 * max(1.0, abs(res.vlb))  # the certified stopping rule
    short = gpvi.fit(model, X, y, tol=1e-14, max_iter=2)
    assert not short.converged and short.iterations == 2 and "max_iter" in short.message


def test_given_inducing_inputs_and_parameters_are_used_exactly(rng):
    lik, X, y = _problem("poisson", rng, 200)
    Z = rng.uniform(-3, 3, (12, 2))
    kernel = gpvi.kernels.RBF(variance=0.7, lengthscale=[0.9, 1.3])
    res = gpvi.fit(gpvi.SparseGP(kernel=kernel, likelihood=lik, inducing=Z, mean=0.1), X, y)
    np.testing.assert_array_equal(np.asarray(res.model.inducing), Z)
    np.testing.assert_array_equal(np.asarray(res.model.kernel.lengthscale), [0.9, 1.3])
    assert float(res.model.kernel.variance) == 0.7 and float(res.model.mean) == 0.1


def test_exposure_is_a_log_offset(rng):
    X = rng.uniform(-2, 2, (300, 1))
    t = rng.uniform(0.5, 5.0, 300)
    y = rng.poisson(t * np.exp(np.sin(X[:, 0])))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson(), inducing=10).initialise(X)
    a = gpvi.fit(model, X, y, exposure=t, tol=1e-10)
    b = gpvi.fit(model, X, y, offset=np.log(t), tol=1e-10)
    np.testing.assert_allclose(a.vlb, b.vlb, rtol=1e-12)
    m0, _ = a.predict_f(X[:5])
    m1, _ = a.predict_f(X[:5], offset=np.log(t[:5]))
    np.testing.assert_allclose(m1 - m0, np.log(t[:5]), rtol=1e-12)


class HandWrittenPoisson(L.Likelihood):
    """A user's likelihood: only log_prob is given (no decorator, no closed forms)."""

    def log_prob(self, y, f):
        import jax.numpy as jnp
        from jax.scipy.special import gammaln

        return y * f - jnp.exp(f) - gammaln(y + 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_user_likelihood_with_only_log_prob_works_with_every_engine(rng, engine):
    X = rng.uniform(-2, 2, (300, 1))
    y = rng.poisson(np.exp(np.sin(2 * X[:, 0])))
    base = gpvi.SparseGP(kernel=gpvi.kernels.RBF(lengthscale=0.8), likelihood=L.Poisson(), inducing=12).initialise(X)
    ref = gpvi.fit(base, X, y, engine="fpi", tol=1e-12)
    mine = gpvi.fit(base.replace(likelihood=HandWrittenPoisson()), X, y, engine=engine, tol=1e-12, max_iter=3000)
    assert mine.converged, mine.message
    # 20-point Gauss–Hermite versus the closed form: agreement to quadrature accuracy.
    np.testing.assert_allclose(mine.vlb, ref.vlb, rtol=1e-7)
    np.testing.assert_allclose(mine.predict_f(X[:10])[0], ref.predict_f(X[:10])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_S", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 0.3])
@pytest.mark.parametrize("update_mean,update_cov", [(True, True), (True, False), (False, True)])
def test_natural_step_matches_dense_algebra(rng, alpha, update_mean, update_cov, with_S):
    # Oracle: Λ' = (1−α)V⁻¹ + αH (H alone for a mean-only step), m' = m + αΛ'⁻¹g, V' = Λ'⁻¹,
    # by dense NumPy inverses; the step itself works from a reversed Cholesky factor of H, and
    # (with_S) a damped one from H = I − S itself.
    import jax.numpy as jnp
    from gpvi.engines._common import natural_step, precision_chol

    d = 7
    B = rng.standard_normal((d, 3 * d))
    S = -(B @ B.T) / d  # Σλ_i a_i a_iᵀ with λ < 0
    chol = np.tril(rng.standard_normal((d, d)))
    np.fill_diagonal(chol, np.abs(np.diag(chol)) + 1.0)
    state = gpvi.State(jnp.asarray(rng.standard_normal(d)), jnp.asarray(chol))
    g = rng.standard_normal(d)
    out = natural_step(state, jnp.asarray(g), precision_chol(jnp.asarray(S)), alpha, update_mean, update_cov,
                       S=jnp.asarray(S) if with_S else None)

    H, V = np.eye(d) - S, chol @ chol.T
    Lam = (1 - alpha) * np.linalg.inv(V) + alpha * H if update_cov else H
    want_mean = np.asarray(state.mean) + alpha * np.linalg.solve(Lam, g) if update_mean else np.asarray(state.mean)
    want_V = np.linalg.inv(Lam) if update_cov else V
    new = np.asarray(out.chol)
    np.testing.assert_allclose(np.asarray(out.mean), want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(new @ new.T, want_V, rtol=1e-12, atol=1e-12)
    assert np.all(np.triu(new, 1) == 0) and np.all(np.diag(new) > 0)  # a Cholesky factor


def _blocks_of_sums_and_factors(rng, Q, d):
    """``(S, chol)`` of Q blocks: ``S = Σλ_i a_i a_iᵀ`` with λ < 0 and a covariance factor with a
    positive diagonal, each (Q, d, d)."""
    S, chols = [], []
    for _ in range(Q):
        B = rng.standard_normal((d, 3 * d))
        S.append(-(B @ B.T) / d)
        c = np.tril(rng.standard_normal((d, d)))
        np.fill_diagonal(c, np.abs(np.diag(c)) + 1.0)
        chols.append(c)
    return np.stack(S), np.stack(chols)


@pytest.mark.parametrize("Q", [None, 3])
@pytest.mark.parametrize("alpha,update_mean,update_cov", [(1.0, True, True), (0.3, True, False), (1.0, False, True)])
def test_target_and_step_proposes_the_undamped_step_of_dense_algebra(rng, Q, alpha, update_mean, update_cov):
    # target_and_step's proposal (natural_step's undamped branch, without the damped one)
    # against the same oracle as above, for one block and Q stacked blocks,
    # with the gap against estimated_gap.
    import jax.numpy as jnp
    from gpvi.engines._common import estimated_gap, target_and_step

    d, blocks = 6, 1 if Q is None else Q
    S, chols = _blocks_of_sums_and_factors(rng, blocks, d)
    g = rng.standard_normal((blocks, d))
    m = rng.standard_normal((blocks, d))
    if Q is None:
        S, chols, g, m = S[0], chols[0], g[0], m[0]
    state = gpvi.State(jnp.asarray(m), jnp.asarray(chols))
    _, out, gap = target_and_step(state, jnp.asarray(g), jnp.asarray(S), alpha, update_mean, update_cov)
    assert float(gap) == pytest.approx(float(estimated_gap(state, jnp.asarray(g), jnp.asarray(S))[0]), rel=1e-12)
    for q in range(blocks):
        pick = (lambda x: np.asarray(x)) if Q is None else (lambda x, q=q: np.asarray(x)[q])
        Sq, Cq, gq, mq = pick(S), pick(chols), pick(g), pick(m)
        H = np.eye(d) - Sq
        want_mean = mq + alpha * np.linalg.solve(H, gq) if update_mean else mq
        want_V = np.linalg.inv(H) if update_cov else Cq @ Cq.T
        new = pick(out.chol)
        np.testing.assert_allclose(pick(out.mean), want_mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(new @ new.T, want_V, rtol=1e-11, atol=1e-12)
        assert np.all(np.triu(new, 1) == 0) and np.all(np.diag(new) > 0)


@pytest.mark.parametrize("with_S", [False, True])
@pytest.mark.parametrize("alpha", [1.0, 0.3])
@pytest.mark.parametrize("update_mean,update_cov", [(True, True), (True, False), (False, True)])
def test_coupled_natural_step_of_stacked_blocks_matches_dense_algebra(rng, alpha, update_mean, update_cov, with_S):
    # The coupled (softmax) step of Q = 3 stacked blocks, with the joint direction and the
    # factors' inverses given: m' = m + α·direction, and per block V' = Λ'⁻¹ with
    # Λ' = (1−α)V⁻¹ + αH, by dense NumPy inverses.
    import jax.numpy as jnp
    from gpvi.engines._common import natural_step, precision_and_inverse

    Q, d = 3, 6
    S, chols = _blocks_of_sums_and_factors(rng, Q, d)
    state = gpvi.State(jnp.asarray(rng.standard_normal((Q, d))), jnp.asarray(chols))
    g, direction = rng.standard_normal((Q, d)), rng.standard_normal((Q, d))
    RH, RH_inv = precision_and_inverse(jnp.asarray(S))
    out = natural_step(state, jnp.asarray(g), RH, alpha, update_mean, update_cov, jnp.asarray(direction), RH_inv,
                       jnp.asarray(S) if with_S else None)
    want_mean = np.asarray(state.mean) + (alpha * direction if update_mean else 0.0)
    np.testing.assert_allclose(np.asarray(out.mean), want_mean, rtol=1e-12, atol=1e-12)
    for q in range(Q):
        H, V = np.eye(d) - S[q], chols[q] @ chols[q].T
        want_V = np.linalg.inv((1 - alpha) * np.linalg.inv(V) + alpha * H) if update_cov else V
        new = np.asarray(out.chol[q])
        np.testing.assert_allclose(new @ new.T, want_V, rtol=1e-11, atol=1e-12)
        assert np.all(np.triu(new, 1) == 0) and np.all(np.diag(new) > 0)


@pytest.mark.slow
def test_damped_covariance_steps_of_coupled_latents_share_the_joint_steps_program(monkeypatch):
    """A softmax fit that damps covariance-only steps (no joint direction at hand) and joint
    steps calls ``natural_step`` with one argument structure, so XLA compiles it once (it
    compiled twice on iris before: 8 programs in the first fit, now 7, the same bound); and the
    covariance-only step taken through that program is the dense algebra's
    ``V' = ((1−α)V⁻¹ + αH)⁻¹`` with the mean unchanged."""
    import jax
    import jax.numpy as jnp
    from sklearn.datasets import load_iris
    from gpvi.engines import _common
    from gpvi.engines._common import SafeguardedAscent, precision_chol

    calls = []
    real = _common.natural_step

    def recorded(*args):
        calls.append((jax.tree_util.tree_structure(args[:3] + args[6:]), args[3] < 1.0, args[4], args[5]))
        return real(*args)

    monkeypatch.setattr(_common, "natural_step", recorded)
    X, y = load_iris(return_X_y=True)
    gpvi.GPClassifier().fit(X, y)
    kinds = {(damped, bool(mean), bool(cov)) for _, damped, mean, cov in calls}
    assert {(True, False, True), (True, True, True)} <= kinds, kinds  # both kinds of damped step
    assert len({c[0] for c in calls}) == 1, {c[0] for c in calls}

    # the covariance-only step as SafeguardedAscent._try takes it, against dense algebra
    rng = np.random.default_rng(5)
    Q, d, alpha = 3, 6, 0.3
    S, chols = _blocks_of_sums_and_factors(rng, Q, d)
    state = gpvi.State(jnp.asarray(rng.standard_normal((Q, d))), jnp.asarray(chols))

    class Coupled:
        coupled = True

        def sums(self, st):
            return type("Sums", (), {"vlb": 0.0})()

    guard = SafeguardedAscent(objective=Coupled())
    guard.direction = guard.inverse = None
    guard.target_S = jnp.asarray(S)  # as _target records it: the damped step takes H = I − S from it
    RH = precision_chol(jnp.asarray(S))
    grad = type("Sums", (), {"grad": jnp.asarray(rng.standard_normal((Q, d))), "vlb": -1.0})()
    out = guard._try(state, grad, RH, alpha, False, True)[0]
    np.testing.assert_array_equal(np.asarray(out.mean), np.asarray(state.mean))
    for q in range(Q):
        H, V = np.eye(d) - S[q], chols[q] @ chols[q].T
        new = np.asarray(out.chol[q])
        np.testing.assert_allclose(new @ new.T, np.linalg.inv((1 - alpha) * np.linalg.inv(V) + alpha * H),
                                   rtol=1e-11, atol=1e-12)



@pytest.mark.parametrize("Q", [None, 2])
def test_damped_steps_from_a_known_precision_match_dense_algebra(rng, Q):
    """``state_S`` is ``I − V⁻¹`` (dense inverse); along a chain of accepted steps — a full
    covariance step, a mean-only step, two damped covariance steps — the ascent's known
    ``S_state`` of each new factor is ``state_S`` of that factor, no triangular inverse is taken
    after the first state, and each damped step is the dense ``V' = ((1−α)V⁻¹ + αH)⁻¹``."""
    import jax.numpy as jnp
    from gpvi.engines import _common
    from gpvi.engines._common import SafeguardedAscent, precision_chol, state_S

    d, blocks = 6, 1 if Q is None else Q
    S_all, chols = _blocks_of_sums_and_factors(rng, blocks, d)
    S_b = -0.5 * S_all[::-1]  # a second target
    pick = (lambda x: x[0]) if Q is None else (lambda x: x)
    S1, S2, C0 = pick(S_all), pick(S_b), pick(chols)
    for q in range(blocks):
        want = np.eye(d) - np.linalg.inv(chols[q] @ chols[q].T)
        got = np.asarray(state_S(jnp.asarray(C0)))
        np.testing.assert_allclose(got if Q is None else got[q], want, rtol=1e-11, atol=1e-12)

    class Flat:  # every proposal has the same VLB: each is accepted
        coupled = False

        def sums(self, st):
            return type("Sums", (), {"vlb": 0.0})()

    guard = SafeguardedAscent(objective=Flat())
    looked_up = []
    real = _common.state_S

    def counted(chol):
        looked_up.append(chol)
        return real(chol)

    def take(state, S, alpha, update_mean, update_cov):
        guard.target_S = jnp.asarray(S)
        g = jnp.asarray(rng.standard_normal(np.shape(state.mean)))
        sums = type("Sums", (), {"grad": g, "vlb": 0.0})()
        return guard._try(state, sums, precision_chol(guard.target_S), alpha, update_mean, update_cov)[0]

    def dense_V(chol):
        c = np.asarray(chol).reshape(blocks, d, d)
        return [cq @ cq.T for cq in c]

    mp = pytest.MonkeyPatch()
    mp.setattr(_common, "state_S", counted)
    try:
        state = gpvi.State(jnp.asarray(rng.standard_normal((blocks, d)) if Q else rng.standard_normal(d)),
                           jnp.asarray(C0))
        s1 = take(state, S1, 1.0, False, True)  # V = (I − S1)⁻¹: known without a lookup
        s2 = take(s1, S2, 1.0, True, False)  # mean only: the factor object is kept
        assert s2.chol is s1.chol
        s3 = take(s2, S2, 0.5, False, True)
        s4 = take(s3, S1, 0.25, False, True)
    finally:
        mp.undo()
    assert looked_up == []  # every damped step found its state's S_state known
    for prev, new, S, alpha in ((s2, s3, S2, 0.5), (s3, s4, S1, 0.25)):
        Sb = np.asarray(S).reshape(blocks, d, d)
        for q, (Vp, Vn) in enumerate(zip(dense_V(prev.chol), dense_V(new.chol))):
            want = np.linalg.inv((1 - alpha) * np.linalg.inv(Vp) + alpha * (np.eye(d) - Sb[q]))
            np.testing.assert_allclose(Vn, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(guard._known[1]), np.asarray(real(s4.chol)), rtol=1e-9, atol=1e-11)
    assert guard._known[0] is s4.chol

def test_two_cycle_is_detected_counted_and_halves_the_step():
    # The fixed-point map's iterate returning to where it was two steps ago while still
    # moving is a 2-cycle: counted, and the next step is half as long.
    import jax.numpy as jnp
    from gpvi.engines._common import SafeguardedAscent

    guard = SafeguardedAscent(objective=None)
    a, b = (gpvi.State(jnp.full(2, x), jnp.eye(2)) for x in (0.0, 1.0))
    c = gpvi.State(jnp.full(2, 2.0), jnp.eye(2))
    guard._cycle_check(b, a)  # a → b
    guard._cycle_check(c, b)  # b → c: moving on, not a cycle
    assert (guard.cycles, guard.alpha) == (0, 1.0)
    guard._cycle_check(b, c)  # c → b: back where it was two steps ago
    assert (guard.cycles, guard.alpha) == (1, 0.5)
    guard._cycle_check(b, b)  # standing still is convergence, not a cycle
    assert guard.cycles == 1


@pytest.mark.parametrize("Q", [None, 3])
def test_gradient_engines_packed_vector_and_its_gradient(rng, Q):
    # The gradient engine's L-BFGS-B vector (the means and the lower triangles of the factors,
    # block after block): packing and unpacking are inverse, the unpacked state does not share
    # memory with the vector (L-BFGS-B overwrites it in place), and the packed gradient is the
    # VLB's, by central differences (truth independent of the closed form the engine uses).
    from gpvi.engines import gradient as G
    from gpvi.models import MultiLatent
    from gpvi.objective import Objective

    N, d = 30, 4
    X = rng.uniform(-2, 2, (N, 1))
    if Q is None:
        model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=0.8), L.Poisson(), inducing=np.linspace(-2, 2, d)[:, None])
        y = rng.poisson(2.0, N).astype(float)
        shape = (d,)
    else:
        model = MultiLatent.sparse([gpvi.kernels.RBF(lengthscale=0.8)] * Q, L.Softmax(num_classes=Q),
                                   inducing=np.linspace(-2, 2, d)[:, None])
        y = rng.integers(0, Q, N).astype(float)
        shape = (Q, d)
    mean = 0.3 * rng.standard_normal(shape)
    chol = np.tril(0.2 * rng.standard_normal(shape[:-1] + (d, d)), -1) + np.eye(d) * rng.uniform(0.5, 1.0, shape)[..., None, :]
    state = gpvi.State(mean, chol)
    x = G._pack(state)
    assert x.shape == ((Q or 1) * (d + d * (d + 1) // 2),)
    # (on a 64-byte boundary, where jax.device_put may use a host array's memory without a copy)
    buf = np.empty(x.size + 8)
    start = (-buf.ctypes.data % 64) // 8
    x, x_copy = buf[start:start + x.size], x
    x[:] = x_copy
    back = G._unpack(shape, x)
    np.testing.assert_array_equal(np.asarray(back.mean), mean)
    np.testing.assert_array_equal(np.asarray(back.chol), chol)
    x[:] = np.nan  # what L-BFGS-B may do to its vector after handing it out
    assert np.all(np.isfinite(np.asarray(back.mean))) and np.all(np.isfinite(np.asarray(back.chol)))

    obj = Objective(model, X, y)
    sums = obj.sums(back)
    g = G._grad_vector(back, sums.grad, sums.S)
    x0, h = G._pack(state), 1e-5
    vlb = lambda v: float(obj.vlb(G._unpack(shape, v)))
    fd = np.array([(vlb(x0 + h * e) - vlb(x0 - h * e)) / (2 * h) for e in np.eye(x0.size)])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("d", [1, 7, 65, 320, 321, 700])
@pytest.mark.slow
def test_tri_inv_is_the_inverse_of_a_lower_triangular_matrix(rng, d):
    # Truth: NumPy's dense inverse; the blocked recursion (leaves of ≤ 320 rows, triangular
    # products down to 160: at d = 700 two levels of each) must also keep exact zeros above the
    # diagonal, and pass NaN through.
    import jax.numpy as jnp
    from gpvi._linalg import tri_inv

    B = rng.standard_normal((d, 2 * d))
    R = np.linalg.cholesky(B @ B.T / (2 * d) + np.eye(d))
    inv = np.asarray(tri_inv(jnp.asarray(R)))
    np.testing.assert_allclose(inv, np.linalg.inv(R), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(inv @ R, np.eye(d), rtol=0, atol=1e-13)
    assert np.all(np.triu(inv, 1) == 0)
    R[-1, 0] = np.nan
    assert np.isnan(np.asarray(tri_inv(jnp.asarray(R)))).any()


@pytest.mark.slow  # 5 s; the quick subset has the Student-t safeguard test above
def test_fpi_clips_gamma_when_the_target_precision_is_indefinite_and_still_reaches_the_optimum():
    # Student-t with outliers: far from the optimum I − S is indefinite (γ_i < 0), so in
    # "auto" mode the step is retried with γ clipped at 0.  Clipping changes the steps, not the
    # fixed point.  Truth for the end point: the gradient engine's optimum of the same bound.
    rng = np.random.default_rng(0)
    X = np.linspace(-3, 3, 80)[:, None]
    y = np.sin(X[:, 0]) + 0.05 * rng.standard_t(2, size=80)
    y[::10] += 8.0
    model = gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=1.0),
                    likelihood=gpvi.likelihoods.StudentT(df=3.0, scale=0.1))
    fp = gpvi.fit(model, X, y, engine="fpi", max_iter=200, tol=1e-10)
    gr = gpvi.fit(model, X, y, engine="gradient", max_iter=3000, tol=1e-12)
    assert fp.clipped > 0 and fp.converged
    assert fp.vlb >= gr.vlb - 1e-6 * abs(gr.vlb)
    assert np.all(np.diff(fp.trace[:, 1]) >= -1e-9 * abs(fp.vlb))  # never lower than before


def test_fpi_switches_to_the_papers_order_when_accepted_joint_steps_are_slow(monkeypatch):
    """A logistic GP with a large kernel variance: fpi's joint steps are all accepted but shrink
    the gap slowly; after SLOW_RUN such steps fpi takes the paper's order (Newton on the mean,
    then the fixed point of the covariance) and reaches the same optimum in fewer passes."""
    from gpvi import kernels
    from gpvi.engines import fpi

    rng = np.random.default_rng(0)
    N = 80
    X = rng.uniform(-3, 3, (N, 1))
    y = (np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=N) > 0).astype(float)
    model = gpvi.GP(kernels.RBF(variance=10.0, lengthscale=0.3), L.Bernoulli())
    runs = {}
    for rule in ("on", "off"):
        if rule == "off":
            monkeypatch.setattr(fpi, "SLOW_RUN", 10**6)
        runs[rule] = fpi.run(gpvi.Objective(model, X, y), gpvi.prior_state(N), tol=1e-9, max_iter=500)
        assert runs[rule].converged, runs[rule].message
    assert runs["on"].extras.get("sequential_because") == "slow steps"
    assert "sequential_from" not in runs["off"].extras and runs["off"].backtracks == 0  # never rejected
    assert runs["on"].evaluations < 0.6 * runs["off"].evaluations, (runs["on"].evaluations, runs["off"].evaluations)
    assert abs(runs["on"].vlb - runs["off"].vlb) <= 1e-9 * abs(runs["off"].vlb)


@pytest.mark.parametrize("d", [1, 6, 97])
def test_reversed_chol_factors_the_symmetric_part_in_reversed_order(rng, d):
    # Truth: NumPy's Cholesky of J ½(H + Hᵀ) J, on an H that is not exactly symmetric (as rounding
    # leaves a summed Σλaaᵀ); R is lower triangular and J R Rᵀ J is that symmetric part.
    import jax.numpy as jnp
    from gpvi.engines._common import reversed_chol

    G = rng.standard_normal((d, d))
    H = G @ G.T / d + np.eye(d) + 1e-6 * rng.standard_normal((d, d))
    sym = 0.5 * (H + H.T)
    R = np.asarray(reversed_chol(jnp.asarray(H)))
    np.testing.assert_allclose(R, np.linalg.cholesky(sym[::-1, ::-1]), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose((R @ R.T)[::-1, ::-1], sym, rtol=1e-12, atol=1e-13)
    assert np.all(np.triu(R, 1) == 0)
    H[0, 0] = -5.0  # not positive definite: NaN, no exception
    assert np.isnan(np.asarray(reversed_chol(jnp.asarray(H)))).any()
