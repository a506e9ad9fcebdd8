"""Kernels against textbook formulas, written out here (never taken from gpvi.kernels)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpvi import kernels as K
from gpvi._module import flatten_params, unflatten_params

EPS = np.finfo(np.float64).eps
D = 3
ARD = np.array([0.5, 1.0, 2.0])
N1, N2 = 24, 9  # few distinct shapes: every new shape costs JAX compilations

CASES = {
    "rbf": K.RBF(variance=1.3, lengthscale=0.7),
    "rbf-ard": K.RBF(variance=0.8, lengthscale=ARD),
    "matern12": K.Matern12(variance=1.3, lengthscale=0.7),
    "matern32": K.Matern32(variance=0.9, lengthscale=1.1),
    "matern52": K.Matern52(variance=2.0, lengthscale=0.6),
    "matern52-ard": K.Matern52(variance=1.0, lengthscale=ARD),
    "linear": K.Linear(variance=0.6),
    "constant": K.Constant(variance=2.0),
    "sum": K.RBF(variance=1.3, lengthscale=0.7) + K.Linear(variance=0.6) + K.Constant(variance=0.5),
    "product": K.Matern32(variance=0.9, lengthscale=1.1) * K.Linear(variance=0.6),
    "sum-of-products": K.RBF(lengthscale=ARD) * K.Matern12(variance=0.4) + K.Constant(variance=0.3),
    # k(X1, X2) of the multiscale kernel is SE-ARD; its inducing forms are tested in test_ivsgpr.py
    "multiscale-rbf": K.MultiscaleRBF(variance=0.8, lengthscale=ARD),
    "rbf+white": K.RBF(variance=1.3, lengthscale=0.7) + K.White(variance=0.2),
    # issue 33: the new kernels, c * k and active_dims (more in test_kernel_algebra.py)
    "periodic": K.Periodic(variance=1.1, lengthscale=0.9, period=1.7),
    "rq-ard": K.RationalQuadratic(variance=0.8, lengthscale=ARD, alpha=0.6),
    "polynomial": K.Polynomial(degree=2, variance=0.7, offset=0.8),
    "2*matern32": 2.0 * K.Matern32(variance=0.9, lengthscale=1.1),
    "active-dims": K.RBF(1.3, np.array([0.7, 1.2]), active_dims=(0, 2)) * K.Periodic(0.9, 1.0, 1.5, active_dims=[1]),
}
IDS = list(CASES)


def uses_matern12(k):
    if isinstance(k, (K.Sum, K.Product)):
        return any(uses_matern12(c) for c in k.kernels)
    if isinstance(k, K.Scale):
        return uses_matern12(k.kernel)
    return isinstance(k, K.Matern12)


def inputs(seed, n=N1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    X[-1] = X[0]  # a duplicate row: PSD must survive exact ties
    return X


# Textbook profiles of the scaled distance r = |x − x'| / l.
PROFILES = {
    K.RBF: lambda r: np.exp(-0.5 * r**2),
    K.MultiscaleRBF: lambda r: np.exp(-0.5 * r**2),
    K.Matern12: lambda r: np.exp(-r),
    K.Matern32: lambda r: (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
    K.Matern52: lambda r: (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r),
}


def ref_matrix(k, X1, X2):
    """Independent covariance matrix from the definitions (pairwise differences)."""
    if k.active_dims is not None:
        X1, X2 = X1[:, list(k.active_dims)], X2[:, list(k.active_dims)]
    if isinstance(k, K.Scale):
        return float(k.variance) * ref_matrix(k.kernel, X1, X2)
    if isinstance(k, K.Polynomial):
        return (float(k.variance) * np.einsum("id,jd->ij", X1, X2) + float(k.offset)) ** k.degree
    if isinstance(k, K.Sum):
        return sum(ref_matrix(c, X1, X2) for c in k.kernels)
    if isinstance(k, K.Product):
        out = np.ones((X1.shape[0], X2.shape[0]))
        for c in k.kernels:
            out = out * ref_matrix(c, X1, X2)
        return out
    s2 = float(k.variance)
    if isinstance(k, K.Linear):
        return s2 * np.einsum("id,jd->ij", X1, X2)
    if isinstance(k, K.Constant):
        return np.full((X1.shape[0], X2.shape[0]), s2)
    if isinstance(k, K.White):  # s² where every column is equal
        return s2 * np.all(X1[:, None, :] == X2[None, :, :], axis=-1)
    ls = np.asarray(k.lengthscale, float)
    if isinstance(k, K.Periodic):  # s² exp(−2 Σ_d sin²(π (x_d − x'_d) / p_d) / ℓ_d²)
        diff = np.pi * (X1[:, None, :] - X2[None, :, :]) / np.asarray(k.period, float)
        return s2 * np.exp(-2.0 * np.sum(np.sin(diff) ** 2 / ls**2, axis=-1))
    diff = (X1[:, None, :] - X2[None, :, :]) / ls
    r = np.sqrt(np.sum(diff**2, axis=-1))
    if isinstance(k, K.RationalQuadratic):  # s² (1 + r² / (2α))^(−α)
        a = float(k.alpha)
        return s2 * (1.0 + r**2 / (2.0 * a)) ** (-a)
    return s2 * PROFILES[type(k)](r)


# ------------------------------------------------------------------------------------------
def test_every_kernel_class_is_covered():
    classes = {c for c in (getattr(K, n) for n in K.__all__) if isinstance(c, type)} \
        - {K.Kernel, getattr(K, "Stationary", None)}
    covered = set()

    def walk(k):
        covered.add(type(k))
        for c in getattr(k, "kernels", ()) + ((k.kernel,) if isinstance(k, K.Scale) else ()):
            walk(c)

    for k in CASES.values():
        walk(k)
    missing = sorted(c.__name__ for c in classes - covered)
    assert not missing, f"kernel classes without a test instance: {missing}"
    for cls in classes - {K.Sum, K.Product, K.Scale, K.Linear, K.Constant, K.White, K.Periodic, K.RationalQuadratic,
                          K.Polynomial}:  # ref_matrix writes these out itself
        assert cls in PROFILES, f"no textbook profile for {cls.__name__}"


@pytest.mark.parametrize("name", IDS)
def test_matrix_is_symmetric_psd(name):
    k = CASES[name]
    X = inputs(1)
    M = np.asarray(k(X))
    assert M.shape == (N1, N1)
    np.testing.assert_allclose(M, M.T, rtol=0, atol=1e-14 * np.abs(M).max())
    eig = np.linalg.eigvalsh(0.5 * (M + M.T))
    assert eig.min() >= -1e-10 * eig.max(), f"min eigenvalue {eig.min():.3e}, max {eig.max():.3e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_matrix_matches_pairwise_definition(name):
    k = CASES[name]
    X1, X2 = inputs(2), inputs(3, N2)
    # No ties between X1 and X2 (independent draws), so r² ≳ 1e-2 and the |a|² + |b|² − 2a·b
    # expansion's ~eps·|x/l|² absolute error in r² is ≲ 1e-12 relative; ties: diag test.
    np.testing.assert_allclose(np.asarray(k(X1, X2)), ref_matrix(k, X1, X2), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(np.asarray(k(X2, X1)), np.asarray(k(X1, X2)).T, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", IDS)
def test_diag_equals_diagonal_of_matrix(name):
    k = CASES[name]
    X = inputs(4)
    d = np.asarray(k.diag(X))
    full = np.diag(np.asarray(k(X)))
    np.testing.assert_allclose(d, np.diag(ref_matrix(k, X, X)), rtol=1e-13, atol=1e-14)
    # k(X, X) computes r² = |a|² + |a|² − 2|a|² in floating point: the result is 0 up to
    # δ ≈ (D + 2)·eps·|x/l|² (here ≲ 1e-13).  Profiles smooth in r² move by O(δ); the
    # Matérn-1/2 profile e^{−r} moves by √δ.
    lmin = 0.5  # smallest lengthscale in CASES
    delta = 8 * (D + 2) * EPS * np.max(np.sum(X**2, 1)) / lmin**2
    rtol = np.sqrt(delta) if uses_matern12(k) else 1e-12
    np.testing.assert_allclose(full, d, rtol=rtol, atol=1e-14)


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern32, K.Matern52])
def test_stationary_values_at_known_distances(cls):
    s2, ell = 1.7, 0.8
    k = cls(variance=s2, lengthscale=ell)
    rng = np.random.default_rng(5)
    c = rng.normal(size=D)
    u = rng.normal(size=D)
    u /= np.linalg.norm(u)
    dist = np.array([0.1, 0.25, 0.5, 1.0, 1.6, 2.0, 3.7, 6.0])
    X1 = c[None, :]
    X2 = c[None, :] + dist[:, None] * u[None, :]
    got = np.asarray(k(X1, X2))[0]
    r = dist / ell
    want = {
        K.RBF: s2 * np.exp(-(dist**2) / (2 * ell**2)),
        K.Matern12: s2 * np.exp(-r),
        K.Matern32: s2 * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
        K.Matern52: s2 * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r),
    }[cls]
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-15)
    np.testing.assert_allclose(np.asarray(k.diag(X1)), [s2], rtol=1e-15)


def test_linear_and_constant_values():
    X1 = np.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]])
    X2 = np.array([[2.0, -1.0, 1.0]])
    np.testing.assert_allclose(np.asarray(K.Linear(variance=0.6)(X1, X2)), [[0.6 * -1.0], [0.6 * 4.0]], rtol=1e-15)
    np.testing.assert_allclose(np.asarray(K.Linear(variance=0.6).diag(X1)), 0.6 * np.array([6.0, 9.25]), rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(K.Constant(variance=2.0)(X1, X2)), np.full((2, 1), 2.0))
    np.testing.assert_array_equal(np.asarray(K.Constant(variance=2.0).diag(X1)), np.full(2, 2.0))


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern32, K.Matern52])
def test_ard_with_equal_lengthscales_is_isotropic(cls):
    X1, X2 = inputs(6), inputs(7, N2)
    iso = cls(variance=1.2, lengthscale=0.9)
    ard = cls(variance=1.2, lengthscale=np.full(D, 0.9))
    np.testing.assert_allclose(np.asarray(ard(X1, X2)), np.asarray(iso(X1, X2)), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray(ard.diag(X1)), np.asarray(iso.diag(X1)), rtol=1e-15)
    # unequal ARD lengthscales = unit lengthscale on rescaled inputs
    ard = cls(variance=1.2, lengthscale=ARD)
    unit = cls(variance=1.2, lengthscale=1.0)
    np.testing.assert_allclose(np.asarray(ard(X1, X2)), np.asarray(unit(X1 / ARD, X2 / ARD)), rtol=1e-12, atol=1e-15)


def test_sum_and_product_are_elementwise():
    X1, X2 = inputs(8), inputs(9, N2)
    a = K.RBF(variance=1.3, lengthscale=ARD)
    b = K.Matern32(variance=0.7, lengthscale=1.4)
    c = K.Linear(variance=0.2)
    A, B, C = (np.asarray(k(X1, X2)) for k in (a, b, c))
    np.testing.assert_allclose(np.asarray((a + b)(X1, X2)), A + B, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b)(X1, X2)), A * B, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a + b + c)(X1, X2)), A + B + C, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b * c)(X1, X2)), A * B * C, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b + c)(X1, X2)), A * B + C, rtol=1e-14, atol=1e-15)
    da, db = np.asarray(a.diag(X1)), np.asarray(b.diag(X1))
    np.testing.assert_allclose(np.asarray((a + b).diag(X1)), da + db, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b).diag(X1)), da * db, rtol=1e-15)
    assert len((a + b + c).kernels) == 3 and len((a * b * c).kernels) == 3


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern32, K.Matern52])
def test_wrong_length_ard_lengthscale_raises(cls):
    k = cls(lengthscale=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="lengthscale"):
        k(inputs(10))
    with pytest.raises(ValueError, match="lengthscale"):
        (k + K.Linear())(inputs(10))


def test_input_shapes():
    k = K.RBF(lengthscale=0.5)
    x = np.linspace(0, 1, 4)
    np.testing.assert_allclose(np.asarray(k(x)), np.asarray(k(x[:, None])), rtol=1e-15)
    with pytest.raises(ValueError):
        k(np.zeros((2, 2, 2)))


@pytest.mark.parametrize("name", IDS)
def test_parameters_round_trip_through_flatten_unflatten(name):
    k = CASES[name]
    names = list(k.transforms())
    assert names and all(t == "positive" for t in k.transforms().values())
    params = k.parameters()
    u = flatten_params(k, names)
    for n in names:
        np.testing.assert_allclose(np.asarray(u[n]), np.log(np.asarray(params[n])), rtol=1e-15, atol=1e-15)
    k2 = unflatten_params(k, u)
    assert type(k2) is type(k)
    for n in names:
        np.testing.assert_allclose(np.asarray(k2.parameters()[n]), np.asarray(params[n]), rtol=1e-14)
    X = inputs(11)
    np.testing.assert_allclose(np.asarray(k2(X)), np.asarray(k(X)), rtol=1e-13, atol=1e-15)
    # moving every unconstrained value by +0.3 multiplies every parameter by e^{0.3}
    k3 = unflatten_params(k, {n: v + 0.3 for n, v in u.items()})
    for n in names:
        np.testing.assert_allclose(np.asarray(k3.parameters()[n]), np.exp(0.3) * np.asarray(params[n]), rtol=1e-14)
    leaves, treedef = jax.tree_util.tree_flatten(k)
    assert len(leaves) == len(names)
    assert type(jax.tree_util.tree_unflatten(treedef, leaves)) is type(k)


def test_kernel_is_a_differentiable_pytree():
    k = CASES["sum-of-products"]
    X = inputs(14)
    g = jax.jit(jax.grad(lambda kk: jnp.sum(kk(X))))(k)
    assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(k)
    # ∂/∂s² of Σ K for the additive Constant part is the number of entries
    np.testing.assert_allclose(float(g.kernels[1].variance), X.shape[0] ** 2, rtol=1e-14)


def test_sum_parameter_names():
    k = K.RBF(lengthscale=ARD) + K.Linear(variance=0.6)
    assert set(k.transforms()) == {"kernels.0.variance", "kernels.0.lengthscale", "kernels.1.variance"}
    k2 = unflatten_params(k, {"kernels.1.variance": jnp.log(2.5)})
    np.testing.assert_allclose(float(k2.kernels[1].variance), 2.5, rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(k2.kernels[0].lengthscale), ARD)


def test_stationary_kernels_are_translation_invariant():
    # |a|²+|b|²−2a·b on uncentred inputs cancels badly far from the origin (a shift of 100 moved
    # Matérn-1/2 values by ~1e-6 relative before the kernels centred their inputs).
    X1, X2 = inputs(12), inputs(13, N2)
    shift = 100.0
    for cls in (K.RBF, K.Matern12, K.Matern32, K.Matern52):
        k = cls(variance=1.0, lengthscale=0.7)
        np.testing.assert_allclose(np.asarray(k(X1 + shift, X2 + shift)), np.asarray(k(X1, X2)),
                                   rtol=1e-9, atol=1e-12, err_msg=cls.__name__)
        np.testing.assert_allclose(np.diag(np.asarray(k(X1 + shift))), 1.0, rtol=1e-9, err_msg=cls.__name__)


@pytest.mark.parametrize("cls", [K.RBF, K.Matern12, K.Matern32, K.Matern52])
@pytest.mark.slow
def test_gradients_at_zero_distance_inside_scan(cls):
    """Regression: with inputs coinciding exactly (inducing points taken from the data), a
    where-guarded sqrt gave wrong or NaN gradients inside lax.scan next to a triangular solve,
    while the unrolled computation was right.  Scan and unrolled must agree."""
    from jax.scipy.linalg import solve_triangular

    rng = np.random.default_rng(5)
    X = jnp.asarray(rng.uniform(-2, 2, (40, 2)))
    Z = X[:5]
    chunks = X.reshape(2, 20, 2)
    Lc = jnp.linalg.cholesky(K.RBF()(Z, Z) + 1e-6 * jnp.eye(5))

    def total(params, scan):
        k = cls(variance=params[0], lengthscale=params[1:])
        L = jnp.linalg.cholesky(k(Z, Z) + 1e-6 * jnp.eye(5)) + Lc

        def one(x):
            return jnp.sum(solve_triangular(L, k(Z, x), lower=True) ** 2)

        if scan:
            return jax.lax.scan(lambda s, x: (s + one(x), None), 0.0, chunks)[0]
        return one(chunks[0]) + one(chunks[1])

    p = jnp.array([0.8, 1.2, 0.9])
    grad = jax.jit(jax.grad(total), static_argnums=1)
    g_scan, g_loop = grad(p, True), grad(p, False)
    assert np.all(np.isfinite(np.asarray(g_scan)))
    np.testing.assert_allclose(np.asarray(g_scan), np.asarray(g_loop), rtol=1e-10)


def test_multiscale_cross_covariance_matches_eq17_far_from_origin_and_at_coincident_points():
    """K_uf of the multiscale kernel (computed as two matrix products) against Eq. 17 summed
    column by column in NumPy, with inputs offset far from the origin (where an uncentred
    expansion of the squared distance would lose digits) and data rows equal to inducing rows."""
    rng = np.random.default_rng(3)
    D = 5
    Z = 40.0 + 3.0 * rng.standard_normal((30, D))
    X = 40.0 + 3.0 * rng.standard_normal((45, D))
    X[:6] = Z[:6]
    lz = np.exp(0.5 * rng.standard_normal((30, D)))
    ls = np.exp(0.5 * rng.standard_normal(D))
    s2 = lz[:, None, :] ** 2 + ls[None, None, :] ** 2
    ref = 0.7 * np.prod(np.sqrt(2.0 * lz[:, None, :] * ls / s2), axis=2) \
        * np.exp(-np.sum((Z[:, None, :] - X[None]) ** 2 / s2, axis=2))
    k = K.MultiscaleRBF(variance=0.7, lengthscale=ls, inducing_lengthscale=lz)
    got = np.asarray(k.inducing_cross(jnp.asarray(Z), jnp.asarray(X)))
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-300)
    # with l_z = ℓ at a coincident point the value is exactly the variance (up to rounding)
    same = K.MultiscaleRBF(variance=0.7, lengthscale=ls)
    np.testing.assert_allclose(np.diag(np.asarray(same.inducing_cross(jnp.asarray(Z[:6]), jnp.asarray(X[:6])))),
                               0.7, rtol=1e-13)


def test_white_noise_term_in_a_sparse_gp_adds_to_k_uu_and_the_conditional_variances_only():
    """SE + White in a sparse GP against the same model built by hand in NumPy: K_uu gains s² I,
    K_uf is the SE part alone (even where an inducing input equals a data row) and each c_i
    gains s²; a full GP's K(X, X) gains s² on the diagonal and on exact duplicate rows."""
    from gpvi.likelihoods import Bernoulli
    from gpvi.models import GP, SparseGP

    rng = np.random.default_rng(4)
    X = rng.normal(size=(12, D))
    Z = np.vstack([X[:2], rng.normal(size=(3, D))])  # two inducing inputs on data rows
    se, s2 = K.RBF(variance=1.3, lengthscale=0.7), 0.25
    model = SparseGP(se + K.White(variance=s2), Bernoulli(), inducing=Z)
    Kuu = ref_matrix(se, Z, Z) + s2 * np.eye(5)
    L = np.linalg.cholesky(Kuu + model.jitter * np.trace(Kuu) / 5 * np.eye(5))
    At, _, c = model.project(model.prior_cache(X), jnp.asarray(X))
    A_ref = np.linalg.solve(L, ref_matrix(se, Z, X))
    np.testing.assert_allclose(np.asarray(At), A_ref, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(c), 1.3 + s2 - np.sum(A_ref**2, 0), rtol=1e-6, atol=1e-8)
    Xd = np.vstack([X, X[:1]])
    np.testing.assert_allclose(np.asarray((se + K.White(variance=s2))(Xd)),
                               ref_matrix(se, Xd, Xd) + s2 * np.all(Xd[:, None] == Xd[None], -1), rtol=1e-12)
    full = GP(se + K.White(variance=s2), Bernoulli())
    _, Lf, _ = full.prior_cache(jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(Lf @ Lf.T), ref_matrix(se, X, X) + s2 * np.eye(12), rtol=1e-7, atol=1e-7)


def test_white_noise_term_as_the_readme_writes_it():
    """``RBF() + White(0.01)`` (README, "What is inside") raised TypeError: every component
    field was keyword-only, so ``White(0.01)`` was rejected.  The variance of White is now also
    positional (as every kernel's parameters are, issue 33); the sum is RBF's matrix plus 0.01 I
    on the same inputs and exactly RBF's covariance between different inputs."""
    k = K.RBF() + K.White(0.01)
    assert isinstance(k, K.Sum) and isinstance(k.kernels[1], K.White)
    assert float(k.kernels[1].variance) == 0.01
    X = inputs(7)[:-1]  # distinct rows (inputs() repeats its first row last)
    X2 = inputs(8, N2)
    rbf = np.asarray(K.RBF()(X))
    got = np.asarray(k(X))
    np.testing.assert_allclose(got, rbf + 0.01 * np.eye(len(X)), rtol=1e-15, atol=0)
    off = ~np.eye(len(X), dtype=bool)
    np.testing.assert_array_equal(got[off], rbf[off])  # nothing between different inputs
    np.testing.assert_array_equal(np.asarray(k(X, X2)), np.asarray(K.RBF()(X, X2)))
    np.testing.assert_allclose(np.asarray(k.diag(X)), 1.01, rtol=1e-15)
    # the same kernel as the keyword form, parameters and learnable paths included
    kw = K.RBF() + K.White(variance=0.01)
    assert {n: float(v) for n, v in k.parameters().items()} == {n: float(v) for n, v in kw.parameters().items()}
    # checked like the keyword form; the variance is White's only positional argument
    with pytest.raises(ValueError, match="White: variance"):
        K.White(-0.01)
    with pytest.raises(TypeError):
        K.White(0.01, 0.02)
    # the other kernels' parameters are positional too, in the order of their keywords
    assert float(K.RBF(1.5).variance) == 1.5 and float(K.RBF(1.5, 0.3).lengthscale) == 0.3
