"""iVSGPR (Cheng & Boots 2016) and the multiscale inducing kernel (their Eq. 17).

Truths used here, none taken from the code under test: the SE-ARD and Eq. 17 formulas written
out in NumPy; Titsias's collapsed bound and optimal q(u) (through gpvi's exact fpi engine and a
NumPy formula); central finite differences; the Gaussian KL between two sparse posteriors
computed in the joint space of both sets of inducing variables; natural-parameter averaging.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi.engines import ivsgpr as iv
from gpvi.kernels import RBF, Matern32, MultiscaleRBF
from gpvi.likelihoods import Gaussian, Poisson
from gpvi.objective import State

N, D, M = 160, 2, 8
ARD = np.array([0.8, 1.7])


def data(seed=0, n=N):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, D))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] ** 2 + 0.1 * rng.normal(size=n)
    return X, y


def inducing(seed=1):
    return np.random.default_rng(seed).uniform(-2, 2, size=(M, D))


def se_ard(A, B, var, ls):
    d2 = (((A[:, None, :] - B[None]) / ls) ** 2).sum(-1)
    return var * np.exp(-0.5 * d2)


def eq17(A, la, B, lb):
    """Cheng & Boots (2016) Eq. 17 for rows of A (lengthscales la) against rows of B (lb)."""
    la = np.broadcast_to(la, A.shape)[:, None, :]
    lb = np.broadcast_to(lb, B.shape)[None, :, :]
    s2 = la**2 + lb**2
    pre = np.prod(np.sqrt(2 * la * lb / s2), axis=-1)
    return pre * np.exp(-(((A[:, None, :] - B[None]) ** 2) / s2).sum(-1))


# ---- the multiscale kernel ---------------------------------------------------------------------

def test_multiscale_equals_se_ard_when_inducing_lengthscales_are_the_kernels():
    X, _ = data()
    Z = inducing()
    for lz in (None, np.tile(ARD, (M, 1)), ARD):
        k = MultiscaleRBF(variance=1.3, lengthscale=ARD, inducing_lengthscale=lz)
        np.testing.assert_allclose(k.inducing_cov(Z), se_ard(Z, Z, 1.3, ARD), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(k.inducing_cross(Z, X), se_ard(Z, X, 1.3, ARD), rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(k(X[:20], X[:30]), se_ard(X[:20], X[:30], 1.3, ARD), rtol=1e-13, atol=1e-15)
    # the same sparse GP, hence the same VLB, as with the RBF kernel
    X, y = data()
    lik = Gaussian(variance=0.05)
    a = gpvi.fit(gpvi.SparseGP(RBF(variance=1.3, lengthscale=ARD), lik, inducing=Z), X, y)
    b = gpvi.fit(gpvi.SparseGP(MultiscaleRBF(variance=1.3, lengthscale=ARD, inducing_lengthscale=np.tile(ARD, (M, 1))),
                               lik, inducing=Z), X, y)
    assert abs(a.vlb - b.vlb) < 1e-9 * abs(a.vlb)


def test_multiscale_matches_eq17_and_is_positive_semidefinite():
    X, _ = data()
    Z = inducing()
    lz = np.random.default_rng(3).uniform(0.3, 3.0, size=(M, D))
    k = MultiscaleRBF(variance=0.7, lengthscale=ARD, inducing_lengthscale=lz)
    np.testing.assert_allclose(k.inducing_cov(Z), 0.7 * eq17(Z, lz, Z, lz), rtol=1e-12)
    np.testing.assert_allclose(k.inducing_cross(Z, X), 0.7 * eq17(Z, lz, X, ARD), rtol=1e-12, atol=1e-300)
    joint = np.block([[k.inducing_cov(Z), k.inducing_cross(Z, X[:40])],
                      [k.inducing_cross(Z, X[:40]).T, k(X[:40], X[:40])]])
    assert np.linalg.eigvalsh(joint).min() > -1e-10


@pytest.mark.slow
def test_multiscale_gram_across_column_blocks_and_extreme_lengthscales():
    # D = 9 spans three blocks of the Gram's one-logarithm-per-block prefactor (the last one
    # partial); lengthscales from 1e-30 to 1e30 in one row must neither overflow nor lose the
    # prefactor.  Truths: Eq. 17 in NumPy, and the derivative of Eq. 17 written column by column
    # in JAX (two logarithms per column, as the paper writes it).
    rng = np.random.default_rng(11)
    m, d = 6, 9
    Z1, Z2 = rng.normal(size=(m, d)), rng.normal(size=(m + 1, d))
    l1 = rng.uniform(0.3, 3.0, size=(m, d))
    l2 = rng.uniform(0.3, 3.0, size=(m + 1, d))
    l1[0, :8] = 1e30  # a product of eight (l1² + l2²) ~ 1e480 would overflow
    l1[2, 4:8] = l2[1, 4:8] = 1e-30  # and one of eight 2e-60 underflow
    k = MultiscaleRBF(variance=1.0, lengthscale=np.ones(d))
    got = np.asarray(k.inducing_gram(jnp.asarray(Z1), jnp.asarray(l1), jnp.asarray(Z2), jnp.asarray(l2)))
    np.testing.assert_allclose(got, eq17(Z1, l1, Z2, l2), rtol=1e-12, atol=1e-300)
    assert np.all(np.isfinite(got))

    def by_column(Z1, l1, Z2, l2):
        out = 0.0
        for j in range(d):
            a, b = l1[:, j, None], l2[None, :, j]
            s2 = a * a + b * b
            out = out + 0.5 * (jnp.log(2.0 * a * b) - jnp.log(s2)) - (Z1[:, j, None] - Z2[None, :, j]) ** 2 / s2
        return jnp.exp(out)

    W = jnp.asarray(rng.normal(size=(m, m + 1)))
    l1[0], l1[2, 4:8], l2[1, 4:8] = 1.0, 1.0, 1.0  # derivatives at moderate lengthscales (the extremes have none to speak of)
    args = tuple(jnp.asarray(v) for v in (Z1, l1, Z2, l2))
    g = jax.grad(lambda *a: jnp.sum(W * k.inducing_gram(*a)), argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(lambda *a: jnp.sum(W * by_column(*a)), argnums=(0, 1, 2, 3))(*args)
    for x, y in zip(g, want):
        np.testing.assert_allclose(x, y, rtol=1e-11, atol=1e-13)


@pytest.mark.slow
def test_multiscale_gradients_match_finite_differences():
    X, _ = data()
    X = X[:12]
    Z = inducing()
    rng = np.random.default_rng(5)
    W1, W2 = rng.normal(size=(M, M)), rng.normal(size=(M, 12))
    base = MultiscaleRBF(variance=0.9, lengthscale=ARD, inducing_lengthscale=rng.uniform(0.5, 2, size=(M, D)))

    def f(p):
        k = MultiscaleRBF(variance=jnp.exp(p["v"]), lengthscale=jnp.exp(p["l"]),
                          inducing_lengthscale=jnp.exp(p["lz"]))
        return jnp.sum(W1 * k.inducing_cov(p["Z"])) + jnp.sum(W2 * k.inducing_cross(p["Z"], X))

    p0 = {"v": jnp.log(0.9), "l": jnp.log(jnp.asarray(ARD)), "lz": jnp.log(jnp.asarray(base.inducing_lengthscale)),
          "Z": jnp.asarray(Z)}
    g = jax.grad(f)(p0)
    flat, unravel = jax.flatten_util.ravel_pytree(p0)
    gflat = np.asarray(jax.flatten_util.ravel_pytree(g)[0])
    h = 1e-6
    fd = np.array([(float(f(unravel(flat.at[i].add(h)))) - float(f(unravel(flat.at[i].add(-h))))) / (2 * h)
                   for i in range(flat.size)])
    np.testing.assert_allclose(gflat, fd, rtol=1e-6, atol=1e-7)


def test_multiscale_rejects_bad_inducing_lengthscale():
    with pytest.raises(ValueError, match="inducing_lengthscale"):
        MultiscaleRBF(inducing_lengthscale=-1.0)
    with pytest.raises(ValueError, match="inducing_lengthscale"):
        MultiscaleRBF(inducing_lengthscale=np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="inducing_lengthscale has 3 rows"):
        MultiscaleRBF(inducing_lengthscale=np.ones((3, D))).inducing_cov(inducing())


# ---- the engine ---------------------------------------------------------------------------------

def sparse(var=1.0, ls=ARD, noise=0.05, Z=None):
    return gpvi.SparseGP(RBF(variance=var, lengthscale=ls), Gaussian(variance=noise),
                         inducing=inducing() if Z is None else Z)


@pytest.mark.slow
def test_whole_data_step_without_subproblem_is_the_titsias_posterior():
    """B = N and γ = 1: the q(u) update is the exact Titsias optimum (gpvi's fpi is exact for
    Gaussian likelihoods) and the VLB is his collapsed bound, written out here."""
    X, y = data()
    m = sparse()
    ref = gpvi.fit(m, X, y)
    res = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1,
                   engine_options=dict(batch_size=N, subproblem_evals=0, step_size=1.0))
    np.testing.assert_allclose(res.state.mean, ref.state.mean, atol=1e-9)
    V, Vr = (np.asarray(s.chol) @ np.asarray(s.chol).T for s in (res.state, ref.state))
    np.testing.assert_allclose(V, Vr, atol=1e-9)
    Z = inducing()
    Kuu = se_ard(Z, Z, 1.0, ARD) + 1e-8 * np.eye(M)
    A = np.linalg.solve(np.linalg.cholesky(Kuu), se_ard(Z, X, 1.0, ARD))
    C = A.T @ A + 0.05 * np.eye(N)
    titsias = (-0.5 * y @ np.linalg.solve(C, y) - 0.5 * np.linalg.slogdet(C)[1] - N / 2 * np.log(2 * np.pi)
               - (N * 1.0 - np.trace(A.T @ A)) / (2 * 0.05))
    assert abs(res.vlb - titsias) < 1e-7 * abs(titsias)
    assert isinstance(res.model.kernel, MultiscaleRBF)


@pytest.mark.slow
def test_whole_data_subproblem_is_batch_sparse_gpr():
    """B = N and γ = 1: the collapsed subproblem is Titsias's bound as a function of (θ, Z, l):
    same value as gpvi's exact (fpi) VLB and the same gradient as gpvi's profile bound
    (autodiff at the optimal q, envelope theorem), at a point away from any optimum."""
    from gpvi._module import flatten_params
    from gpvi.objective import make_chunks, prior_state, vlb_in_hyperparameters

    X, y = data()
    rng = np.random.default_rng(4)
    model = gpvi.SparseGP(MultiscaleRBF(variance=1.4, lengthscale=ARD, inducing_lengthscale=rng.uniform(0.5, 2, (M, D))),
                          Gaussian(variance=0.07), inducing=inducing(), mean=0.2)
    names = [n for n, t in model.transforms().items() if t != "fixed"]
    ref = gpvi.fit(model, X, y)
    theta = flatten_params(model, names)
    prev = iv._prev(model, prior_state(M))
    batch = tuple(jnp.asarray(a) for a in (X, y, np.zeros(N), np.ones(N)))
    val, g = iv._neg_collapsed_and_grad(theta, model, prev, batch, 1.0, 1.0)
    assert abs(-float(val) - ref.vlb) < 1e-9 * abs(ref.vlb)

    def profile(th):
        from gpvi._module import unflatten_params
        return vlb_in_hyperparameters(unflatten_params(model, th), jnp.asarray(X), make_chunks(X, y), ref.state)

    g_ref = jax.grad(profile)(theta)
    for name in names:
        np.testing.assert_allclose(-np.asarray(g[name]), np.asarray(g_ref[name]), rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_whole_data_subproblem_matches_batch_hyperparameter_learning(monkeypatch):
    """B = N and γ = 1, inducing inputs and inducing lengthscales fixed: iVSGPRada's subproblem,
    solved fully, lands on the hyperparameters that gpvi's batch L-BFGS-B learns for the Titsias
    bound of the same model (multiscale kernel: the inducing functions do not follow ℓ)."""
    X, y = data()
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance"]
    m = iv.prepare_model(sparse(var=0.7, ls=np.array([1.0, 1.2]), noise=0.1))
    batch = gpvi.fit(m, X, y, learn_hyperparameters=names, tol=1e-10)
    # solved fully: the paper's 1e-5 relative change can stop on a plateau of this small problem
    monkeypatch.setattr(iv, "ADA_RTOL", 1e-12)
    res = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1,
                   engine_options=dict(batch_size=N, subproblem_evals="ada", step_size=1.0, learn=names,
                                       ada_max_evals=200))
    # it stopped on the relative-change rule (solved), not on the evaluation budget: it used
    # n < 200 evaluations, and a budget of n − 1 does bind (the run then uses exactly n − 1)
    n = res.extras["subproblem_evaluations"][0]
    assert n < 200, "the subproblem used the whole budget of 200 evaluations: not solved by its rule"
    assert n >= 2, f"the subproblem stopped after {n} evaluation: L-BFGS-B made no step"
    capped = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1,
                      engine_options=dict(batch_size=N, subproblem_evals="ada", step_size=1.0, learn=names,
                                          ada_max_evals=n - 1))
    assert capped.extras["subproblem_evaluations"][0] == n - 1
    assert abs(res.vlb - batch.vlb) < 1e-6 * abs(batch.vlb)
    for name in names:
        np.testing.assert_allclose(res.model.parameters()[name], batch.model.parameters()[name], rtol=1e-2,
                                   err_msg=name)


def _kl(m0, S0, m1, S1):
    """KL(N(m0, S0) ‖ N(m1, S1))."""
    L1 = np.linalg.cholesky(S1)
    a = np.linalg.solve(L1, m1 - m0)
    B = np.linalg.solve(L1, np.linalg.cholesky(S0))
    return 0.5 * (np.sum(B**2) + a @ a - len(m0) - 2 * np.sum(np.log(np.diag(B))))


def test_subproblem_objective_and_its_optimum_across_inducing_sets():
    """With Z, l and θ all changed from q_t's, the closed-form q(u) maximises
    γ[(N/B) Σ E − KL(q‖p)] − (1−γ) KL(q‖q_t) and the collapsed value equals that objective;
    KL(q‖q_t) is computed here in the joint space of both sets of inducing functions."""
    X, y = data()
    Xb, yb = X[:40], y[:40]
    scale, gamma = N / 40, 0.37
    rng = np.random.default_rng(11)
    old = iv.prepare_model(sparse())
    lt = np.asarray(old.kernel.inducing_lengthscale)
    Ct = np.tril(rng.normal(size=(M, M))) * 0.3 + np.eye(M) * 0.8
    qt = State(jnp.asarray(rng.normal(size=M)), jnp.asarray(Ct))
    Zn = inducing(seed=7)
    ln = rng.uniform(0.6, 2.5, size=(M, D))
    new = old.replace(kernel=MultiscaleRBF(variance=1.6, lengthscale=np.array([1.1, 0.9]), inducing_lengthscale=ln),
                      likelihood=Gaussian(variance=0.08), inducing=jnp.asarray(Zn))
    prev = iv._prev(old, qt)
    # 40 rows padded to 48: the padding must drop out
    Xp, yp = np.vstack([Xb, X[100:108]]), np.concatenate([yb, y[100:108]])
    batch = tuple(jnp.asarray(a) for a in (Xp, yp, np.zeros(48), np.r_[np.ones(40), np.zeros(8)]))
    state, _ = iv._update(new, prev, batch, scale, gamma)
    value = float(iv._collapsed(new, prev, batch, scale, gamma))

    Zt = inducing()
    Z_all = np.vstack([Zt, Zn])
    l_all = np.vstack([lt, ln])
    # the models' jitter 1e-8·I, as a white part of each inducing function that keeps its index
    G = eq17(Z_all, l_all, Z_all, l_all) + 1e-8 * np.kron(np.ones((2, 2)), np.eye(M))
    Lt, Ln = np.linalg.cholesky(G[:M, :M]), np.linalg.cholesky(G[M:, M:])

    def joint(which, mean, chol):
        """The Gaussian of (u_t, u_new) of a posterior on inducing set ``which``."""
        a, b = (slice(0, M), slice(M, None)) if which == "t" else (slice(M, None), slice(0, M))
        L = Lt if which == "t" else Ln
        mu_a, S_a = L @ mean, L @ chol @ chol.T @ L.T
        P = G[b, a] @ np.linalg.inv(G[a, a])
        mu = np.zeros(2 * M)
        S = np.zeros((2 * M, 2 * M))
        mu[a], mu[b] = mu_a, P @ mu_a
        S[a, a], S[b, a] = S_a, P @ S_a
        S[a, b] = S[b, a].T
        S[b, b] = G[b, b] - P @ G[a, b] + P @ S_a @ P.T
        return mu, S

    def objective(mean, chol):
        Kzx = 1.6 * eq17(Zn, ln, Xb, np.array([1.1, 0.9]))
        A = np.linalg.solve(np.sqrt(1.6) * Ln, Kzx)
        mf = mean @ A
        vf = 1.6 - np.sum(A**2, 0) + np.sum((chol.T @ A) ** 2, 0)
        E = -0.5 * (np.log(2 * np.pi * 0.08) + ((yb - mf) ** 2 + vf) / 0.08)
        kl_p = 0.5 * (np.sum(chol**2) + mean @ mean - M - 2 * np.sum(np.log(np.abs(np.diag(chol)))))
        kl_t = _kl(*joint("n", mean, chol), *joint("t", np.asarray(qt.mean), Ct))
        return gamma * (scale * E.sum() - kl_p) - (1 - gamma) * kl_t

    m_opt, C_opt = np.asarray(state.mean), np.asarray(state.chol)
    best = objective(m_opt, C_opt)
    assert abs(best - value) < 1e-6 * abs(best)
    for _ in range(5):
        dm, dC = 0.02 * rng.normal(size=M), 0.02 * np.tril(rng.normal(size=(M, M)))
        assert objective(m_opt + dm, C_opt + dC) < best


def test_mirror_step_averages_natural_parameters():
    """θ and Z fixed: the step is η ← (1−γ) η_t + γ η̂ with η̂ the natural parameters of the
    N/B-weighted minibatch posterior (Hensman et al. 2013)."""
    X, y = data()
    m = sparse()
    rng = np.random.default_rng(2)
    Ct = np.tril(rng.normal(size=(M, M))) * 0.2 + np.eye(M)
    qt = State(jnp.asarray(rng.normal(size=M)), jnp.asarray(Ct))
    gamma = 0.3
    res = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1, init=qt,
                   engine_options=dict(batch_size=N, subproblem_evals=0, step_size=gamma))
    Z = inducing()
    A = np.linalg.solve(np.linalg.cholesky(se_ard(Z, Z, 1.0, ARD) + 1e-8 * np.eye(M)), se_ard(Z, X, 1.0, ARD))
    Pt = np.linalg.inv(Ct @ Ct.T)
    Lam = (1 - gamma) * Pt + gamma * (np.eye(M) + A @ A.T / 0.05)
    h = (1 - gamma) * Pt @ np.asarray(qt.mean) + gamma * A @ y / 0.05
    C = np.asarray(res.state.chol)
    np.testing.assert_allclose(C @ C.T, np.linalg.inv(Lam), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(res.state.mean, np.linalg.solve(Lam, h), rtol=1e-6, atol=1e-8)


def test_without_subproblem_it_is_sfp():
    """θ and Z fixed, constant step size, B = N: three ivsgpr steps equal three steps of gpvi's
    stochastic fixed point (natural-parameter averaging, engine 'sfp')."""
    X, y = data()
    m = sparse()
    a = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=3,
                 engine_options=dict(batch_size=N, subproblem_evals=0, step_size=0.4))
    b = gpvi.fit(m, X, y, engine="sfp", max_iter=3, engine_options=dict(batch_size=N, schedule=0.4, epochs=3))
    np.testing.assert_allclose(a.state.mean, b.state.mean, rtol=1e-8, atol=1e-9)
    Va, Vb = (np.asarray(s.chol) @ np.asarray(s.chol).T for s in (a.state, b.state))
    np.testing.assert_allclose(Va, Vb, rtol=1e-8, atol=1e-10)
    assert abs(a.vlb - b.vlb) < 1e-8 * abs(b.vlb)


@pytest.mark.slow
def test_streaming_run_learns():
    """Minibatches of 40 with the paper's step sizes: iVSGPR5 ends above the bound of the
    starting hyperparameters' Titsias optimum, and above VSGPR-svi (subproblem off)."""
    X, y = data()
    m = sparse(var=0.5, ls=np.array([2.0, 2.0]), noise=0.3)
    start = gpvi.fit(m, X, y).vlb
    svi = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=20, engine_options=dict(batch_size=40, subproblem_evals=0))
    iv5 = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=20, engine_options=dict(batch_size=40, subproblem_evals=5))
    assert len(iv5.trace) == 21 and np.all(np.isfinite(iv5.trace))
    assert iv5.extras["subproblem_evaluations"] == [5] * 20  # the budget is a hard bound
    assert iv5.vlb > start and iv5.vlb > svi.vlb
    assert svi.vlb <= start + 1e-9  # θ, Z fixed: nothing beats the Titsias optimum
    # the returned fit predicts with the learned model (its prior factor, not the start's)
    from gpvi.fitting.predict import latent_moments
    ref = latent_moments(iv5.model, iv5.model.prior_cache(None), iv5.state, X[:10])
    np.testing.assert_allclose(iv5.predict_f(X[:10])[0], ref[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(iv5.predict_f(X[:10])[1], ref[1], rtol=1e-10, atol=1e-12)
    # learn_hyperparameters names restrict what the subproblem learns
    only = gpvi.fit(m, X, y, engine="ivsgpr", max_iter=2, learn_hyperparameters=["likelihood.variance"],
                    engine_options=dict(batch_size=40, subproblem_evals=5))
    np.testing.assert_array_equal(np.asarray(only.model.inducing), inducing())
    assert float(only.model.kernel.variance) == 0.5 and float(only.model.likelihood.variance) != 0.3


def test_bad_input():
    X, y = data()
    m = sparse()
    with pytest.raises(ValueError, match="Gaussian likelihood"):
        gpvi.fit(gpvi.SparseGP(RBF(), Poisson(), inducing=inducing()), X, np.ones(N, int), engine="ivsgpr")
    with pytest.raises(ValueError, match="SparseGP"):
        gpvi.fit(gpvi.GP(RBF(), Gaussian()), X[:20], y[:20], engine="ivsgpr")
    with pytest.raises(ValueError, match="RBF or MultiscaleRBF"):
        gpvi.fit(gpvi.SparseGP(Matern32(), Gaussian(), inducing=inducing()), X, y, engine="ivsgpr")
    with pytest.raises(ValueError, match="all input columns"):  # was silently run on every column
        gpvi.fit(gpvi.SparseGP(RBF(active_dims=(0,)), Gaussian(), inducing=inducing()), X, y, engine="ivsgpr")
    for opts, word in [({"batch_size": 0}, "batch_size"), ({"batch_size": N + 1}, "batch_size"),
                       ({"batch_size": 2.5}, "batch_size"), ({"subproblem_evals": -1}, "subproblem_evals"),
                       ({"subproblem_evals": "fast"}, "subproblem_evals"), ({"step_size": 0.0}, "step_size"),
                       ({"step_size": 1.5}, "step_size"), ({"step_size": "sqrt"}, "step_size"),
                       ({"learn": ["kernel.nope"]}, "learn"), ({"learn": 3}, "learn"),
                       ({"seed": "a"}, "seed")]:
        with pytest.raises(ValueError, match=word):
            gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1, engine_options=opts)
    with pytest.raises(ValueError, match="learn"):
        gpvi.fit(m, X, y, engine="ivsgpr", max_iter=1, learn_hyperparameters=["likelihood.nope"])
