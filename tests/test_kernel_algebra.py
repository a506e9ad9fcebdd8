"""Kernel algebra as users write it (issue 33): ``c * k``, ``k + c``, positional arguments,
``active_dims``, the Periodic, RationalQuadratic and Polynomial kernels, a user's kernel saved
without ``register``.

Every kernel is checked against its formula written out here in NumPy (never taken from
gpvi.kernels) and against scikit-learn's kernel of the same family with its parameters converted
explicitly; gradients with respect to the (log) parameters against central finite differences.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.gaussian_process import kernels as SK

import gpvi
from gpvi import kernels as K
from gpvi._module import flatten_params, unflatten_params
from gpvi.fitting import codec


# ------------------------------------------------------------------------------- NumPy oracles
def np_periodic(X1, X2, s2, ell, p):
    """s² exp(−2 Σ_d sin²(π (x_d − x'_d) / p_d) / ℓ_d²), broadcast over pairs."""
    diff = X1[:, None, :] - X2[None, :, :]
    return s2 * np.exp(-2.0 * np.sum(np.sin(np.pi * diff / np.asarray(p)) ** 2 / np.asarray(ell) ** 2, axis=-1))


def np_rq(X1, X2, s2, ell, alpha):
    """s² (1 + r² / (2α))^(−α), r = |x − x'| / ℓ."""
    r2 = np.sum(((X1[:, None, :] - X2[None, :, :]) / np.asarray(ell)) ** 2, axis=-1)
    return s2 * (1.0 + r2 / (2.0 * alpha)) ** (-alpha)


def np_poly(X1, X2, degree, s2, c):
    """(Σ_d s²_d x_d x'_d + c)^degree."""
    return (np.einsum("id,jd,d->ij", X1, X2, np.broadcast_to(np.asarray(s2, float), X1.shape[1])) + c) ** degree


def np_rbf(X1, X2, s2, ell):
    r2 = np.sum(((X1[:, None, :] - X2[None, :, :]) / np.asarray(ell)) ** 2, axis=-1)
    return s2 * np.exp(-0.5 * r2)


def data(seed, n, d):
    return np.random.default_rng(seed).normal(size=(n, d))


ARD3 = np.array([0.6, 1.1, 1.7])
PER3 = np.array([0.9, 1.6, 2.5])


def oracle(k, X1, X2):
    """The NumPy matrix of the kernels built in this file (active_dims, Scale, Sum, Product included)."""
    if k.active_dims is not None:
        X1, X2 = X1[:, list(k.active_dims)], X2[:, list(k.active_dims)]
    if isinstance(k, K.Scale):
        return float(k.variance) * oracle(k.kernel, X1, X2)
    if isinstance(k, K.Sum):
        return sum(oracle(c, X1, X2) for c in k.kernels)
    if isinstance(k, K.Product):
        return np.prod([oracle(c, X1, X2) for c in k.kernels], axis=0)
    if isinstance(k, K.Periodic):
        return np_periodic(X1, X2, float(k.variance), np.asarray(k.lengthscale), np.asarray(k.period))
    if isinstance(k, K.RationalQuadratic):
        return np_rq(X1, X2, float(k.variance), np.asarray(k.lengthscale), float(k.alpha))
    if isinstance(k, K.Polynomial):
        return np_poly(X1, X2, k.degree, np.asarray(k.variance), float(k.offset))
    if isinstance(k, K.RBF):
        return np_rbf(X1, X2, float(k.variance), np.asarray(k.lengthscale))
    if isinstance(k, K.Linear):
        return float(k.variance) * X1 @ X2.T
    raise AssertionError(type(k))


CASES = {
    "periodic": K.Periodic(variance=1.3, lengthscale=0.8, period=1.7),
    "periodic-ard": K.Periodic(variance=0.7, lengthscale=ARD3, period=PER3),
    "rq": K.RationalQuadratic(variance=1.2, lengthscale=0.9, alpha=0.7),
    "rq-ard": K.RationalQuadratic(variance=0.8, lengthscale=ARD3, alpha=3.0),
    "polynomial": K.Polynomial(degree=3, variance=0.4, offset=0.9),
    "polynomial-ard": K.Polynomial(degree=2, variance=np.array([0.3, 0.8, 1.5]), offset=0.5),
    "2*rbf": 2.0 * K.RBF(variance=0.9, lengthscale=0.7),
    "rbf*periodic": K.RBF(1.0, 2.0) * K.Periodic(1.0, 1.0, 1.3),
    "active-sum": K.RBF(0.8, np.array([0.7, 1.3]), active_dims=(0, 2)) + K.Linear(0.3, active_dims=[1]),
    "active-product": K.Periodic(1.1, 0.9, 1.4, active_dims=(1,)) * K.RationalQuadratic(1.0, 0.8, 2.0,
                                                                                          active_dims=(0, 2)),
    "scaled-active": 0.5 * K.Polynomial(2, 0.7, 1.0, active_dims=(2, 0)),
}
IDS = list(CASES)


# ------------------------------------------------------------------------------- values
@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_matrix_and_diag_match_numpy_oracle(name):
    k = CASES[name]
    X1, X2 = data(1, 12, 3), data(2, 7, 3)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), oracle(k, X1, X2), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(k.diag(X1)), np.diag(oracle(k, X1, X1)), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(k(X1)), oracle(k, X1, X1), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", IDS)
def test_matrix_is_psd(name):
    k = CASES[name]
    X = data(3, 25, 3)
    X[-1] = X[0]  # an exact tie
    M = np.asarray(k(X))
    np.testing.assert_allclose(M, M.T, rtol=0, atol=1e-14 * np.abs(M).max())
    eig = np.linalg.eigvalsh(M)
    assert eig.min() >= -1e-10 * eig.max(), (eig.min(), eig.max())


def test_periodic_against_scikit_learn_exp_sine_squared():
    """1-D: exactly scikit-learn's ConstantKernel(s²) * ExpSineSquared(ℓ, p).  Several columns
    (ARD): the product over columns of the 1-D kernels (scikit-learn's kernel applies the sine to
    the Euclidean distance instead, so it is compared column by column)."""
    X1, X2 = data(4, 15, 1), data(5, 6, 1)
    k = K.Periodic(1.3, 0.8, 1.7)
    sk = SK.ConstantKernel(1.3) * SK.ExpSineSquared(length_scale=0.8, periodicity=1.7)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), sk(X1, X2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(k.diag(X1)), sk.diag(X1), rtol=1e-14)
    X1, X2 = data(6, 15, 3), data(7, 6, 3)
    k = K.Periodic(0.7, ARD3, PER3)
    want = 0.7 * np.prod([SK.ExpSineSquared(length_scale=ARD3[d], periodicity=PER3[d])(X1[:, [d]], X2[:, [d]])
                          for d in range(3)], axis=0)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), want, rtol=1e-12)


def test_periodic_with_many_columns_matches_oracle():
    """More than 8 columns take the three-matrix-product form of sin²(a − b)."""
    X1, X2 = data(8, 14, 11), data(9, 5, 11)
    rng = np.random.default_rng(10)
    ell, p = rng.uniform(2.0, 4.0, 11), rng.uniform(0.5, 3.0, 11)
    k = K.Periodic(1.4, ell, p)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), np_periodic(X1, X2, 1.4, ell, p), rtol=1e-11, atol=1e-14)
    M = np.asarray(k(X1))
    np.testing.assert_allclose(np.diag(M), 1.4, rtol=1e-12)
    eig = np.linalg.eigvalsh(M)
    assert eig.min() >= -1e-10 * eig.max()


def test_periodic_repeats_with_its_period():
    k = K.Periodic(1.0, 0.6, 2.5)
    x = np.linspace(0, 1, 7)[:, None]
    np.testing.assert_allclose(np.asarray(k(x, x + 2.5)), np.asarray(k(x, x)), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(k(x, x + 3 * 2.5)), np.asarray(k(x)), rtol=1e-11, atol=1e-14)


def test_rational_quadratic_against_scikit_learn_and_its_rbf_limit():
    X1, X2 = data(11, 15, 2), data(12, 6, 2)
    k = K.RationalQuadratic(1.2, 0.9, 0.7)
    sk = SK.ConstantKernel(1.2) * SK.RationalQuadratic(length_scale=0.9, alpha=0.7)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), sk(X1, X2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(k.diag(X1)), sk.diag(X1), rtol=1e-14)
    # ARD: scikit-learn's RQ is isotropic; on inputs divided by the lengthscales it is the same
    ell = np.array([0.5, 1.8])
    k = K.RationalQuadratic(0.8, ell, 2.5)
    sk = SK.ConstantKernel(0.8) * SK.RationalQuadratic(length_scale=1.0, alpha=2.5)
    np.testing.assert_allclose(np.asarray(k(X1, X2)), sk(X1 / ell, X2 / ell), rtol=1e-12)
    # α → ∞: the RBF kernel (relative difference O(r⁴/α))
    big = K.RationalQuadratic(1.0, 0.9, 1e8)
    np.testing.assert_allclose(np.asarray(big(X1, X2)), np.asarray(K.RBF(1.0, 0.9)(X1, X2)), rtol=1e-6)


def test_polynomial_against_scikit_learn_dot_product_power():
    """(s² x·x' + c)^d = s^(2d) (x·x' + c/s²)^d: ConstantKernel(s^(2d)) * DotProduct(√(c/s²))**d."""
    X1, X2 = data(13, 15, 3), data(14, 6, 3)
    for degree, s2, c in [(1, 1.0, 0.5), (2, 1.0, 1.0), (3, 0.4, 0.9), (4, 2.0, 0.3)]:
        k = K.Polynomial(degree, s2, c)
        sk = SK.ConstantKernel(s2**degree) * SK.DotProduct(sigma_0=np.sqrt(c / s2)) ** degree
        np.testing.assert_allclose(np.asarray(k(X1, X2)), sk(X1, X2), rtol=1e-12, err_msg=str(degree))
        np.testing.assert_allclose(np.asarray(k.diag(X1)), sk.diag(X1), rtol=1e-12, err_msg=str(degree))
    # ARD variances = a unit variance on inputs scaled by √s²_d
    s2 = np.array([0.3, 0.8, 1.5])
    k = K.Polynomial(2, s2, 0.5)
    sk = SK.DotProduct(sigma_0=np.sqrt(0.5)) ** 2
    np.testing.assert_allclose(np.asarray(k(X1, X2)), sk(X1 * np.sqrt(s2), X2 * np.sqrt(s2)), rtol=1e-12)


def test_polynomial_degree_is_static_and_checked():
    k = K.Polynomial(3.0)  # GPflow writes degree=3.0
    assert k.degree == 3 and type(k.degree) is int
    assert "degree" not in k.transforms()
    for bad in (0, -1, 2.5, True, "2", float("nan")):
        with pytest.raises(ValueError, match="Polynomial: degree"):
            K.Polynomial(bad)
    with pytest.raises(ValueError, match="variance has 2 entries but the inputs have 3"):
        K.Polynomial(2, [1.0, 2.0])(data(1, 4, 3))


# ------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", IDS)
@pytest.mark.slow
def test_parameter_gradients_match_finite_differences(name):
    """d/du of Σ W ⊙ K(X1, X2) + Σ w ⊙ diag K(X1) for the unconstrained (log) parameters u,
    against central differences with step 1e-5 (error O(h²) ≈ 1e-10 relative)."""
    k = CASES[name]
    rng = np.random.default_rng(20)
    X1, X2 = data(21, 9, 3), data(22, 5, 3)
    X2[0] = X1[0]  # a zero distance among the pairs
    W, w = rng.normal(size=(9, 5)), rng.normal(size=9)
    names = list(k.transforms())
    u0 = {n: np.asarray(v, np.float64) for n, v in flatten_params(k, names).items()}

    def f(u):
        kk = unflatten_params(k, u)
        return jnp.sum(W * kk(X1, X2)) + jnp.sum(w * kk.diag(X1))

    g = jax.jit(jax.grad(f))({n: jnp.asarray(v) for n, v in u0.items()})
    fj = jax.jit(f)
    h = 1e-5
    for n in names:
        flat = u0[n].reshape(-1)
        for i in range(flat.size):
            up, dn = flat.copy(), flat.copy()
            up[i] += h
            dn[i] -= h
            fd = (float(fj({**u0, n: up.reshape(u0[n].shape)})) - float(fj({**u0, n: dn.reshape(u0[n].shape)}))) / (2 * h)
            got = float(np.asarray(g[n]).reshape(-1)[i])
            assert np.isfinite(got), (n, i)
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=f"{name}: {n}[{i}]")


def test_periodic_gradients_are_finite_at_coincident_inputs():
    X = data(23, 6, 2)
    X = np.vstack([X, X[:2]])

    def f(p):
        return jnp.sum(K.Periodic(p[0], p[1:3], p[3:5])(X))

    g = jax.grad(f)(jnp.array([1.0, 0.8, 1.2, 1.5, 2.0]))
    assert np.all(np.isfinite(np.asarray(g)))


# ------------------------------------------------------------------------------- algebra
def test_number_times_kernel_is_a_learnable_scale():
    X1, X2 = data(30, 8, 2), data(31, 5, 2)
    rbf = K.RBF(0.9, 0.7)
    for k in (2.0 * rbf, rbf * 2.0, np.float64(2.0) * rbf, rbf * np.float64(2.0), 2 * rbf, np.int64(2) * rbf,
              np.array(2.0) * rbf, jnp.asarray(2.0) * rbf):
        assert isinstance(k, K.Scale) and k.kernel is rbf, type(k)
        assert float(k.variance) == 2.0
        np.testing.assert_allclose(np.asarray(k(X1, X2)), 2.0 * np.asarray(rbf(X1, X2)), rtol=1e-15)
        np.testing.assert_allclose(np.asarray(k.diag(X1)), 1.8, rtol=1e-15)
    # a factor of a factor is one Scale
    k = 3.0 * (2.0 * rbf)
    assert isinstance(k, K.Scale) and k.kernel is rbf and float(k.variance) == 6.0
    # learnable under dotted names, in a model too
    model = gpvi.GP(2.0 * rbf, gpvi.likelihoods.Gaussian(variance=0.1))
    assert set(gpvi.learnable_parameters(model)) >= {"kernel.variance", "kernel.kernel.variance",
                                                      "kernel.kernel.lengthscale"}
    # a product of kernels times a number, and a number times a product
    prod = K.RBF() * K.Linear(0.5)
    for k in (prod * 2.0, 2.0 * prod):
        assert isinstance(k, K.Scale) and k.kernel is prod


def test_scale_keeps_the_inducing_form_of_its_kernel():
    Z, X = data(61, 4, 2), data(62, 6, 2)
    Z[0] = X[0]  # an inducing input on a data row: White shares no noise with it
    k = 3.0 * K.White(0.2)
    np.testing.assert_allclose(np.asarray(k.inducing_cov(Z)), 0.6 * np.eye(4), rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(k.inducing_cross(Z, X)), np.zeros((4, 6)))
    m = K.MultiscaleRBF(0.9, [0.8, 1.3], inducing_lengthscale=np.array([1.1, 1.6]))
    k = 2.0 * m
    np.testing.assert_allclose(np.asarray(k.inducing_cov(Z)), 2.0 * np.asarray(m.inducing_cov(Z)), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(k.inducing_cross(Z, X)), 2.0 * np.asarray(m.inducing_cross(Z, X)),
                               rtol=1e-15)
    # a Sum or Product with active_dims of its own is not flattened into a longer one
    s = K.Sum((K.RBF(), K.Linear()), active_dims=(1,))
    assert len((s + K.Constant()).kernels) == 2 and (s + K.Constant()).kernels[0] is s
    p = K.Product((K.RBF(), K.Linear()), active_dims=(1,))
    assert (p * K.Constant()).kernels[0] is p


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("nan"), float("inf"), np.float64(-2.0)])
def test_scaling_by_a_non_positive_or_non_finite_number_is_refused(bad):
    with pytest.raises(ValueError, match="cannot scale a kernel by"):
        bad * K.RBF()
    with pytest.raises(ValueError, match="cannot scale a kernel by"):
        K.RBF() * bad


def test_kernel_arithmetic_with_other_objects_is_a_type_error():
    for bad in ("2", None, [1.0], np.ones(3), True):
        with pytest.raises(TypeError):
            bad * K.RBF()
        with pytest.raises(TypeError):
            K.RBF() + bad


def test_adding_numbers_and_summing_a_list():
    X = data(32, 6, 2)
    rbf, lin = K.RBF(0.9, 0.7), K.Linear(0.4)
    for k in (rbf + 1.5, 1.5 + rbf):
        assert isinstance(k, K.Sum) and any(isinstance(c, K.Constant) and float(c.variance) == 1.5 for c in k.kernels)
        np.testing.assert_allclose(np.asarray(k(X)), np.asarray(rbf(X)) + 1.5, rtol=1e-15)
    assert rbf + 0 is rbf and 0 + rbf is rbf  # the additive identity: sum() works
    k = sum([rbf, lin, K.Constant(0.2)])
    assert isinstance(k, K.Sum) and len(k.kernels) == 3
    np.testing.assert_allclose(np.asarray(k(X)), np.asarray(rbf(X)) + np.asarray(lin(X)) + 0.2, rtol=1e-14)
    k = (rbf + lin) + 0.3
    assert isinstance(k, K.Sum) and len(k.kernels) == 3
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="cannot add"):
            rbf + bad
        with pytest.raises(ValueError, match="cannot add"):
            bad + rbf


def test_positional_arguments_follow_the_keyword_order():
    pairs = [
        (K.RBF(1.0, 2.0), K.RBF(variance=1.0, lengthscale=2.0)),
        (K.Matern12(1.5, 0.5), K.Matern12(variance=1.5, lengthscale=0.5)),
        (K.Matern32(1.5, 0.5), K.Matern32(variance=1.5, lengthscale=0.5)),
        (K.Matern52(1.0, 0.5), K.Matern52(variance=1.0, lengthscale=0.5)),
        (K.White(0.01), K.White(variance=0.01)),
        (K.Linear(0.3), K.Linear(variance=0.3)),
        (K.Constant(2.0), K.Constant(variance=2.0)),
        (K.Periodic(1.0, 0.5, 2.0), K.Periodic(variance=1.0, lengthscale=0.5, period=2.0)),
        (K.RationalQuadratic(1.0, 0.5, 2.0), K.RationalQuadratic(variance=1.0, lengthscale=0.5, alpha=2.0)),
        (K.Polynomial(3, 0.5, 1.5), K.Polynomial(degree=3, variance=0.5, offset=1.5)),
        (K.MultiscaleRBF(1.0, [0.5, 2.0]), K.MultiscaleRBF(variance=1.0, lengthscale=[0.5, 2.0])),
        (K.Scale(K.RBF(), 2.0), K.Scale(kernel=K.RBF(), variance=2.0)),
    ]
    X = data(33, 5, 2)
    for a, b in pairs:
        assert type(a) is type(b)
        assert {n: np.asarray(v).tolist() for n, v in a.parameters().items()} == \
            {n: np.asarray(v).tolist() for n, v in b.parameters().items()}
        np.testing.assert_array_equal(np.asarray(a(X)), np.asarray(b(X)))
    s = K.Sum((K.RBF(), K.Linear()))
    assert isinstance(s, K.Sum) and len(s.kernels) == 2
    with pytest.raises(TypeError):
        K.RBF(1.0, 2.0, 3.0)
    with pytest.raises(TypeError):
        K.RBF(1.0, 2.0, (0,))  # active_dims is keyword-only
    with pytest.raises(ValueError, match="RBF: lengthscale"):
        K.RBF(1.0, -2.0)


def test_positional_kernels_are_pytrees_and_jit():
    X = data(34, 6, 3)
    k = K.RBF(1.0, 2.0, active_dims=(0, 2))
    leaves, tree = jax.tree_util.tree_flatten(k)
    assert len(leaves) == 2
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert type(back) is K.RBF and back.active_dims == (0, 2)
    f = jax.jit(lambda kk, x: kk(x))
    np.testing.assert_allclose(np.asarray(f(k, X)), np.asarray(k(X)), rtol=1e-15)
    # active_dims is static: other columns, another compiled program, another answer
    other = K.RBF(1.0, 2.0, active_dims=(1,))
    assert jax.tree_util.tree_structure(other) != tree
    np.testing.assert_allclose(np.asarray(f(other, X)), np_rbf(X[:, [1]], X[:, [1]], 1.0, 2.0), rtol=1e-13)
    g = jax.jit(jax.grad(lambda kk: jnp.sum(kk(X))))(2.0 * K.Periodic(1.0, 0.5, 1.5, active_dims=[1]))
    assert isinstance(g, K.Scale) and isinstance(g.kernel, K.Periodic)
    assert np.isfinite(float(g.variance)) and np.isfinite(float(g.kernel.period))


def test_repr_shows_active_dims_only_when_set():
    assert "active_dims" not in repr(K.RBF(1.0, 2.0))
    assert repr(K.RBF(1.0, 2.0, active_dims=[1])).endswith("active_dims=(1,))")
    assert repr(2.0 * K.Linear()).startswith("Scale(kernel=Linear(")


# ------------------------------------------------------------------------------- active_dims
LEAVES = [K.RBF(1.2, np.array([0.7, 1.4])), K.Matern12(0.9, 0.8), K.Matern32(0.9, 0.8), K.Matern52(1.1, 0.6),
          K.Linear(0.5), K.Constant(0.7), K.White(0.3), K.Periodic(1.0, [0.9, 1.1], 1.6),
          K.RationalQuadratic(1.0, 0.8, 1.5), K.Polynomial(2, 0.6, 1.0),
          K.MultiscaleRBF(0.9, np.array([0.8, 1.3]), inducing_lengthscale=np.array([1.0, 1.5])),
          K.Scale(K.Matern52(), 1.5), K.Sum((K.RBF(), K.Linear())), K.Product((K.RBF(), K.Periodic()))]


@pytest.mark.parametrize("k", LEAVES, ids=[type(k).__name__ for k in LEAVES])
@pytest.mark.slow
def test_active_dims_equals_slicing_the_columns_by_hand(k):
    X1, X2 = data(40, 9, 4), data(41, 5, 4)
    X2[0] = X1[0]
    dims = (3, 1)
    ka = k.replace(active_dims=list(dims))
    assert ka.active_dims == dims
    S1, S2 = X1[:, list(dims)], X2[:, list(dims)]
    np.testing.assert_array_equal(np.asarray(ka(X1, X2)), np.asarray(k(S1, S2)))
    np.testing.assert_array_equal(np.asarray(ka(X1)), np.asarray(k(S1)))
    np.testing.assert_array_equal(np.asarray(ka.diag(X1)), np.asarray(k.diag(S1)))
    np.testing.assert_array_equal(np.asarray(ka.inducing_cov(X2)), np.asarray(k.inducing_cov(S2)))
    np.testing.assert_array_equal(np.asarray(ka.inducing_cross(X2, X1)), np.asarray(k.inducing_cross(S2, S1)))


def test_sum_and_product_honour_each_part_s_active_dims():
    X1, X2 = data(42, 9, 3), data(43, 6, 3)
    a = K.RBF(1.3, 0.7, active_dims=(0,))
    b = K.Periodic(0.8, 1.1, 1.9, active_dims=(1, 2))
    c = K.Linear(0.4, active_dims=(2,))
    A = np_rbf(X1[:, [0]], X2[:, [0]], 1.3, 0.7)
    B = np_periodic(X1[:, [1, 2]], X2[:, [1, 2]], 0.8, 1.1, 1.9)
    C = 0.4 * np.outer(X1[:, 2], X2[:, 2])
    np.testing.assert_allclose(np.asarray((a + b + c)(X1, X2)), A + B + C, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b * c)(X1, X2)), A * B * C, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b + 2.0 * c)(X1, X2)), A * B + 2 * C, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray((a + b).diag(X1)), 1.3 + 0.8, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a + b).inducing_cross(X2, X1)), (A + B).T, rtol=1e-13)
    # a combination with active_dims of its own: its parts index the columns it selected
    outer = K.Sum((K.RBF(1.3, 0.7, active_dims=(1,)), K.Linear(0.4)), active_dims=(2, 0))
    want = np_rbf(X1[:, [0]], X2[:, [0]], 1.3, 0.7) + 0.4 * X1[:, [2, 0]] @ X2[:, [2, 0]].T
    np.testing.assert_allclose(np.asarray(outer(X1, X2)), want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(outer.inducing_cov(X2)), np.asarray(outer(X2, X2)), rtol=1e-15)
    # an ARD lengthscale has one entry per active column
    with pytest.raises(ValueError, match=r"lengthscale has 3 entries but the inputs have 2 columns \(active_dims"):
        K.RBF(1.0, [1.0, 2.0, 3.0], active_dims=(0, 1))(X1)
    with pytest.raises(ValueError, match="period has 3 entries but the inputs have 1"):
        K.Periodic(1.0, 1.0, [1.0, 2.0, 3.0], active_dims=(0,))(X1)


def test_bad_active_dims_are_value_errors_naming_them():
    for bad, needle in [((-1,), "-1"), ((0, 0), "[0]"), ((), "empty"), ((1.5,), "1.5"), ("01", "'01'"),
                        ((True,), "True"), (3, "3")]:
        with pytest.raises(ValueError, match="RBF: active_dims") as err:
            K.RBF(active_dims=bad)
        assert needle in str(err.value), (bad, str(err.value))
    k = K.Linear(active_dims=(0, 5, 7))
    with pytest.raises(ValueError, match=r"active_dims \[0, 5, 7\] name column\(s\) \[5, 7\] but the inputs have 3"):
        k(data(1, 4, 3))
    with pytest.raises(ValueError, match=r"\[5, 7\]"):
        k.diag(data(1, 4, 3))
    assert K.RBF(active_dims=np.array([2, 0])).active_dims == (2, 0)
    assert K.RBF(active_dims=range(2)).active_dims == (0, 1)


# ------------------------------------------------------------------------------- models
def _regression(seed, n, d):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    y = np.sin(2.0 * X[:, 0]) + 0.3 * X[:, -1] + 0.1 * rng.standard_normal(n)
    return X, y


SPARSE_CASES = {
    "periodic": K.Periodic(1.0, 0.9, 1.8),
    "rq": K.RationalQuadratic(1.0, 0.8, 1.5),
    "polynomial+matern52": K.Polynomial(2, 0.5, 1.0) + K.Matern52(0.3, 1.0),
    "2*rbf-active": 2.0 * K.RBF(0.5, 0.9, active_dims=(0,)) + K.Linear(0.2, active_dims=(1,)),
}


@pytest.mark.parametrize("name", list(SPARSE_CASES))
@pytest.mark.slow
def test_sparse_gp_with_inducing_inputs_at_the_data_equals_the_full_gp(name):
    kernel = SPARSE_CASES[name]
    X, y = _regression(50, 30, 2)
    yb = (y > 0).astype(int)
    lik = gpvi.likelihoods.Bernoulli()
    full = gpvi.fit(gpvi.GP(kernel, lik), X, yb, tol=1e-12)
    sparse = gpvi.fit(gpvi.SparseGP(kernel, lik, inducing=X), X, yb, tol=1e-12)
    np.testing.assert_allclose(sparse.vlb, full.vlb, rtol=1e-6)
    Xs = data(51, 7, 2)
    np.testing.assert_allclose(sparse.predict_f(Xs)[0], full.predict_f(Xs)[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["periodic-ard", "rq", "polynomial", "2*rbf", "active-product", "scaled-active"])
@pytest.mark.slow
def test_models_with_new_kernels_save_and_load(name, tmp_path):
    kernel = CASES[name]
    X, y = _regression(52, 25, 3)
    fit = gpvi.fit(gpvi.GP(kernel, gpvi.likelihoods.Gaussian(variance=0.05)), X, y, tol=1e-10)
    path = gpvi.io.save(fit, tmp_path / f"{name}.gpvi")
    back = gpvi.io.load(path)
    assert type(back.model.kernel) is type(kernel)
    assert repr(back.model.kernel) == repr(fit.model.kernel)
    Xs = data(53, 6, 3)
    for a, b in zip(fit.predict_f(Xs), back.predict_f(Xs)):
        np.testing.assert_array_equal(a, b)


def test_two_times_rbf_fits_and_learns_its_factor():
    X, y = _regression(54, 40, 1)
    model = gpvi.GP(2.0 * K.RBF(), gpvi.likelihoods.Gaussian(variance=0.1))
    fit = gpvi.fit(model, X, y, learn_hyperparameters=True, max_rounds=30)
    assert np.isfinite(fit.vlb) and fit.hyperparameter_rounds > 0
    p = fit.model.parameters()
    assert float(p["kernel.variance"]) != 2.0 and float(p["kernel.kernel.lengthscale"]) != 1.0
    assert fit.vlb > gpvi.fit(model, X, y).vlb


@pytest.mark.parametrize("start", [2.3, 2.7])
def test_periodic_fit_recovers_the_period(start):
    """60 noisy points (four cycles) of a period-2.5 signal: from a start 8 % below or above,
    the learned period is within 5 % of 2.5.  (From 12 % below, 2.2, the search ends at 5.0,
    twice the period, which is a period of the signal too.)"""
    rng = np.random.default_rng(55)
    X = np.sort(rng.uniform(0, 10, 60))[:, None]
    y = np.sin(2 * np.pi * X[:, 0] / 2.5) + 0.5 * np.cos(4 * np.pi * X[:, 0] / 2.5) + 0.1 * rng.standard_normal(60)
    model = gpvi.GP(K.Periodic(1.0, 1.0, start), gpvi.likelihoods.Gaussian(variance=0.05))
    fit = gpvi.fit(model, X, y, learn_hyperparameters=True, max_rounds=60)
    period = float(fit.model.parameters()["kernel.period"])
    assert abs(period / 2.5 - 1) < 0.05, period


# ------------------------------------------------------------------------------- user kernels
class AlgebraTestUserKernel(K.Kernel):
    """A user's kernel, defined in this test module: s² / (1 + |x − x'|² / ℓ²)."""

    variance: object = gpvi.param("positive", 1.0, shape="scalar")
    lengthscale: object = gpvi.param("positive", 1.0, shape="scalar")

    def _K(self, X1, X2):
        d2 = sum((X1[:, j, None] - X2[None, :, j]) ** 2 for j in range(X1.shape[1]))
        return self.variance / (1.0 + d2 / self.lengthscale**2)

    def _diag(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)


def test_a_user_kernel_saves_and_loads_without_register(tmp_path):
    assert "AlgebraTestUserKernel" not in codec._REGISTRY
    X, y = _regression(56, 20, 2)
    kernel = 1.5 * AlgebraTestUserKernel(variance=0.8, lengthscale=0.7, active_dims=(1, 0)) + K.RBF(0.3, 1.0)
    fit = gpvi.fit(gpvi.GP(kernel, gpvi.likelihoods.Gaussian(variance=0.05)), X, y, learn_hyperparameters=True,
                   max_rounds=5)
    back = gpvi.io.load(gpvi.io.save(fit, tmp_path / "user.gpvi"))
    user = back.model.kernel.kernels[0].kernel
    assert type(user) is AlgebraTestUserKernel and user.active_dims == (1, 0)
    Xs = data(57, 5, 2)
    for a, b in zip(fit.predict_f(Xs), back.predict_f(Xs)):
        np.testing.assert_array_equal(a, b)
    assert codec.known_classes()["AlgebraTestUserKernel"] is AlgebraTestUserKernel


def _cosine_class(name, qualname):
    """A user's kernel class s² cos(x₀ − x₀') named ``name``, defined at ``qualname``."""
    def _K(self, X1, X2):
        return self.variance * jnp.cos(X1[:, :1] - X2[:, 0][None, :])

    def _diag(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)

    return type(name, (K.Kernel,), {"__annotations__": {"variance": object}, "__qualname__": qualname,
                                    "variance": gpvi.param("positive", 1.0, shape="scalar"), "_K": _K, "_diag": _diag})


def test_two_user_kernels_with_one_name_are_a_clear_error_and_register_picks_one(tmp_path):
    first = _cosine_class("AlgebraTestClash", "first.AlgebraTestClash")
    second = _cosine_class("AlgebraTestClash", "second.AlgebraTestClash")
    X, y = _regression(58, 10, 1)
    fit = gpvi.fit(gpvi.GP(second(variance=0.5), gpvi.likelihoods.Gaussian(variance=0.1)), X, y)
    with pytest.raises(ValueError, match=r"2 different classes are called AlgebraTestClash \(test_kernel_algebra\."
                                         r"first.AlgebraTestClash, test_kernel_algebra.second.AlgebraTestClash\)"):
        gpvi.io.save(fit, tmp_path / "clash.gpvi")
    try:
        gpvi.io.register(second)
        path = gpvi.io.save(fit, tmp_path / "clash.gpvi")
        assert type(gpvi.io.load(path).model.kernel) is second
    finally:
        codec._REGISTRY.pop("AlgebraTestClash", None)
    # unregistered again: loading the file is ambiguous, and says so
    with pytest.raises(ValueError, match="cannot load class AlgebraTestClash"):
        gpvi.io.load(path)
    assert first is not second


def test_a_kernel_class_defined_again_means_its_latest_definition(tmp_path):
    """A notebook cell run twice defines the class again (same module and qualified name): files
    name the latest definition; an object of the earlier one is refused, not saved as the other."""
    old = _cosine_class("AlgebraTestRedefined", "AlgebraTestRedefined")
    new = _cosine_class("AlgebraTestRedefined", "AlgebraTestRedefined")
    X, y = _regression(60, 10, 1)
    lik = gpvi.likelihoods.Gaussian(variance=0.1)
    fit = gpvi.fit(gpvi.GP(new(variance=0.5), lik), X, y)
    assert type(gpvi.io.load(gpvi.io.save(fit, tmp_path / "new.gpvi")).model.kernel) is new
    stale = gpvi.fit(gpvi.GP(old(variance=0.5), lik), X, y)
    with pytest.raises(ValueError, match="has been defined again since this object was built"):
        gpvi.io.save(stale, tmp_path / "old.gpvi")


def test_a_user_kernel_named_like_a_gpvi_kernel_is_refused(tmp_path):
    class Periodic(K.Kernel):  # a hand-made periodic kernel, as in the issue
        variance: object = gpvi.param("positive", 1.0, shape="scalar")

        def _K(self, X1, X2):
            return self.variance * jnp.cos(2 * jnp.pi * (X1[:, :1] - X2[:, 0][None, :]))

        def _diag(self, X):
            return jnp.full(X.shape[0], self.variance, dtype=X.dtype)

    X, y = _regression(59, 10, 1)
    fit = gpvi.fit(gpvi.GP(Periodic(), gpvi.likelihoods.Gaussian(variance=0.1)), X, y)
    with pytest.raises(ValueError, match=r"2 different classes are called Periodic \(gpvi.kernels.Periodic, "):
        gpvi.io.save(fit, tmp_path / "p.gpvi")
    # gpvi's own Periodic still saves and loads as itself
    ok = gpvi.fit(gpvi.GP(K.Periodic(), gpvi.likelihoods.Gaussian(variance=0.1)), X, y)
    assert type(gpvi.io.load(gpvi.io.save(ok, tmp_path / "q.gpvi")).model.kernel) is K.Periodic


def test_every_new_name_is_in_the_model_file_registry():
    known = codec.known_classes()
    for name in ("Periodic", "RationalQuadratic", "Polynomial", "Scale"):
        assert known[name] is getattr(K, name)
    assert "Stationary" not in known  # gpvi's abstract helper is not a user kernel


# ------------------------------------------------------------------------------- text specs
def test_kernel_from_spec_grammar():
    k = K.kernel_from_spec("rbf+periodic", 3, lengthscale=0.8)
    assert isinstance(k, K.Sum) and [type(c) for c in k.kernels] == [K.RBF, K.Periodic]
    np.testing.assert_array_equal(np.asarray(k.kernels[1].period), np.full(3, 0.8))
    assert [float(c.variance) for c in k.kernels] == [0.5, 0.5]
    k = K.kernel_from_spec(" Matern52 * linear + rq ", 2, ard=False)
    assert isinstance(k, K.Sum) and isinstance(k.kernels[0], K.Product)
    assert [type(c) for c in k.kernels[0].kernels] == [K.Matern52, K.Linear]
    assert np.ndim(k.kernels[0].kernels[0].lengthscale) == 0 and isinstance(k.kernels[1], K.RationalQuadratic)
    assert isinstance(K.kernel_from_spec("polynomial", 2), K.Polynomial)
    assert isinstance(K.kernel_from_spec("matern12*matern32", 2), K.Product)
    for bad, needle in [("rbf+", "empty"), ("rfb", "did you mean 'rbf'"), ("", "non-empty"), ("rbf**2", "empty"),
                        ("rbf+cosine", "unknown kernel 'cosine'")]:
        with pytest.raises(ValueError, match="kernel") as err:
            K.kernel_from_spec(bad, 2)
        assert needle in str(err.value), (bad, str(err.value))
