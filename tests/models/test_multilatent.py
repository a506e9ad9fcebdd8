"""Several latent functions (gpvi.multilatent) and the softmax likelihood (gpvi.softmax): the
per-latent data sums against finite differences of the VLB, fpi against gradient, the batched path
against the single-latent one, and bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import GP, MonteCarlo, Objective, SparseGP, kernels
from gpvi import likelihoods as L
from gpvi.models.multilatent import MultiLatent
from gpvi.objective import State, prior_state
from gpvi.likelihoods.softmax import Softmax


def _three_class(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 2))
    F = 2.0 * np.stack([np.sin(X[:, 0]), np.cos(X[:, 1]), 0.2 * X[:, 0] * X[:, 1]], 1)
    P = np.exp(F) / np.exp(F).sum(1, keepdims=True)
    y = np.array([rng.choice(3, p=p) for p in P]).astype(float)
    return X, y


def _random_state(Q, d, seed=1):
    rng = np.random.default_rng(seed)
    mean = 0.5 * rng.standard_normal((Q, d))
    C = np.tril(0.1 * rng.standard_normal((Q, d, d)), -1) + np.eye(d) * rng.uniform(0.5, 1.0, (Q, 1, d))
    return State(jnp.asarray(mean), jnp.asarray(C))


@pytest.mark.slow
def test_softmax_expectation_against_sampling():
    s = Softmax(num_classes=3)
    y = jnp.asarray([0.0, 2.0, 1.0])
    m = jnp.asarray([[0.5, -0.2, 0.1], [1.0, 0.0, -1.0], [-2.0, 1.0, 0.3]])
    v = jnp.asarray([[0.3, 0.5, 1.0], [0.2, 0.2, 2.0], [1.5, 0.1, 0.4]])
    rng = np.random.default_rng(0)
    f = np.asarray(m)[:, None] + np.sqrt(np.asarray(v))[:, None] * rng.standard_normal((3, 200000, 3))
    lp = np.asarray(s.log_prob(y[:, None], jnp.asarray(f)))
    se = lp.std(1) / np.sqrt(lp.shape[1])
    assert np.all(np.abs(np.asarray(s.expected_log_prob(y, m, v)) - lp.mean(1)) < 4 * se + 1e-4)
    p = np.asarray(s.predict_proba(m, v))
    sm = np.exp(f) / np.exp(f).sum(-1, keepdims=True)
    np.testing.assert_allclose(p, sm.mean(1), atol=3e-3)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)


@pytest.mark.parametrize("C", [2, 3, 4])
@pytest.mark.slow
def test_softmax_closed_form_moments_are_the_derivatives_of_its_product_rule(C):
    """Softmax's (E, ρ, λ, h) in closed form against automatic differentiation of its product
    Gauss–Hermite rule over the C − 1 differences from the labelled class, written independently
    (a dense Cholesky factor of the differences' covariance per row, logsumexp over all nodes)."""
    from gpvi.likelihoods.softmax import points_per_difference, product_nodes

    lik = Softmax(num_classes=C)
    rng = np.random.default_rng(C)
    n = 7
    m = jnp.asarray(3.0 * rng.standard_normal((n, C)))
    v = jnp.asarray(rng.uniform(0.05, 4.0, (n, C)))
    y = jnp.asarray(rng.integers(0, C, n).astype(float))
    Z, W = product_nodes(points_per_difference(lik.quadrature_points, C), C - 1)

    def E_ref(m_, v_):
        rows = []
        for i in range(n):
            r = int(y[i])
            o = jnp.array([(r + j) % C for j in range(1, C)])  # the others, in Softmax's order
            A = jnp.linalg.cholesky(jnp.diag(v_[i, o]) + v_[i, r])
            f = jnp.concatenate([jnp.zeros((len(W), 1)), (m_[i, o] - m_[i, r]) + Z @ A.T], axis=1)
            rows.append(-jax.scipy.special.logsumexp(f, axis=-1) @ W)
        return jnp.stack(rows)

    E, rho, lam, h = lik.moments_and_mean_hessians(y, m, v)
    np.testing.assert_allclose(E, E_ref(m, v), rtol=1e-13)
    np.testing.assert_allclose(lik.expected_log_prob(y, m, v), E, rtol=1e-13)
    tot = lambda m_, v_: jnp.sum(E_ref(m_, v_))  # noqa: E731  (rows are independent)
    np.testing.assert_allclose(rho, jax.grad(tot, 0)(m, v), atol=1e-12)
    np.testing.assert_allclose(lam, 2.0 * jax.grad(tot, 1)(m, v), atol=1e-12)
    H = jax.hessian(tot, 0)(m, v)  # (n, C, n, C), block diagonal in the rows
    np.testing.assert_allclose(h, H[jnp.arange(n), :, jnp.arange(n), :], atol=1e-12)
    for a, b in zip(lik.variational_moments(y, m, v), (E, rho, lam)):
        np.testing.assert_array_equal(a, b)
    # predictions by the same rule (over the differences from class 0): probabilities that sum to
    # one, and the log predictive density their log
    p = lik.predict_proba(m, v)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-13)
    np.testing.assert_allclose(lik.predictive_log_density(y, m, v), jnp.log(p[jnp.arange(n), y.astype(int)]), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("lik", [Softmax(num_classes=3), MonteCarlo(Softmax(num_classes=3), num_samples=256)],
                         ids=["quadrature", "mc"])
def test_sums_are_the_vlb_gradient_by_finite_differences(lik):
    X, y = _three_class(n=25)
    model = MultiLatent.full([kernels.RBF(lengthscale=1.0), kernels.RBF(lengthscale=2.0),
                              kernels.Matern52(lengthscale=1.5)], lik, mean=[0.0, 0.3, -0.2])
    obj = Objective(model, X, y)
    st = _random_state(3, 25)
    sums = obj.sums(st)
    assert sums.grad.shape == (3, 25) and sums.S.shape == (3, 25, 25)
    h = 1e-5
    rng = np.random.default_rng(2)
    for _ in range(6):
        q, k = rng.integers(3), rng.integers(25)
        e = jnp.zeros((3, 25)).at[q, k].set(h)
        fd = (float(obj.vlb(State(st.mean + e, st.chol))) - float(obj.vlb(State(st.mean - e, st.chol)))) / (2 * h)
        assert abs(float(sums.grad[q, k]) - fd) < 1e-6 * max(1.0, abs(fd))
    # ∂VLB/∂C = tril(S C) − C + diag(1/C) per block (the gradient engine's formula)
    for _ in range(6):
        q, i = rng.integers(3), rng.integers(25)
        j = rng.integers(i + 1)
        E = jnp.zeros((3, 25, 25)).at[q, i, j].set(h)
        fd = (float(obj.vlb(State(st.mean, st.chol + E))) - float(obj.vlb(State(st.mean, st.chol - E)))) / (2 * h)
        C, S = st.chol[q], sums.S[q]
        g = jnp.tril(S @ C) - C + jnp.diag(1.0 / jnp.diag(C))
        assert abs(float(g[i, j]) - fd) < 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize("lik", [Softmax(num_classes=3), MonteCarlo(Softmax(num_classes=3), num_samples=256)],
                         ids=["quadrature", "mc"])
@pytest.mark.slow
def test_fpi_and_gradient_reach_the_same_vlb(lik):
    X, y = _three_class(n=60)
    model = MultiLatent.full([kernels.RBF(lengthscale=1.0)] * 3, lik)
    a = gpvi.fit(model, X, y, engine="fpi", tol=1e-9)
    b = gpvi.fit(model, X, y, engine="gradient", tol=1e-9)
    assert a.converged and b.converged, (a.message, b.message)
    assert abs(a.vlb - b.vlb) <= 1e-6 * abs(a.vlb), (a.vlb, b.vlb)
    np.testing.assert_allclose(np.asarray(a.state.mean), np.asarray(b.state.mean), atol=1e-3)
    # the fit is better than the prior and the classes are recovered above chance
    assert a.vlb > float(Objective(model, X, y).vlb(prior_state(60, 3)))
    p = a.predict_proba(X)
    assert p.shape == (60, 3) and np.allclose(p.sum(1), 1.0) and (p.argmax(1) == y).mean() > 0.6


@pytest.mark.parametrize("lik", [Softmax(num_classes=3), MonteCarlo(Softmax(num_classes=3), num_samples=64)],
                         ids=["quadrature", "mc"])
@pytest.mark.slow
def test_joint_newton_direction_solves_the_dense_hessian_of_the_vlb_in_the_means(lik):
    """The coupled mean direction (CG on I − Σ A h Aᵀ) against a dense solve with the Hessian of
    the VLB in all Q×d means by automatic differentiation, and the gap's mean share ½ gᵀĤ⁻¹g."""
    from gpvi.engines._common import coupled_target, precision_and_inverse
    from gpvi.objective import expected_vlb

    X, y = _three_class(n=25)
    model = MultiLatent.full([kernels.RBF(lengthscale=1.0), kernels.RBF(lengthscale=2.0),
                              kernels.Matern52(lengthscale=1.5)], lik, mean=[0.0, 0.3, -0.2])
    obj = Objective(model, X, y)
    assert obj.coupled
    st = _random_state(3, 25)
    sums = obj.sums(st)

    def vlb_of_mean(mean):
        return expected_vlb(model, obj.prior, obj.chunks, obj.proj, State(mean.reshape(3, 25), st.chol),
                         obj.cached, obj.blocks)

    H = -np.asarray(jax.hessian(vlb_of_mean)(st.mean.reshape(-1)))
    g = np.asarray(sums.grad).reshape(-1)
    d_ref = np.linalg.solve(H, g)
    # the default: an inexact Newton step (CG to relative residual 1e-3), whose predicted gain
    # is a lower bound on the exact mean share ½ gᵀĤ⁻¹g, with an error of second order
    d_def, share_def = obj.newton_direction(st, sums.grad, precision_and_inverse(sums.S)[1], sums.rows_h)
    exact_share = 0.5 * g @ d_ref
    assert exact_share * (1 - 1e-5) <= float(share_def) <= exact_share * (1 + 1e-12), (share_def, exact_share)
    assert np.linalg.norm(np.asarray(d_def).reshape(-1) - d_ref) <= 1e-2 * np.linalg.norm(d_ref)
    # solved to 1e-12, with the rows' curvatures from the pass and recomputed
    obj = Objective(model, X, y, newton_rtol=1e-12)
    RH, d, gap, RH_inv, _ = coupled_target(obj, st, sums.grad, sums.S, sums.rows_h, step=(1.0, True, True))
    # a step that moves the covariance: the inverse factors, RH⁻¹ RH = I in every block
    for q in range(3):
        np.testing.assert_allclose(np.asarray(RH_inv[q]) @ np.asarray(RH[q]), np.eye(25), atol=1e-10)
    np.testing.assert_allclose(np.asarray(d).reshape(-1), d_ref, rtol=1e-8, atol=1e-10 * np.abs(d_ref).max())
    # a mean-only step, preconditioned with V (here a random one, far from H⁻¹): the same direction
    _, d_mean, gap_mean, P, _ = coupled_target(obj, st, sums.grad, sums.S, sums.rows_h, step=(1.0, True, False))
    np.testing.assert_allclose(np.asarray(d_mean).reshape(-1), d_ref, rtol=1e-8, atol=1e-10 * np.abs(d_ref).max())
    assert gap_mean == pytest.approx(gap, rel=1e-10)
    for q in range(3):  # J Pᵀ P J = V_q
        Pq = np.asarray(P[q])[::-1, ::-1]
        np.testing.assert_allclose(Pq.T @ Pq, np.asarray(st.chol[q]) @ np.asarray(st.chol[q]).T, rtol=1e-12, atol=1e-12)
    _, d2, _, _, _ = coupled_target(obj, st, sums.grad, sums.S)
    np.testing.assert_allclose(np.asarray(d2), np.asarray(d), rtol=1e-10, atol=1e-12 * np.abs(d_ref).max())
    # the gap's covariance share is the per-latent one: remove it via the uncoupled estimate
    from gpvi.engines._common import estimated_gap
    blockwise = float(estimated_gap(st, sums.grad, sums.S)[0])
    Hb = np.zeros_like(H)
    for q in range(3):
        Hb[q * 25:(q + 1) * 25, q * 25:(q + 1) * 25] = np.eye(25) - np.asarray(sums.S[q])
    cov_share = blockwise - 0.5 * g @ np.linalg.solve(Hb, g)
    np.testing.assert_allclose(gap, cov_share + 0.5 * g @ d_ref, rtol=1e-8)


@pytest.mark.slow
def test_coupled_mean_steps_converge_in_a_few_iterations_where_per_latent_steps_crawl():
    """Softmax couples the latents' means; the per-latent Newton step ignores that and contracts
    slowly.  Both reach the same optimum (checked against the gradient engine elsewhere)."""
    X, y = _three_class(n=60)
    model = MultiLatent.full([kernels.RBF(lengthscale=1.0)] * 3, Softmax(num_classes=3))
    from gpvi.engines import fpi

    runs = {}
    for coupled in (True, False):
        obj = Objective(model, X, y, coupled=coupled)
        runs[coupled] = fpi.run(obj, prior_state(60, 3), tol=1e-9)
        assert runs[coupled].converged, runs[coupled].message
    assert runs[True].iterations <= 10 < runs[False].iterations, (runs[True].iterations, runs[False].iterations)
    # here the coupled run's joint steps never slow down: one pass an iteration, no switch
    assert "sequential_from" not in runs[True].extras, runs[True].extras
    assert runs[True].evaluations == runs[True].iterations + 1, (runs[True].evaluations, runs[True].iterations)
    assert runs[True].vlb >= runs[False].vlb - 1e-7 * abs(runs[False].vlb)


@pytest.mark.slow
def test_coupled_joint_steps_switch_to_the_papers_order_once_one_is_slow():
    """With a larger kernel variance the joint steps of coupled latents slow down near the
    optimum; fpi then switches to the paper's order, and reaches the optimum that run in that
    order from the start reaches."""
    X, y = _three_class(n=60)
    model = MultiLatent.full([kernels.RBF(variance=10.0, lengthscale=1.0)] * 3, Softmax(num_classes=3))
    from gpvi.engines import fpi

    auto = fpi.run(Objective(model, X, y), prior_state(60, 3), tol=1e-9)
    paper = fpi.run(Objective(model, X, y), prior_state(60, 3), tol=1e-9, sequential=True)
    assert auto.converged and paper.converged, (auto.message, paper.message)
    assert auto.extras.get("sequential_because") == "slow coupled steps", auto.extras
    # joint steps (one pass each) before the switch, two passes an iteration after it
    start = auto.extras["sequential_from"]
    assert 2 < start <= auto.iterations
    assert abs(auto.vlb - paper.vlb) <= 1e-8 * abs(paper.vlb), (auto.vlb, paper.vlb)


@pytest.mark.slow
def test_one_latent_batch_equals_the_single_latent_model():
    # the batched (per-latent) path with Q = 1 gives the single-latent path's numbers
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (50, 1))
    y = (np.sin(2 * X[:, 0]) > 0).astype(float)
    k = kernels.RBF(lengthscale=0.8)
    single = gpvi.fit(GP(k, L.Bernoulli()), X, y, engine="fpi", tol=1e-10)
    batch = gpvi.fit(MultiLatent([GP(k, None)], L.Bernoulli()), X, y, engine="fpi", tol=1e-10)
    assert batch.state.mean.shape == (1, 50)
    assert abs(single.vlb - batch.vlb) < 1e-9 * abs(single.vlb)
    np.testing.assert_allclose(np.asarray(batch.state.mean[0]), np.asarray(single.state.mean), atol=1e-6)
    np.testing.assert_allclose(batch.predict_f(X)[0][:, 0], single.predict_f(X)[0], atol=1e-6)


@pytest.mark.slow
def test_sparse_latents_with_learned_hyperparameters():
    X, y = _three_class(n=80)
    model = MultiLatent.sparse([kernels.RBF()] * 3, Softmax(num_classes=3), inducing=15)
    res = gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=True, max_rounds=20)
    start = gpvi.fit(model, X, y, engine="fpi")
    assert res.vlb > start.vlb
    assert "latents.2.kernel.lengthscale" in gpvi.learnable_parameters(res.model)
    assert np.asarray(res.model.latents[0].inducing).shape == (15, 2)


@pytest.mark.slow
def test_tied_hyperparameters_across_latents():
    """``latents.*.kernel.x`` is one parameter shared by every latent: its hypergradient is the
    sum of the per-latent ones (chain rule), and fit learns one value for all latents."""
    from gpvi._module import flatten_params, unflatten_params
    from gpvi.objective import make_chunks, vlb_in_hyperparameters

    X, y = _three_class(n=30)
    model = MultiLatent.full([kernels.RBF(variance=1.0, lengthscale=1.0), kernels.RBF(variance=2.0, lengthscale=1.5),
                              kernels.RBF(variance=0.5, lengthscale=2.0)], Softmax(num_classes=3))
    tied = ["latents.*.kernel.variance", "latents.*.kernel.lengthscale"]
    th = flatten_params(model, tied)  # started at the mean of the unconstrained (log) values
    np.testing.assert_allclose(float(th["latents.*.kernel.variance"]), np.mean(np.log([1.0, 2.0, 0.5])), rtol=1e-12)
    same = unflatten_params(model, th)
    assert len({float(l.kernel.lengthscale) for l in same.latents}) == 1
    st = _random_state(3, 30)
    chunks = make_chunks(X, same.likelihood.validate(jnp.asarray(y)))
    Xj = jnp.asarray(X)
    untied = [f"latents.{q}.kernel.{p}" for p in ("variance", "lengthscale") for q in range(3)]

    def vlb(th, m):
        return vlb_in_hyperparameters(unflatten_params(m, th), Xj, chunks, st)

    g_tied = jax.grad(vlb)(th, same)
    g_untied = jax.grad(vlb)(flatten_params(same, untied), same)
    for p in ("variance", "lengthscale"):
        np.testing.assert_allclose(float(g_tied[f"latents.*.kernel.{p}"]),
                                   sum(float(g_untied[f"latents.{q}.kernel.{p}"]) for q in range(3)), rtol=1e-10)
    res = gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=tied, max_rounds=15)
    assert len({float(l.kernel.variance) for l in res.model.latents}) == 1
    assert len({float(l.kernel.lengthscale) for l in res.model.latents}) == 1
    assert res.vlb > gpvi.fit(same, X, y, engine="fpi").vlb
    with pytest.raises(ValueError, match=r"latents\.\*\.kernel\.period"):
        gpvi.fit(model, X, y, learn_hyperparameters=["latents.*.kernel.period"])
    with pytest.raises(ValueError, match="no parameter"):
        flatten_params(model, ["latents.0.kernel.period"])
    ard = MultiLatent.full([kernels.RBF(lengthscale=[1.0, 2.0]), kernels.RBF(), kernels.RBF()], Softmax(num_classes=3))
    with pytest.raises(ValueError, match="different shapes"):
        flatten_params(ard, ["latents.*.kernel.lengthscale"])


@pytest.mark.slow
def test_latents_built_from_the_same_objects_share_one_prior_factorisation():
    """A kernel given once for all latents, or tied across them, is factorised once (the caches
    are the same objects); equal values in different objects are factorised again; the shared
    caches hold what each latent computes alone, and the tied hypergradient (checked against the
    untied sum in the test above) goes through them."""
    from gpvi._module import flatten_params, unflatten_params

    X, _ = _three_class(n=25)
    Xj = jnp.asarray(X)
    k = kernels.RBF(variance=1.3, lengthscale=0.8)
    once = MultiLatent.full([k] * 3, Softmax(num_classes=3), mean=[0.1, 0.0, -0.2])
    # (np.array: a float literal is one constant object, so RBF(variance=1.3) thrice would share it)
    apart = MultiLatent.full([kernels.RBF(variance=np.array(1.3), lengthscale=np.array(0.8)) for _ in range(3)],
                             Softmax(num_classes=3))
    assert once._same_prior() == [0, 0, 0] and apart._same_prior() == [0, 1, 2]
    c_once, c_apart = once.prior_cache(Xj), apart.prior_cache(Xj)
    assert c_once[1] is c_once[0] and c_once[2] is c_once[0] and c_apart[1] is not c_apart[0]
    for a, b in zip(jax.tree_util.tree_leaves(c_once), jax.tree_util.tree_leaves(c_apart)):
        np.testing.assert_array_equal(a, b)
    tied = unflatten_params(apart, flatten_params(apart, ["latents.*.kernel.variance", "latents.*.kernel.lengthscale"]))
    assert tied._same_prior() == [0, 0, 0]
    # sparse latents: one inducing array for all shares; k-means per latent gives each its own
    Z = X[:6]
    sp = MultiLatent.sparse(k, Softmax(num_classes=3), inducing=Z)
    prior, passes = sp.caches(Xj)
    assert sp._same_prior() == [0, 0, 0] and passes[2] is passes[0]
    alone = sp.latents[1].caches(Xj)
    np.testing.assert_allclose(passes[1], alone[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(prior[1], alone[0], rtol=1e-12, atol=1e-12)
    # initialised from one M (k-means once) or one array, the latents keep one inducing array
    for given in (4, Z):
        init = MultiLatent.sparse(k, Softmax(num_classes=3), inducing=given).initialise(X)
        assert init._same_prior() == [0, 0, 0]
        alone = SparseGP(k, None, inducing=given).initialise(X).inducing
        np.testing.assert_array_equal(init.latents[2].inducing, alone)
    # latents given their own inducing objects keep their own
    own = MultiLatent((SparseGP(k, None, inducing=X[:4]), SparseGP(k, None, inducing=X[1:5]),
                       SparseGP(k, None, inducing=X[:4])), Softmax(num_classes=3)).initialise(X)
    assert own._same_prior() == [0, 1, 2]


def test_bad_input():
    with pytest.raises(ValueError, match="latents"):
        MultiLatent([GP(kernels.RBF(), None)] * 2, Softmax(num_classes=3))
    with pytest.raises(ValueError, match="kernels"):
        MultiLatent.full([kernels.RBF()] * 2, Softmax(num_classes=3))
    with pytest.raises(ValueError, match="num_classes"):
        Softmax(num_classes=1)
    X, y = _three_class(n=20)
    model = MultiLatent.full([kernels.RBF()] * 3, Softmax(num_classes=3))
    with pytest.raises(ValueError, match="outside 0..2"):
        gpvi.fit(model, X, np.where(y == 2, 3.0, y))
    with pytest.raises(ValueError, match="outside 0..2"):
        gpvi.fit(model, X, y + 0.5)
    with pytest.raises(ValueError, match="engine"):
        gpvi.fit(model, X, y, engine="fpb")
    with pytest.raises(ValueError, match="mean"):
        MultiLatent.full([kernels.RBF()] * 3, Softmax(num_classes=3), mean=[0.0, 1.0])


@pytest.mark.slow
def test_multiclass_classifier_saves_and_loads(tmp_path):
    X, y = _three_class(n=40)
    names = np.array(["four", "seven", "nine"])[y.astype(int)]
    for kind in ("full", "sparse"):
        clf = gpvi.GPClassifier(model=kind, inducing=10, learn_hyperparameters=False).fit(X, names)
        gpvi.io.save(clf, tmp_path / f"{kind}.gpvi")
        back = gpvi.io.load(tmp_path / f"{kind}.gpvi")
        np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
        assert list(back.classes_) == ["four", "nine", "seven"]


@pytest.mark.slow
def test_default_multiclass_classifier_goes_isotropic_then_ard():
    """GPClassifier's default kernel (isotropic first, then one lengthscale per feature) on three
    classes: each class's latent ends with an ARD kernel, and the fit separates the classes."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(90, 3))
    y = np.argmax(X[:, :2] @ np.array([[2.0, -1.0, 0.0], [0.0, 1.5, -2.0]]), axis=1)
    clf = gpvi.GPClassifier(max_rounds=2).fit(X, y)
    assert all(np.shape(lat.kernel.lengthscale) == (3,) for lat in clf.fit_result_.model.latents)
    assert clf.score(X, y) > 0.8


def test_coupled_target_in_one_call_matches_the_step_by_step_one():
    """The in-memory objective's coupled target (factors, joint direction and gap in one compiled
    call) gives what the generic path (an objective with its own newton_direction) gives, and
    refuses a target whose I − S is not positive definite the same way."""
    from gpvi.engines import _common

    class Generic(Objective):  # its own newton_direction: coupled_target takes the step-by-step path
        def newton_direction(self, state, grad, RH_inv, rows_h=None):
            return super().newton_direction(state, grad, RH_inv, rows_h)

    X, y = _three_class(n=25)
    model = MultiLatent.full([kernels.RBF(lengthscale=1.0), kernels.RBF(lengthscale=2.0),
                              kernels.Matern52(lengthscale=1.5)], Softmax(num_classes=3), mean=[0.0, 0.3, -0.2])
    fused, generic = Objective(model, X, y), Generic(model, X, y)
    assert fused.coupled and generic.coupled
    st = _random_state(3, 25)
    sums = fused.sums(st)
    a = _common.coupled_target(fused, st, sums.grad, sums.S, sums.rows_h, sums.trSV)
    b = _common.coupled_target(generic, st, sums.grad, sums.S, sums.rows_h, sums.trSV)
    for x, z in zip(a[:2] + a[3:4], b[:2] + b[3:4]):
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=1e-10, atol=1e-12)
    assert a[2] == pytest.approx(b[2], rel=1e-10) and np.isfinite(a[2])
    assert b[4] is None  # the generic path leaves the step to the caller
    # the fused call's proposal is natural_step's along the joint direction, for the joint step
    # and the mean-only step (undamped: a covariance step of size 1)
    for step in [(1.0, True, True), (0.5, True, False), (1.0, False, True)]:
        RH, d, _, inv, prop = _common.coupled_target(fused, st, sums.grad, sums.S, sums.rows_h, sums.trSV, step=step)
        ref = _common.natural_step(st, sums.grad, RH, step[0], step[1], step[2], d, inv)
        np.testing.assert_array_equal(np.asarray(prop.mean), np.asarray(ref.mean))
        np.testing.assert_array_equal(np.asarray(prop.chol), np.asarray(ref.chol))
    bad = sums.S.at[1].add(2.0 * jnp.eye(25))  # I − S_1 has negative eigenvalues
    for obj in (fused, generic):
        RH, d, gap, inv, prop = _common.coupled_target(obj, st, sums.grad, bad, sums.rows_h, sums.trSV)
        assert d is None and inv is None and prop is None and gap == float("inf")
        assert not np.all(np.isfinite(np.asarray(RH)))
