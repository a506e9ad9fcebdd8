"""Hyperparameter gradients of the VLB: autodiff against finite differences (central
differences at two steps, Richardson-extrapolated: a step of 1e-5 is too noisy for the
near-singular K of a full GP, see ``check_gradient``).

The function differentiated is the one :func:`gpvi.fit` hands to L-BFGS-B:
``theta (unconstrained, by dotted name) -> -VLB(unflatten_params(model, theta))`` with the
variational state held fixed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import kernels as K
from gpvi import likelihoods as L
from gpvi._module import flatten_params
from gpvi.fitting.hyper import neg_vlb as _neg_vlb
from gpvi.objective import Objective, State, make_chunks, vlb_in_hyperparameters

EPS = np.finfo(np.float64).eps
STEP = 1e-3  # Richardson-extrapolated central differences at STEP and STEP/2


def random_state(rng, d, scale=0.5):
    """A non-trivial q(w): random mean, lower-triangular chol with positive diagonal."""
    mean = rng.normal(0.0, scale, d)
    chol = np.tril(rng.normal(0.0, 0.1, (d, d)), -1) + np.diag(rng.uniform(0.3, 0.9, d))
    return State(jnp.asarray(mean), jnp.asarray(chol))


def prior_condition_number(model, X):
    """cond(K + jitter) of the matrix whose Cholesky factor whitens the model (1 for a GLM)."""
    if isinstance(model, gpvi.GLM):
        return 1.0
    Z = X if isinstance(model, gpvi.GP) else np.asarray(model.inducing)
    lam = np.linalg.eigvalsh(np.asarray(model.kernel(Z, Z)))
    return lam[-1] / max(lam[0], model.jitter * lam.mean())


def check_gradient(model, names, X, y, state, offset=None, chunk_size=64, check_objective=False):
    chunks = make_chunks(X, y, offset, chunk_size)
    Xj = jnp.asarray(X)
    # strong-typed float64 leaves, so perturbed copies share one jit signature
    theta0 = {n: jnp.asarray(np.asarray(v, np.float64)) for n, v in flatten_params(model, names).items()}
    # One compiled function for the value (finite differences) and the autodiff gradient.
    value_and_grad = jax.jit(jax.value_and_grad(lambda th: _neg_vlb(th, model, Xj, chunks, state)))
    f = lambda th: value_and_grad(th)[0]  # noqa: E731
    f0, grad = value_and_grad(theta0)
    f0 = float(f0)
    assert np.isfinite(f0)
    if check_objective:
        # The differentiable VLB and the engines' Objective agree.
        obj = Objective(model, X, y, offset, chunk_size=chunk_size)
        np.testing.assert_allclose(-f0, float(obj.vlb(state)), rtol=1e-11)

    # Rounding noise of the VLB: ~100·eps relative for sums and factorisations, amplified
    # by sqrt(cond K) through the whitened map f = L w when K is near-singular (full GP with
    # a smooth kernel: cond ~ 1e9; this model was checked against the observed noise).
    noise = EPS * max(abs(f0), 1.0) * max(100.0, 10.0 * np.sqrt(prior_condition_number(model, X)))
    # Richardson: (4 D(h/2) − D(h))/3 has truncation O(h⁴ f⁽⁵⁾) ≲ 1e-10 and rounding ≲ 3·noise/h.
    atol = 3.0 * noise / STEP + 1e-9

    def central(name, base, idx, h):
        plus, minus = base.copy(), base.copy()
        plus[idx] += h
        minus[idx] -= h
        return (float(f({**theta0, name: jnp.asarray(plus)}))
                - float(f({**theta0, name: jnp.asarray(minus)}))) / (2 * h)

    for name in names:
        base = np.asarray(theta0[name], dtype=np.float64)
        fd = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            fd[idx] = (4 * central(name, base, idx, STEP / 2) - central(name, base, idx, STEP)) / 3
        g = np.asarray(grad[name])
        assert g.shape == base.shape
        assert np.any(np.abs(fd) > 10 * atol), f"{name}: gradient too small to test"
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=atol, err_msg=name)
    return grad


@pytest.mark.slow
def test_sparse_gp_gaussian_rbf_ard():
    rng = np.random.default_rng(101)
    N, M, D = 150, 8, 2
    X = rng.uniform(-2, 2, (N, D))
    y = np.sin(2 * X[:, 0]) + 0.3 * X[:, 1] + 0.2 * rng.normal(size=N)
    Z = X[rng.choice(N, M, replace=False)] + 0.05 * rng.normal(size=(M, D))
    model = gpvi.SparseGP(kernel=K.RBF(variance=1.3, lengthscale=np.array([0.8, 1.5])),
                          likelihood=L.Gaussian(variance=0.15), inducing=Z, mean=0.2).initialise(X)
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance", "mean", "inducing"]
    assert set(names) == set(gpvi.learnable_parameters(model, learn_inducing=True))
    check_gradient(model, names, X, model.likelihood.validate(y), random_state(rng, M), check_objective=True)


def test_sparse_gp_poisson():
    rng = np.random.default_rng(102)
    N, M, D = 120, 6, 2
    X = rng.uniform(-2, 2, (N, D))
    offset = rng.uniform(-0.5, 0.5, N)
    y = rng.poisson(np.exp(0.5 + np.cos(X[:, 0]) - 0.3 * X[:, 1] + offset)).astype(float)
    Z = X[rng.choice(N, M, replace=False)]
    model = gpvi.SparseGP(kernel=K.Matern52(variance=0.8, lengthscale=np.array([1.2, 0.9])),
                          likelihood=L.Poisson(), inducing=Z, mean=0.3).initialise(X)
    names = ["kernel.variance", "kernel.lengthscale", "mean", "inducing"]
    assert set(names) == set(gpvi.learnable_parameters(model, learn_inducing=True))
    check_gradient(model, names, X, model.likelihood.validate(y), random_state(rng, M, 0.3), offset=offset)


@pytest.mark.slow
def test_sparse_gp_ordinal():
    rng = np.random.default_rng(103)
    N, M, D = 150, 7, 2
    X = rng.uniform(-2, 2, (N, D))
    f = 1.5 * np.sin(X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=N)
    edges = np.array([-1.0, 0.2, 1.3])
    y = np.searchsorted(edges, f).astype(float)
    assert set(np.unique(y)) == {0.0, 1.0, 2.0, 3.0}
    Z = X[rng.choice(N, M, replace=False)]
    model = gpvi.SparseGP(kernel=K.RBF(variance=1.5, lengthscale=0.9),
                          likelihood=L.Ordinal(edges=edges, shape=2.0), inducing=Z).initialise(X)
    names = ["likelihood.edges", "likelihood.shape", "kernel.variance", "kernel.lengthscale", "mean"]
    check_gradient(model, names, X, model.likelihood.validate(y), random_state(rng, M))


def test_full_gp_bernoulli():
    rng = np.random.default_rng(104)
    N, D = 50, 2
    X = rng.normal(size=(N, D))
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(int)
    kernel = K.RBF(variance=2.0, lengthscale=np.array([1.0, 1.7])) + K.Linear(variance=0.3)
    model = gpvi.GP(kernel=kernel, likelihood=L.Bernoulli(link="logit"), mean=-0.1).initialise(X)
    names = gpvi.learnable_parameters(model)
    assert set(names) == {"kernel.kernels.0.variance", "kernel.kernels.0.lengthscale",
                          "kernel.kernels.1.variance", "mean"}
    # chunks of 17 rows, one padded: the projections are gathered from Lᵀ (training_chunks)
    check_gradient(model, names, X, model.likelihood.validate(y), random_state(rng, N), chunk_size=17)


def test_glm_poisson_prior_variance():
    rng = np.random.default_rng(105)
    N, D = 120, 4
    X = np.column_stack([np.ones(N), rng.normal(size=(N, D - 1))])
    offset = rng.uniform(-0.3, 0.3, N)
    y = rng.poisson(np.exp(X @ np.array([0.5, 0.4, -0.3, 0.2]) + offset)).astype(float)
    model = gpvi.GLM(likelihood=L.Poisson(), prior_variance=0.7)
    names = gpvi.learnable_parameters(model)
    assert names == ["prior_variance"]
    check_gradient(model, names, X, model.likelihood.validate(y), random_state(rng, D, 0.8), offset=offset,
                   chunk_size=50)


def test_glm_gaussian_vlb_and_gradient_closed_form():
    """An independent VLB: GLM, Gaussian noise, whitened q(u) = N(m, LLᵀ), w = σ_p u.

    VLB = Σ_i −½[log 2πσ² + ((y_i − σ_p h_i·m)² + σ_p² h_iᵀ V h_i)/σ²] − KL(N(m, V) ‖ N(0, I)).
    """
    rng = np.random.default_rng(106)
    N, D = 80, 3
    X = rng.normal(size=(N, D))
    y = X @ np.array([0.7, -0.2, 0.4]) + 0.3 * rng.normal(size=N)
    sp2, s2 = 0.6, 0.2
    model = gpvi.GLM(likelihood=L.Gaussian(variance=s2), prior_variance=sp2)
    state = random_state(rng, D)
    m, Lc = np.asarray(state.mean), np.asarray(state.chol)
    V = Lc @ Lc.T

    def vlb(sp2, s2):
        sp = np.sqrt(sp2)
        mu = sp * X @ m
        var = sp2 * np.einsum("nd,de,ne->n", X, V, X)
        e = -0.5 * (np.log(2 * np.pi * s2) + ((y - mu) ** 2 + var) / s2)
        kl = 0.5 * (np.trace(V) + m @ m - D - np.linalg.slogdet(V)[1])
        return e.sum() - kl

    chunks = make_chunks(X, y, None, 32)
    got = float(jax.jit(vlb_in_hyperparameters)(model, jnp.asarray(X), chunks, state))
    np.testing.assert_allclose(got, vlb(sp2, s2), rtol=1e-12)
    # the same with the projections in D row blocks of one row each
    split = float(jax.jit(vlb_in_hyperparameters, static_argnames="blocks")(model, jnp.asarray(X), chunks, state,
                                                                            blocks=D))
    np.testing.assert_allclose(split, vlb(sp2, s2), rtol=1e-12)
    # d/d log σ² and d/d log σ_p² of the closed form, analytically:
    sp = np.sqrt(sp2)
    r = y - sp * X @ m
    q = np.einsum("nd,de,ne->n", X, V, X)
    d_log_s2 = np.sum(-0.5 + (r**2 + sp2 * q) / (2 * s2))
    d_log_sp2 = np.sum((r * sp * (X @ m) - sp2 * q) / (2 * s2))
    theta = flatten_params(model, ["likelihood.variance", "prior_variance"])
    g = jax.jit(jax.grad(lambda th: _neg_vlb(th, model, jnp.asarray(X), chunks, state)))(theta)
    np.testing.assert_allclose(-float(g["likelihood.variance"]), d_log_s2, rtol=1e-11)
    np.testing.assert_allclose(-float(g["prior_variance"]), d_log_sp2, rtol=1e-11)


# ---- full GPs: the hypergradient with q held fixed in function space (vlb_envelope) -------------
def _carried_vlb(model, names, X, chunks, state):
    """``theta -> VLB`` with ``q`` held fixed over the training latents ``f`` at its value under
    ``model``: the whitened state is mapped into each θ's coordinates,
    ``w(θ) = L(θ)⁻¹ (μ₀ + L₀ w₀ − μ(θ))``, ``chol(θ) = L(θ)⁻¹ L₀ chol₀`` (latent by latent)."""
    from jax.scipy.linalg import solve_triangular

    from gpvi._module import unflatten_params

    Xj = jnp.asarray(X)
    multi = hasattr(model, "latents")
    lat0 = model.latents if multi else (model,)
    means0 = state.mean if multi else state.mean[None]
    chols0 = state.chol if multi else state.chol[None]
    f0 = [(l.mean + l.prior_cache(Xj)[1] @ m, l.prior_cache(Xj)[1] @ c) for l, m, c in zip(lat0, means0, chols0)]

    def vlb(theta):
        mdl = unflatten_params(model, theta)
        lats = mdl.latents if multi else (mdl,)
        ws, cs = [], []
        for l, (mf, Lc) in zip(lats, f0):
            L = l.prior_cache(Xj)[1]
            ws.append(solve_triangular(L, mf - l.mean, lower=True))
            cs.append(solve_triangular(L, Lc, lower=True))
        st = State(jnp.stack(ws), jnp.stack(cs)) if multi else State(ws[0], cs[0])
        return vlb_in_hyperparameters(mdl, Xj, chunks, st)

    return vlb


def _envelope_cases():
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    rng = np.random.default_rng(107)
    N = 36
    X = rng.normal(size=(N, 2))
    t = gpvi.GP(K.RBF(variance=1.5, lengthscale=np.array([0.8, 1.3])), L.StudentT(df=4.0, scale=0.4), mean=0.3)
    yt = np.sin(X[:, 0]) + 0.3 * rng.standard_t(3, N)
    b = gpvi.GP(K.RBF(variance=2.0, lengthscale=1.0) + K.Linear(variance=0.3), L.Bernoulli(), mean=-0.2)
    yb = (X[:, 0] - X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(float)
    s = MultiLatent.full([K.RBF(variance=v, lengthscale=l) for v, l in ((2.0, 1.0), (1.0, 0.7), (0.5, 2.0))],
                         Softmax(num_classes=3), mean=[0.1, -0.2, 0.3])
    ys = rng.integers(0, 3, N).astype(float)
    return [("studentt", t, X, yt), ("bernoulli", b, X, yb), ("softmax", s, X, ys)]


#: the softmax case with one kernel variance and lengthscale tied across the three latents: the
#: envelope sums their terms through one pair of triangular solves (MultiLatent._same_prior)
_TIED = ["latents.*.kernel.variance", "latents.*.kernel.lengthscale", "latents.0.mean", "latents.1.mean",
         "latents.2.mean"]


@pytest.mark.parametrize("case,tied", [(0, False), (1, False), (2, False), (2, True)],
                         ids=["studentt", "bernoulli", "softmax", "softmax-tied"])
@pytest.mark.slow
def test_envelope_gradient_is_the_gradient_with_q_fixed_in_function_space(case, tied):
    """At any state (here a random one, far from the optimum) the closed-form gradient of
    :func:`vlb_envelope` — ∂VLB/∂K = ½L⁻ᵀ(V + wwᵀ − I)L⁻¹, ∂VLB/∂μ = 1ᵀL⁻ᵀw, the likelihood's
    parameters at fixed marginals — equals autodiff of the VLB with q mapped into each θ's
    whitened coordinates so that q(f) stays put (through the Cholesky factor, no closed form)."""
    from gpvi._module import unflatten_params
    from gpvi.objective import vlb_envelope

    name, model, X, y = _envelope_cases()[case]
    model = model.initialise(X)
    names = _TIED if tied else gpvi.learnable_parameters(model)
    if tied:  # the model at the tied values (the prior cache below must be at the same parameters)
        model = unflatten_params(model, flatten_params(model, names))
        assert model._same_prior() == [0, 0, 0]
    y = model.likelihood.validate(y)
    rng = np.random.default_rng(108)
    Q = getattr(model, "num_latents", None)
    st = [random_state(rng, X.shape[0]) for _ in range(Q or 1)]
    state = State(jnp.stack([s.mean for s in st]), jnp.stack([s.chol for s in st])) if Q else st[0]
    obj = Objective(model, X, y, chunk_size=16)
    theta = flatten_params(model, names)
    want = jax.grad(_carried_vlb(model, names, X, obj.chunks, state))(theta)
    got = jax.grad(lambda th: vlb_envelope(unflatten_params(model, th), obj.prior, obj.chunks, state, obj.blocks,
                                           obj.proj))(theta)
    for n in names:
        assert np.all(np.abs(np.asarray(want[n])) > 1e-3), n
        np.testing.assert_allclose(np.asarray(got[n]), np.asarray(want[n]), rtol=1e-7, atol=1e-9, err_msg=n)


@pytest.mark.parametrize("case", range(3), ids=["studentt", "bernoulli", "softmax"])
@pytest.mark.slow
def test_envelope_gradient_is_the_profile_gradient_at_the_optimum(case):
    """At the optimal q the envelope gradient, the whitened autodiff gradient (q held fixed in
    the other coordinates) and central differences of the profile bound max_q VLB(θ) (each
    evaluated by a converged fit) agree: the envelope theorem, which is why gpvi.fit may use
    the cheaper one."""
    from gpvi._module import unflatten_params
    from gpvi.fitting.hyper import neg_envelope_grad as _neg_envelope_grad

    name, model, X, y = _envelope_cases()[case]
    model = model.initialise(X)
    names = gpvi.learnable_parameters(model)
    yv = model.likelihood.validate(y)
    theta = flatten_params(model, names)
    flat, unravel = jax.flatten_util.ravel_pytree(theta)
    res = gpvi.fit(model, X, y, tol_nats=1e-12)
    obj = Objective(model, X, yv)
    env = jax.flatten_util.ravel_pytree(
        _neg_envelope_grad(theta, model, obj.prior, obj.chunks, res.state, obj.proj, obj.blocks, True))[0]
    whitened = jax.flatten_util.ravel_pytree(jax.grad(
        lambda th: _neg_vlb(th, model, jnp.asarray(X), make_chunks(X, yv), res.state))(theta))[0]
    np.testing.assert_allclose(np.asarray(env), np.asarray(whitened), rtol=1e-5, atol=1e-6)

    def profile(x):  # -max_q VLB at θ = x, by a converged fit warm-started at the optimum
        return -gpvi.fit(unflatten_params(model, unravel(jnp.asarray(x))), X, y, tol_nats=1e-12,
                         init=res.state).vlb

    h = 1e-4
    for i in range(flat.size):
        e = np.zeros(flat.size)
        e[i] = h
        fd = (profile(np.asarray(flat) + e) - profile(np.asarray(flat) - e)) / (2 * h)
        np.testing.assert_allclose(float(env[i]), fd, rtol=1e-4, atol=1e-5, err_msg=f"θ[{i}]")


@pytest.mark.slow
def test_full_gp_search_with_the_envelope_gradient_reaches_the_autodiff_optimum(monkeypatch):
    """The hyperparameter search of a full GP (now on the envelope gradient) ends at the same
    bound as with the whitened autodiff gradient it replaced."""
    import importlib

    fit_module = importlib.import_module("gpvi.fitting.hyper")
    name, model, X, y = _envelope_cases()[0]
    new = gpvi.fit(model, X, y, learn_hyperparameters=True)
    monkeypatch.setattr(fit_module, "full_gp_latents", lambda m: False)
    old = gpvi.fit(model, X, y, learn_hyperparameters=True)
    assert new.hyperparameter_rounds >= 2
    np.testing.assert_allclose(new.vlb, old.vlb, rtol=1e-6)


# ---- sparse GPs: the hypergradient with q held fixed over the inducing values (sparse_envelope) ---
def _sparse_cases():
    rng = np.random.default_rng(211)
    N, M = 60, 7
    X = rng.normal(size=(N, 2))
    Z = X[rng.choice(N, M, replace=False)] + 0.05
    t = gpvi.SparseGP(K.RBF(variance=1.5, lengthscale=np.array([0.8, 1.3])), L.StudentT(df=4.0, scale=0.4),
                      inducing=Z, mean=0.3)
    yt = np.sin(X[:, 0]) + 0.3 * rng.standard_t(3, N)
    b = gpvi.SparseGP(K.RBF(variance=2.0, lengthscale=1.0) + K.Linear(variance=0.3), L.Bernoulli(), inducing=Z,
                      mean=-0.2)
    yb = (X[:, 0] - X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(float)
    return [("studentt", t, X, yt), ("bernoulli", b, X, yb)]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(2), ids=["studentt", "bernoulli"])
def test_sparse_envelope_is_the_vlb_with_q_fixed_over_the_inducing_values(case):
    """At a random state, far from the optimum: the value of :func:`sparse_envelope` is the VLB of
    the Objective, and its gradient (every learnable parameter, the inducing inputs, the mean and
    the likelihood's included) equals autodiff of the whitened VLB with the state mapped into each
    θ's coordinates so that q(u) stays put: ``w(θ) = L(θ)⁻¹ L₀ w₀``, ``chol(θ) = L(θ)⁻¹ L₀ chol₀``."""
    from jax.scipy.linalg import solve_triangular

    from gpvi._module import unflatten_params
    from gpvi.objective import sparse_envelope

    name, model, X, y = _sparse_cases()[case]
    names = gpvi.learnable_parameters(model) + ["inducing"]
    y = model.likelihood.validate(y)
    state = random_state(np.random.default_rng(212), model.num_weights(X))
    obj = Objective(model, X, y, chunk_size=16)
    theta = flatten_params(model, names)
    L0 = model.prior_cache(None)
    u_mean, u_chol = L0 @ state.mean, L0 @ state.chol

    def carried(th):
        mdl = unflatten_params(model, th)
        L = mdl.prior_cache(None)
        st = State(solve_triangular(L, u_mean, lower=True), solve_triangular(L, u_chol, lower=True))
        return vlb_in_hyperparameters(mdl, jnp.asarray(X), obj.chunks, st)

    def envelope(th):
        return sparse_envelope(unflatten_params(model, th), obj.chunks, state)

    np.testing.assert_allclose(float(envelope(theta)), float(obj.vlb(state)), rtol=1e-11)
    want, got = jax.grad(carried)(theta), jax.grad(envelope)(theta)
    for n in names:
        assert np.all(np.abs(np.asarray(want[n])) > 1e-4), n
        np.testing.assert_allclose(np.asarray(got[n]), np.asarray(want[n]), rtol=1e-7, atol=1e-9, err_msg=n)


@pytest.mark.slow
def test_sparse_envelope_is_the_whitened_gradient_at_the_optimum():
    """The envelope theorem: at the optimal q, holding q fixed over u or over the whitened w gives
    the same gradient (what lets gpvi.fit use the cheaper one); away from it they differ."""
    from gpvi.fitting.hyper import neg_sparse_envelope_and_grad, neg_vlb_and_grad

    name, model, X, y = _sparse_cases()[1]
    names = gpvi.learnable_parameters(model) + ["inducing"]
    yv = model.likelihood.validate(y)
    theta = flatten_params(model, names)
    obj = Objective(model, X, yv, chunk_size=16)
    flat = lambda g: np.asarray(jax.flatten_util.ravel_pytree(g)[0])  # noqa: E731
    for state, agree in [(gpvi.fit(model, X, y, tol_nats=1e-12).state, True),
                         (random_state(np.random.default_rng(213), model.num_weights(X)), False)]:
        _, g_u = neg_sparse_envelope_and_grad(theta, model, obj.chunks, state)
        _, g_w = neg_vlb_and_grad(theta, model, jnp.asarray(X), obj.chunks, state)
        rel = np.max(np.abs(flat(g_u) - flat(g_w))) / np.max(np.abs(flat(g_w)))
        assert (rel < 1e-6) if agree else (rel > 1e-3), rel
