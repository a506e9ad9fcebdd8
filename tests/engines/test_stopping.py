"""The certified stopping rule (issue 14 §1, issue 21 §2): every VLB engine stops when its
estimated distance to the optimum, ``FitResult.gap`` in nats, is at most
``0.1·tol·max(1, |VLB|)``; ``converged=True`` never comes with a larger gap.

Truths used: Titsias' collapsed bound and the exact GP marginal likelihood (the optimum of the
VLB for Gaussian likelihoods, where the estimated gap is exact), and other engines run to
tight tolerances.
"""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.engines import fpi
from gpvi.engines._common import GAP_FRACTION, estimated_gap, gap_threshold
from gpvi.objective import Objective, State, prior_state
from problems import jittered as _jittered, problem as _problem, regression_data as _regression_data, titsias_bound as _titsias_bound


def _random_state(rng, d, scale=0.5):
    C = np.tril(scale * rng.standard_normal((d, d)), -1) + np.diag(rng.uniform(0.2, 1.5, d))
    return State(np.asarray(rng.standard_normal(d)), np.asarray(C))


def _certified(res, tol=1e-6):
    return res.converged and 0.0 <= res.gap <= 0.1 * tol * max(1.0, abs(res.vlb))


def test_estimated_gap_is_exact_for_sparse_gaussian(rng):
    # For a Gaussian likelihood E_i is quadratic in m_i and linear in v_i, so the gap estimate
    # is VLB* − VLB exactly; VLB* is Titsias' collapsed bound.
    X, f = _regression_data(rng, 300)
    y = f + 0.3 * rng.standard_normal(300)
    Z = X[rng.choice(300, 15, replace=False)]
    k = gpvi.kernels.RBF(variance=1.3, lengthscale=0.9)
    model = gpvi.SparseGP(k, L.Gaussian(variance=0.09), inducing=Z, mean=0.2).initialise(X, y)
    obj = Objective(model, X, y)
    best = _titsias_bound(k, X, y, Z, 0.09, 0.2)
    for state in (prior_state(obj.dim), _random_state(rng, obj.dim), _random_state(rng, obj.dim, 0.05)):
        sums = obj.sums(state)
        gap = float(estimated_gap(state, sums.grad, sums.S)[0])
        assert gap == pytest.approx(best - float(sums.vlb), rel=1e-7, abs=1e-7)


def test_estimated_gap_is_exact_for_full_gaussian(rng):
    X, f = _regression_data(rng, 120)
    y = f + 0.2 * rng.standard_normal(120)
    k = gpvi.kernels.RBF(variance=1.3, lengthscale=0.9)
    model = gpvi.GP(k, L.Gaussian(variance=0.04)).initialise(X, y)
    obj = Objective(model, X, y)
    Kj = _jittered(np.asarray(k(X, X))) + 0.04 * np.eye(120)
    best = -0.5 * (120 * np.log(2 * np.pi) + np.linalg.slogdet(Kj)[1] + y @ np.linalg.solve(Kj, y))
    state = _random_state(rng, obj.dim, 0.1)
    sums = obj.sums(state)
    gap = float(estimated_gap(state, sums.grad, sums.S)[0])
    assert gap == pytest.approx(best - float(sums.vlb), rel=1e-7)


def test_estimated_gap_tracks_the_true_gap_for_poisson(rng):
    # Not exact beyond Gaussian likelihoods, but within tens of percent along the iterates,
    # and zero (to rounding) at the optimum.
    lik, X, y = _problem("poisson", rng, 400)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), lik, inducing=20).initialise(X, y)
    obj = Objective(model, X, y)
    ref = fpi.run(obj, prior_state(obj.dim), tol_nats=1e-11, max_iter=100)
    assert ref.converged and ref.gap <= 1e-11
    for k in (2, 3, 4):
        r = fpi.run(obj, prior_state(obj.dim), tol_nats=0.0, max_iter=k)
        true = ref.vlb - r.vlb
        assert true > 1e-6
        assert 0.5 * true <= r.gap <= 2.0 * true


def test_gap_threshold():
    assert gap_threshold(-5000.0, 1e-6) == pytest.approx(5e-4)
    assert gap_threshold(0.3, 1e-6) == pytest.approx(1e-7)
    assert gap_threshold(-5000.0, 1e-6, tol_nats=0.02) == 0.02


@pytest.mark.parametrize("engine", ["fpi", "fpb", "gradient"])
@pytest.mark.slow
def test_engines_certify_their_stop_on_logistic(engine, rng):
    lik, X, y = _problem("logit", rng, 300)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), lik, inducing=15)
    ref = gpvi.fit(model, X, y, engine="fpi", tol=1e-12)
    res = gpvi.fit(model, X, y, engine=engine)
    assert _certified(res), res.message
    assert "estimated gap" in res.message
    assert 0 <= ref.vlb - res.vlb <= 1e-6 * abs(ref.vlb)


def test_tol_nats_is_absolute(rng):
    lik, X, y = _problem("poisson", rng, 300)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), lik, inducing=15)
    loose = gpvi.fit(model, X, y, engine="gradient", tol_nats=1.0)
    tight = gpvi.fit(model, X, y, engine="gradient", tol_nats=1e-8)
    assert loose.converged and loose.gap <= 1.0
    assert tight.converged and tight.gap <= 1e-8
    assert tight.iterations > loose.iterations
    with pytest.raises(ValueError, match="tol_nats"):
        gpvi.fit(model, X, y, tol_nats=-1.0)
    with pytest.raises(ValueError, match="tol_nats"):
        gpvi.fit(model, X, y, engine_options={"tol_nats": 1.0})


def test_max_iter_reports_the_gap_and_not_converged(rng):
    lik, X, y = _problem("logit", rng, 300)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), lik, inducing=15)
    for engine in ("fpi", "gradient"):
        res = gpvi.fit(model, X, y, engine=engine, max_iter=2)
        assert not res.converged
        assert np.isfinite(res.gap) and res.gap > 0.1 * 1e-6 * abs(res.vlb)


@pytest.mark.slow
def test_default_settings_agree_on_sparse_poisson_and_student_t():
    # Issue 14 §1: at the old default stopping rule (relative VLB change) the gradient engine
    # stopped 0.036 nats (9e-6 relative) short on this Poisson problem and 0.005 nats (3e-5)
    # on the Student-t one, and dual 0.002 nats short, all saying converged=True.
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (3000, 2))
    y = rng.poisson(np.exp(np.sin(X[:, 0]) + 0.5 * X[:, 1]))
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), L.Poisson(), inducing=60)
    fits = {e: gpvi.fit(model, X, y, engine=e) for e in ("fpi", "fpb", "gradient", "dual")}
    Xs = rng.uniform(-3, 3, (500, 1))
    ys = np.sin(2 * Xs[:, 0]) + 0.1 * rng.standard_normal(500)
    ys[::25] += 8 * rng.standard_normal(20)
    model_t = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), L.StudentT(df=3.0, scale=0.1), inducing=30)
    fits_t = {e: gpvi.fit(model_t, Xs, ys, engine=e) for e in ("fpi", "fpb", "gradient")}
    for group in (fits, fits_t):
        vlbs = np.array([r.vlb for r in group.values()])
        for e, r in group.items():
            assert _certified(r), (e, r.message)
        assert (vlbs.max() - vlbs.min()) / abs(vlbs.max()) <= 1e-6, {e: r.vlb for e, r in group.items()}


@pytest.mark.slow
def test_fpi_finishes_an_ill_conditioned_posterior_with_lbfgs_rescues():
    # Issue 14 §1: a logistic GP with kernel variance 1e8 ran 500 damped iterations (975
    # backtracks) and ended "reached max_iter" without a word on why; issue 30 §3: it then
    # stopped as "stalled" after 30 damped iterations with no answer.  Now fpi hands the stalled
    # state to L-BFGS, resumes its own steps after it, and certifies the optimum.
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (200, 1))
    y = (np.sin(2 * X[:, 0]) > 0).astype(float)
    model = gpvi.GP(gpvi.kernels.RBF(variance=1e8, lengthscale=1.0), L.Bernoulli())
    res = gpvi.fit(model, X, y, max_iter=2000)
    assert _certified(res), res.message
    assert res.extras["rescues"] and all(r[2] >= 0 for r in res.extras["rescues"])
    assert res.iterations == len(res.trace) - 1  # the rescues' iterations are in the trace
    assert np.all(np.diff(res.trace[:, 1]) >= -1e-9 * abs(res.vlb))  # and never lower the bound
    # An independent check of the certificate: L-BFGS started from a perturbed copy of the state
    # climbs back no higher than what a certified fit promises, the bound to tol = 1e-6 relative
    # (L-BFGS alone from the prior ends just below the optimum after ~1100 iterations, not
    # converged).  The stopping threshold is a tenth of that (GAP_FRACTION), a margin for the
    # estimate, which this ill-conditioned bound needs: on a 2-core AMD EPYC without AVX-512 the
    # suite's fpi run (other rounding, 1484 iterations) stopped with an estimated gap of 1.72e-6
    # nats where L-BFGS then climbed 5.4e-6 nats (3e-7 relative); elsewhere it climbed less than
    # the estimate (2026-11-29).
    m = np.asarray(res.state.mean)
    start = State(m + 1e-3 * np.random.default_rng(1).standard_normal(m.shape), res.state.chol)
    grad = gpvi.fit(model, X, y, engine="gradient", init=start, max_iter=300)
    assert res.gap <= gap_threshold(res.vlb, 1e-6) == GAP_FRACTION * 1e-6 * abs(res.vlb)
    assert grad.vlb - res.vlb <= 1e-6 * abs(res.vlb)
    # L-BFGS-B itself stalls on this bound (its relative-reduction test) wherever the rounding puts
    # it: 1e-6 nats below fpi's optimum with single-threaded BLAS, 8e-5 nats below (5e-6 relative)
    # when run alone with two BLAS threads.  It still climbs back from the perturbed start, which
    # is 74 nats below.
    assert res.vlb - grad.vlb <= 1e-5 * abs(res.vlb)
    assert res.vlb - float(Objective(model, X, y).sums(start).vlb) > 10.0
    # With too small a budget the fit ends unconverged, and the message says why and what helps.
    short = gpvi.fit(model, X, y, max_iter=300)
    assert not short.converged
    assert "does not contract" in short.message and "max_iter" in short.message


@pytest.mark.slow
def test_fpi_certifies_a_flat_bound_with_huge_counts():
    # Issue 21 §2: a full GP with Poisson counts up to ~1e6 and learned hyperparameters took
    # 396 s; its last fpi run used all 500 iterations (46 906 backtracks) on a VLB constant to
    # 1e-12 and said converged=False, because only undamped steps could stop it.
    # On the code before the certified rule this very fit took 127 s and ended converged=False:
    # 23 L-BFGS-B rounds, 32 765 passes, 31 536 backtracks, the last fpi run at max_iter=500.
    rng = np.random.default_rng(2)
    X = rng.uniform(-3, 3, (350, 1))
    y = rng.poisson(np.exp(10 + 3.8 * np.cos(2 * X[:, 0])))
    assert y.max() > 9e5
    model = gpvi.GP(gpvi.kernels.RBF(lengthscale=1.0), L.Poisson())
    res = gpvi.fit(model, X, y, learn_hyperparameters=True)
    assert _certified(res), res.message
    assert res.iterations < 50 and res.backtracks < 500 and res.evaluations < 2000
    # The same optimum as fpb from the prior, and as the gradient engine started from a slightly
    # perturbed optimum (from the prior L-BFGS is still 437 nats short after 500 iterations here,
    # and says so: converged=False).
    fpb = gpvi.fit(res.model, X, y, engine="fpb")
    assert _certified(fpb) and abs(fpb.vlb - res.vlb) <= 1e-9 * abs(res.vlb)
    m = np.asarray(res.state.mean)
    start = State(m + 1e-3 * np.random.default_rng(1).standard_normal(m.shape), res.state.chol)
    grad = gpvi.fit(res.model, X, y, engine="gradient", init=start)
    assert grad.vlb <= res.vlb + 1e-9 * abs(res.vlb)
    assert res.vlb - grad.vlb <= 1e-6 * abs(res.vlb)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.slow
def test_fpi_on_separable_glm_converges_or_says_why(seed):
    # Issue 14 §1: a separable logistic GLM with prior variance 1e6 ran 500 damped iterations
    # (~1000 backtracks) without converging or saying why.  Now every such fit either
    # certifies its state or stops early as "stalled", long before max_iter.
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((200, 2))
    H = np.column_stack([np.ones(200), X])
    y = (X[:, 0] > 0).astype(float)
    for cols in (2, 3):
        res = gpvi.fit(gpvi.GLM(L.Bernoulli(), prior_variance=1e6), H[:, :cols], y)
        assert res.iterations < 200
        if res.converged:
            assert _certified(res)
        else:
            assert "stalled" in res.message and res.extras["stalled"]
