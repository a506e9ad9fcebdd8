"""The hand-written derivative rules of the minibatch θ step against plain autodiff.

sfp's hyperparameter step differentiates a minibatch bound.  Three rules make that cheaper: the
squared distances of smooth kernels (``kernels._column_sqdist``), the per-column quadratic form
``f_iᵀ D f_i`` (``objective.blocks.column_quadratic``) and the bound summed in a sparse GP's raw
kernel features (``minibatch_vlb`` without ``proj``).  Each is checked here against the same
quantity written out with plain ``jax.numpy`` and differentiated by JAX itself, and sfp's shared
q-and-θ step against the two steps taken one after the other.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import kernels as K
from gpvi import likelihoods as L
from gpvi._module import flatten_params, unflatten_params
from gpvi.objective import State, minibatch_vlb
from gpvi.objective.blocks import column_quadratic
from gpvi.objective.minibatch import minibatch_projection
from gpvi.objective.state import Chunks


def _plain_sqdist(X1, X2, ls):
    d = (X1[:, None, :] - X2[None, :, :]) / ls
    return jnp.sum(d * d, axis=-1)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [K.RBF, K.RationalQuadratic])
def test_smooth_kernel_derivatives_match_plain_autodiff(rng, cls):
    # inputs far from the origin (the rule centres them) and some rows of X2 equal to rows of X1
    X1 = 40.0 + rng.normal(size=(9, 3))
    X2 = np.concatenate([X1[:3], 40.0 + rng.normal(size=(5, 3))])
    W = rng.normal(size=(9, 8))
    ls0 = np.array([0.7, 1.3, 2.1])

    def ours(ls, A, B):
        return jnp.sum(W * cls(variance=1.7, lengthscale=ls)(A, B))

    def plain(ls, A, B):
        d2 = _plain_sqdist(A, B, ls)
        if cls is K.RBF:
            k = jnp.exp(-0.5 * d2)
        else:  # RationalQuadratic, alpha = 1
            k = 1.0 / (1.0 + 0.5 * d2)
        return jnp.sum(W * 1.7 * k)

    args = (jnp.asarray(ls0), jnp.asarray(X1), jnp.asarray(X2))
    np.testing.assert_allclose(ours(*args), plain(*args), rtol=1e-12)
    g_ours = jax.grad(ours, argnums=(0, 1, 2))(*args)
    g_plain = jax.grad(plain, argnums=(0, 1, 2))(*args)
    for a, b in zip(g_ours, g_plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-7, atol=1e-9)
    # forward mode too (the rule is a JVP)
    t = (jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=X1.shape)), jnp.asarray(rng.normal(size=X2.shape)))
    np.testing.assert_allclose(jax.jvp(ours, args, t)[1], jax.jvp(plain, args, t)[1], rtol=1e-7)


def test_column_quadratic_derivatives_match_plain_autodiff(rng):
    d, n = 6, 11
    B = rng.normal(size=(d, d))
    D = jnp.asarray(B + B.T)
    F = jnp.asarray(rng.normal(size=(d, n)))
    w = jnp.asarray(rng.normal(size=n))

    def plain(D_, F_):
        return jnp.sum(w * jnp.einsum("in,ij,jn->n", F_, D_, F_))

    def ours(D_, F_):
        return jnp.sum(w * column_quadratic(D_, F_))

    sym = lambda f: (lambda S, F_: f(0.5 * (S + S.T), F_))  # noqa: E731  D as a symmetric matrix's function
    np.testing.assert_allclose(ours(D, F), plain(D, F), rtol=1e-12)
    for a, b in zip(jax.grad(sym(ours), argnums=(0, 1))(D, F), jax.grad(sym(plain), argnums=(0, 1))(D, F)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def _sparse_problem(rng, M=12, B=40, lik=None):
    X = rng.uniform(-2, 2, (B, 2))
    # inducing inputs in near pairs: K(Z, Z) has a condition number ~1e7, as learned Z often do
    Z = np.concatenate([X[:M // 2], X[:M // 2] + 0.05 * rng.normal(size=(M // 2, 2))])
    model = gpvi.SparseGP(K.RBF(variance=0.8, lengthscale=np.array([1.3, 0.9])), lik or L.Gaussian(variance=0.3),
                          inducing=Z, mean=0.2)
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=B)
    batch = Chunks(jnp.asarray(X), jnp.asarray(y), jnp.zeros(B), jnp.ones(B).at[-3:].set(0.0))
    m = rng.normal(size=M) * 0.3
    C = np.linalg.cholesky(0.4 * np.eye(M) + 0.05 * np.ones((M, M)))
    return model, batch, State(jnp.asarray(m), jnp.asarray(C))


@pytest.mark.slow
@pytest.mark.parametrize("lik", [L.Gaussian(variance=0.3), L.StudentT(df=4.0, scale=0.5)])
def test_minibatch_bound_in_raw_features_matches_the_projected_bound(rng, lik):
    model, batch, state = _sparse_problem(rng, lik=lik)
    names = ["kernel.variance", "kernel.lengthscale", "inducing", "mean"] + [
        "likelihood." + n for n in lik.transforms()]
    theta = flatten_params(model, names)

    def raw(th):  # no proj: the raw-feature path
        return minibatch_vlb(unflatten_params(model, th), batch, state, 3.0, 1)

    def projected(th):  # proj given: the per-batch projections L⁻¹ K(Z, X)
        mdl = unflatten_params(model, th)
        prior = mdl.prior_cache(None)
        return minibatch_vlb(mdl, batch, state, 3.0, 1, proj=minibatch_projection(mdl, prior, batch, 1))

    np.testing.assert_allclose(float(raw(theta)), float(projected(theta)), rtol=1e-9)
    g_raw, g_proj = jax.grad(raw)(theta), jax.grad(projected)(theta)
    for n in names:
        scale = np.max(np.abs(np.asarray(g_proj[n])))
        np.testing.assert_allclose(np.asarray(g_raw[n]), np.asarray(g_proj[n]), rtol=1e-6, atol=1e-8 * scale, err_msg=n)


@pytest.mark.slow
def test_sfp_shared_learning_step_matches_the_two_steps(rng):
    """sfp's learning step shares the prior factor, the kernel features and the bound at the
    proposal between its q step and its θ step; it must give what the two separate compiled
    steps give: the same proposal, the safeguard's bound there and Adam's new θ and moments."""
    from gpvi.engines import sfp
    from gpvi.engines._common import state_S
    model, batch, state = _sparse_problem(rng)
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance", "inducing"]
    theta = flatten_params(model, names)
    opt = sfp._ADAM
    ost = opt.init(theta)
    # the learning step is given the state's precision as I − S_state (as sfp.run carries it); the
    # reference step is not, and takes the damped step from V's factor (triangular inverse)
    (sums, RH, new, v_new, ok_H, finite, new_S), (th1, ost1, ok) = sfp._fused_learning_step(
        theta, ost, model, batch, state, 3.0, 0.4, 0.01, 1, True, opt, state_S(state.chol))
    mdl = unflatten_params(model, theta)
    ref = sfp._fused_step(mdl, mdl.prior_cache(None), batch, state, 3.0, 0.4, 1, True)
    assert ref[6] is None
    # the proposal's own S_state is that of its factor
    np.testing.assert_allclose(np.asarray(new_S), np.asarray(state_S(new.chol)), rtol=1e-8, atol=1e-10)
    th2, ost2, ok2 = sfp._hyper_step(theta, ost, model, batch, ref[2], 3.0, 0.01, opt, 1)
    np.testing.assert_allclose(np.asarray(new.mean), np.asarray(ref[2].mean), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(new.chol), np.asarray(ref[2].chol), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(sums.vlb), float(ref[0].vlb), rtol=1e-12)
    np.testing.assert_allclose(float(v_new), float(ref[3]), rtol=1e-9)
    assert bool(ok) and bool(ok2) and bool(ok_H) and bool(finite)
    mu1, mu2 = ost1.mu, ost2.mu  # Adam's first moment: (1 − β₁)·gradient after one step
    for n in names:
        np.testing.assert_allclose(np.asarray(mu1[n]), np.asarray(mu2[n]), rtol=1e-6,
                                   atol=1e-8 * np.max(np.abs(np.asarray(mu2[n]))), err_msg=n)
        np.testing.assert_allclose(np.asarray(th1[n]), np.asarray(th2[n]), rtol=1e-8, atol=1e-10, err_msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("M", [40, 330])
def test_inverse_factor_tangent_matches_the_chain_through_cholesky(rng, M):
    """``models.base.inverse_factor``'s closed-form tangent, at a size where its triangular
    inverse recurses (M > 320), against JAX's derivative of the Cholesky factorisation and the
    triangular inverse in a symmetric direction dK, and against the formula in dense NumPy in
    any direction (it is linear in dK either way)."""
    from jax.scipy.linalg import solve_triangular

    from gpvi.models.base import inverse_factor

    A = rng.normal(size=(M, M))
    K0 = jnp.asarray(A @ A.T / M + 0.5 * np.eye(M))  # condition number ~10
    dirs = [rng.normal(size=(M, M))]
    dirs.append(dirs[0] + dirs[0].T)

    def ours(K):
        return inverse_factor(K, jnp.linalg.cholesky(K))

    def chain(K):
        Lk = jnp.linalg.cholesky(0.5 * (K + K.T))
        return solve_triangular(Lk, jnp.eye(M), lower=True)

    for dK in dirs:
        dK = jnp.asarray(dK)
        v1, t1 = jax.jvp(ours, (K0,), (dK,))
        v2, t2 = jax.jvp(chain, (K0,), (0.5 * (dK + dK.T),))
        np.testing.assert_allclose(np.asarray(v1), np.asarray(v2), rtol=0, atol=1e-12)
        if np.array_equal(np.asarray(dK), np.asarray(dK).T):  # the same tangent as the chain's
            np.testing.assert_allclose(np.asarray(t1), np.asarray(t2), rtol=0, atol=1e-10 * np.abs(t2).max())
        # and, in any direction, the formula −Φ(T dK Tᵀ) T with dense NumPy products
        T = np.linalg.inv(np.linalg.cholesky(np.asarray(K0)))
        P = T @ np.asarray(dK) @ T.T
        dense = -(np.tril(P, -1) + 0.5 * np.diag(np.diag(P))) @ T
        np.testing.assert_allclose(np.asarray(t1), dense, rtol=0, atol=1e-10 * np.abs(dense).max())
        assert np.all(np.triu(np.asarray(t1), 1) == 0.0)  # L⁻¹ stays lower triangular


@pytest.mark.slow
def test_sparse_gp_inverse_factor_derivative_matches_the_chain_through_cholesky(rng):
    """``SparseGP.caches`` gives ``L⁻¹`` a closed-form derivative in K(Z, Z); against JAX's own
    derivative of the Cholesky factor and the triangular inverse, on near-paired inducing
    inputs (K(Z, Z) condition ~1e7) and with the jitter's scale moving with the variance."""
    model, batch, state = _sparse_problem(rng)
    names = ["kernel.variance", "kernel.lengthscale", "inducing"]
    theta = flatten_params(model, names)
    W = jnp.asarray(rng.normal(size=(12, 12)))

    def ours(th):
        prior, T = unflatten_params(model, th).caches(None)
        return jnp.sum(W * T)

    def chain(th):
        mdl = unflatten_params(model, th)
        return jnp.sum(W * mdl.pass_cache(mdl.prior_cache(None)))

    np.testing.assert_allclose(float(ours(theta)), float(chain(theta)), rtol=1e-12)
    g1, g2 = jax.grad(ours)(theta), jax.grad(chain)(theta)
    for n in names:
        scale = np.max(np.abs(np.asarray(g2[n])))
        np.testing.assert_allclose(np.asarray(g1[n]), np.asarray(g2[n]), rtol=1e-6, atol=1e-8 * scale, err_msg=n)
