"""The chunked data sums against a dense NumPy computation."""
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import gpvi
from gpvi import likelihoods as L


@pytest.mark.parametrize("d,blocks,cached", [(7, None, True), (7, 3, False), (130, None, True),
                                              (200, None, True), (200, 1, True), (200, 4, False), (30, 30, True)])
@pytest.mark.slow
def test_sums_match_dense_numpy(rng, d, blocks, cached):
    # blocks=None is the default split (1 block below d = 144, 2 at d = 200); the others force
    # uneven blocks, down to one row each, with the projections cached or recomputed per chunk.
    N = 301
    X = rng.normal(size=(N, d)) / np.sqrt(d)
    y = rng.poisson(1.5, size=N)
    model = gpvi.GLM(likelihood=L.Poisson(), prior_variance=0.7)
    # 3 chunks of 101 rows, 2 of them padding
    obj = gpvi.Objective(model, X, y, chunk_size=128, blocks=blocks, cache_bytes=2**30 if cached else 0)
    assert obj.cached == cached and obj.blocks == (gpvi.objective.num_blocks(d) if blocks is None else blocks)
    m = rng.normal(size=d) * 0.1
    B = rng.normal(size=(d, d)) / np.sqrt(d)
    C = np.linalg.cholesky(0.3 * np.eye(d) + 0.2 * B @ B.T)
    sums = obj.sums(gpvi.State(m, C))
    # Dense truth: a_i = sqrt(0.7) x_i, Poisson E = y m − e^{m+v/2} − log y!.
    A = np.sqrt(0.7) * X
    mi = A @ m
    vi = np.einsum("ij,jk,ik->i", A, C @ C.T, A)
    E = y * mi - np.exp(mi + vi / 2) - gammaln(y + 1)
    lam = -np.exp(mi + vi / 2)
    rho = y + lam
    V = C @ C.T
    kl = 0.5 * (np.trace(V) + m @ m - d - np.linalg.slogdet(V)[1])
    np.testing.assert_allclose(float(sums.vlb), E.sum() - kl, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sums.grad), A.T @ rho - m, rtol=1e-10, atol=1e-10)
    S = np.asarray(sums.S)
    np.testing.assert_allclose(S, (A * lam[:, None]).T @ A, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(S, S.T, rtol=0, atol=0)
    np.testing.assert_allclose(float(obj.vlb(gpvi.State(m, C))), E.sum() - kl, rtol=1e-12)


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.slow
def test_recomputed_sparse_gp_sums_in_raw_features_match_dense_numpy(rng, blocks):
    # With the projections recomputed per pass, the sparse GP's sums are taken in the raw
    # features K(Z, x) and mapped through L⁻¹ once (objective.raw_operator); against the
    # dense computation with a_i = L⁻¹ K(Z, x_i) by a triangular solve, on inducing inputs
    # close enough together that K(Z, Z) has a condition number ~1e8.  The rounding of the raw
    # sums is magnified by up to cond(K(Z, Z))·ε on the way through L⁻¹ (measured here: VLB
    # ~1e-10, S ~4e-9 relative, against ~1e-12 for the per-chunk projections); the tolerances
    # below allow that and no more.
    from scipy.linalg import solve_triangular
    N, M = 257, 24
    X = rng.uniform(-2, 2, (N, 2))
    Z = np.concatenate([X[:12], X[:12] + 0.05 * rng.normal(size=(12, 2))])
    y = rng.poisson(2.0, size=N)
    k = gpvi.kernels.RBF(variance=0.8, lengthscale=1.3)
    model = gpvi.SparseGP(k, L.Poisson(), inducing=Z, mean=0.3)
    obj = gpvi.Objective(model, X, y, chunk_size=64, blocks=blocks, cache_bytes=0)
    assert not obj.cached
    m = rng.normal(size=M) * 0.3
    B = rng.normal(size=(M, M)) / np.sqrt(M)
    C = np.linalg.cholesky(0.4 * np.eye(M) + 0.1 * B @ B.T)
    sums = obj.sums(gpvi.State(m, C))
    Kzz, Kzx = np.asarray(k(Z, Z)), np.asarray(k(Z, X))
    assert np.linalg.cond(Kzz) > 1e7
    Lz = np.linalg.cholesky(Kzz + 1e-8 * np.mean(np.diag(Kzz)) * np.eye(M))  # the model's jitter
    A = solve_triangular(Lz, Kzx, lower=True).T
    V = C @ C.T
    mi = A @ m + 0.3
    vi = np.maximum(0.8 - np.sum(A * A, 1), 0) + np.einsum("ij,jk,ik->i", A, V, A)
    E = y * mi - np.exp(mi + vi / 2) - gammaln(y + 1)
    lam = -np.exp(mi + vi / 2)
    kl = 0.5 * (np.trace(V) + m @ m - M - np.linalg.slogdet(V)[1])
    np.testing.assert_allclose(float(sums.vlb), E.sum() - kl, rtol=1e-9)
    np.testing.assert_allclose(float(obj.vlb(gpvi.State(m, C))), E.sum() - kl, rtol=1e-9)
    g = A.T @ (y + lam) - m
    np.testing.assert_allclose(np.asarray(sums.grad), g, rtol=0, atol=1e-7 * np.max(np.abs(g)))
    S, S_ref = np.asarray(sums.S), (A * lam[:, None]).T @ A
    np.testing.assert_allclose(S, S_ref, rtol=0, atol=1e-7 * np.max(np.abs(S_ref)))
    np.testing.assert_allclose(S, S.T, rtol=0, atol=0)


@pytest.mark.parametrize("N,chunk", [(1, 2048), (2048, 2048), (2049, 2048), (20000, 2048), (301, 128), (7, 1)])
def test_chunks_are_balanced_and_keep_every_row(rng, N, chunk):
    from gpvi.objective import make_chunks

    X, y = rng.normal(size=(N, 2)), rng.normal(size=N)
    ch = make_chunks(X, y, chunk_size=chunk)
    C, n = ch.mask.shape
    assert n <= chunk and C == -(-N // chunk)  # the fewest chunks that fit
    assert C * n - N < C  # padding under one row per chunk
    keep = np.asarray(ch.mask).ravel() > 0
    assert keep.sum() == N and np.all(keep[:N])
    np.testing.assert_array_equal(np.asarray(ch.X).reshape(-1, 2)[:N], X)
    np.testing.assert_array_equal(np.asarray(ch.y).ravel()[:N], y)


def test_block_count_is_checked_and_chosen_by_size(rng):
    from gpvi.objective import block_edges, num_blocks

    assert [num_blocks(d) for d in (1, 143, 144, 200, 300, 450, 5000)] == [1, 1, 2, 2, 2, 3, 4]
    assert block_edges(10, 3) == (0, 3, 7, 10)
    X, y = rng.normal(size=(20, 4)), rng.poisson(1.0, size=20)
    for bad in (0, 5):
        with pytest.raises(ValueError, match="blocks"):
            gpvi.Objective(gpvi.GLM(likelihood=L.Poisson()), X, y, blocks=bad)


def test_non_triangular_init_is_refactorised(rng):
    X = rng.normal(size=(50, 3))
    y = rng.poisson(1.0, size=50)
    model = gpvi.GLM(likelihood=L.Poisson())
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    C = np.linalg.cholesky(np.diag([0.5, 0.3, 0.2]))
    full = C @ Q  # same V = C Cᵀ, not triangular
    a = gpvi.fit(model, X, y, init=gpvi.State(np.zeros(3), full), max_iter=1)
    b = gpvi.fit(model, X, y, init=gpvi.State(np.zeros(3), C), max_iter=1)
    assert a.vlb == pytest.approx(b.vlb, rel=1e-12)
    with pytest.raises(ValueError, match="init"):
        gpvi.fit(model, X, y, init=gpvi.State(np.zeros(3), np.full((3, 3), np.nan)))


def test_unfactorisable_prior_raises_a_clear_error(rng):
    # A "kernel" whose Gram matrix is negative definite: no jitter makes it factorisable.
    class Negated(gpvi.kernels.RBF):
        def __call__(self, X1, X2=None):
            return -super().__call__(X1, X2)

    X = rng.normal(size=(30, 2))
    y = rng.poisson(1.0, size=30)
    for model in (gpvi.SparseGP(kernel=Negated(), likelihood=L.Poisson(), inducing=X[:5]),
                  gpvi.GP(kernel=Negated(), likelihood=L.Poisson())):
        with pytest.raises(np.linalg.LinAlgError, match="Cholesky of K"):
            gpvi.fit(model, X, y)
        # the objective itself refuses it when built: no check_prior() call to remember
        with pytest.raises(np.linalg.LinAlgError, match="Cholesky of K"):
            gpvi.Objective(model.initialise(X), X, y)


def _check_dense_poisson_sums(sums, kernel, X, y, m, C, mean):
    """The sums of a full Poisson GP at ``State(m, C)`` against NumPy with ``a_i`` = row i of the
    jittered Cholesky factor of K(X, X); returns the rows' ``λ_i`` and ``a_iᵀ V a_i``."""
    N = X.shape[0]
    K = np.asarray(kernel(X, X))
    Lk = np.linalg.cholesky(K + 1e-8 * np.mean(np.diag(K)) * np.eye(N))
    V = C @ C.T
    mi = Lk @ m + mean
    vi = np.einsum("ij,jk,ik->i", Lk, V, Lk)
    lam = -np.exp(mi + vi / 2)
    E = y * mi - np.exp(mi + vi / 2) - gammaln(y + 1)
    kl = 0.5 * (np.trace(V) + m @ m - N - np.linalg.slogdet(V)[1])
    np.testing.assert_allclose(float(sums.vlb), E.sum() - kl, rtol=1e-11)
    np.testing.assert_allclose(np.asarray(sums.grad), Lk.T @ (y + lam) - m, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(sums.S), (Lk * lam[:, None]).T @ Lk, rtol=1e-9, atol=1e-9)
    return lam, vi


@pytest.mark.slow
def test_full_gp_training_projection_matches_dense_numpy(rng):
    # A full GP's cached projections of its own training rows are gathered from Lᵀ
    # (GP.training_projection), chunks padded with copies of row 0; against the dense
    # computation with a_i = row i of L, and against projections recomputed per chunk by the
    # triangular solve L⁻¹ K(X, x_i) (cache_bytes=0).
    N = 301
    X = rng.uniform(-2, 2, (N, 2))
    y = rng.poisson(2.0, size=N)
    k = gpvi.kernels.RBF(variance=0.8, lengthscale=0.3)  # K(X, X) well conditioned (~1e8)
    model = gpvi.GP(k, L.Poisson(), mean=0.3)
    obj = gpvi.Objective(model, X, y, chunk_size=128)
    assert obj.cached and obj.chunks.mask.size > N  # padded
    m = rng.normal(size=N) * 0.3
    B = rng.normal(size=(N, N)) / np.sqrt(N)
    C = np.linalg.cholesky(0.4 * np.eye(N) + 0.1 * B @ B.T)
    sums = obj.sums(gpvi.State(m, C))
    _check_dense_poisson_sums(sums, k, X, y, m, C, mean=0.3)
    rec = gpvi.Objective(model, X, y, chunk_size=128, cache_bytes=0)
    assert not rec.cached
    _same_sums(rec.sums(gpvi.State(m, C)), sums)


@pytest.mark.slow
def test_trimmed_triangular_blocks_give_the_dense_products(rng):
    # Row blocks of an upper-triangular At cut to their trailing columns (trim_triangular): every
    # block helper gives what it gives on the untrimmed blocks, against NumPy on the dense At
    # (d = 50 weights, n = 57 columns: 7 padding columns after the 50 triangular ones).
    from gpvi.objective import (assemble_gram, assemble_rows, block_gram, block_matvec, block_sum_squares,
                                block_vecmat, marginals_stacked, split_rows, stacked_state, trim_triangular)

    d, n, k = 50, 57, 3
    At = np.triu(rng.normal(size=(d, d)))
    At = np.concatenate([At, np.outer(At[:, 0], np.ones(n - d))], axis=1)  # padding: copies of column 0
    dense = split_rows(jnp.asarray(At), k)
    trim = trim_triangular(dense)
    assert [a.shape[-1] for a in trim] == [n, n - 17, n - 33] and all(
        np.all(np.asarray(a)[:, :n - t.shape[-1]] == 0) for a, t in zip(dense, trim))
    w, r, u = rng.normal(size=n), rng.normal(size=n), rng.normal(size=d)
    m = rng.normal(size=d)
    C = np.linalg.cholesky(np.eye(d) + 0.1 * np.ones((d, d)))
    W = stacked_state(gpvi.State(jnp.asarray(m), jnp.asarray(C)))
    b, c, off = rng.normal(size=n), rng.uniform(size=n), rng.normal(size=n)
    np.testing.assert_array_equal(np.asarray(assemble_rows(trim)), At)
    for blocks in (dense, trim):
        np.testing.assert_allclose(np.asarray(block_matvec(blocks, jnp.asarray(r))), At @ r, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(block_vecmat(jnp.asarray(u), blocks)), u @ At, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(block_sum_squares(blocks)), np.sum(At**2, 0), rtol=1e-12)
        P, Ar = block_gram(blocks, jnp.asarray(w), jnp.asarray(r))
        np.testing.assert_allclose(np.asarray(assemble_gram(P, k)), (At * w) @ At.T, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(Ar), At @ r, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(assemble_gram(block_gram(blocks, jnp.asarray(w)), k)),
                                   (At * w) @ At.T, rtol=1e-10, atol=1e-10)
        mi, vi = marginals_stacked(blocks, jnp.asarray(b), jnp.asarray(c), jnp.asarray(off), W)
        np.testing.assert_allclose(np.asarray(mi), m @ At + b + off, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(vi), c + np.einsum("ji,jk,ki->i", At, C @ C.T, At), rtol=1e-11)


@pytest.mark.slow
def test_full_gp_in_one_chunk_keeps_trimmed_blocks_with_the_dense_sums(rng):
    # One chunk of a full GP, three row blocks: the objective keeps them trimmed (the zeros of
    # Lᵀ before each block's first row are not stored), and its sums are the dense NumPy ones.
    N = 90
    X = rng.uniform(-2, 2, (N, 2))
    y = rng.poisson(2.0, size=N)
    k = gpvi.kernels.RBF(variance=0.8, lengthscale=0.5)
    model = gpvi.GP(k, L.Poisson(), mean=0.3)
    obj = gpvi.Objective(model, X, y, blocks=3)
    A = obj.proj[0]
    assert len(A) == 3 and A[0].shape[-1] > A[1].shape[-1] > A[2].shape[-1]
    m = rng.normal(size=N) * 0.3
    B = rng.normal(size=(N, N)) / np.sqrt(N)
    C = np.linalg.cholesky(0.4 * np.eye(N) + 0.1 * B @ B.T)
    sums = obj.sums(gpvi.State(m, C))
    lam, vi = _check_dense_poisson_sums(sums, k, X, y, m, C, mean=0.3)
    np.testing.assert_allclose(np.asarray(sums.trSV), np.sum(lam * vi), rtol=1e-10)
    # every engine that reads the projections ends where it ends on the untrimmed single block
    one = gpvi.Objective(model, X, y, blocks=1)
    assert one.proj[0][0].shape[-1] == A[0].shape[-1]
    for engine in ("fpi", "fpb", "gradient", "dual", "laplace"):
        run = gpvi.engines.get(engine)
        a = run(obj, gpvi.prior_state(N), tol=1e-10, max_iter=3000)
        b = run(one, gpvi.prior_state(N), tol=1e-10, max_iter=3000)
        assert abs(a.vlb - b.vlb) <= 1e-9 * abs(b.vlb), (engine, a.vlb, b.vlb)
        np.testing.assert_allclose(np.asarray(a.state.mean), np.asarray(b.state.mean), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_multilatent_full_gp_training_projection_matches_recomputed(rng):
    # the same gather for two full-GP latents (one kernel each), against the solve per chunk
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    N = 151  # 3 chunks of 51 rows, 2 of them padding
    X = rng.uniform(-2, 2, (N, 2))
    y = (X[:, 0] > 0).astype(float)
    model = MultiLatent.full([gpvi.kernels.RBF(lengthscale=0.3), gpvi.kernels.Matern52(lengthscale=0.5)],
                             Softmax(num_classes=2), mean=[0.0, 0.4])
    obj = gpvi.Objective(model, X, y, chunk_size=64)
    assert obj.cached and obj.coupled and obj.chunks.mask.size > N
    m = rng.normal(size=(2, N)) * 0.3
    B = rng.normal(size=(N, N)) / np.sqrt(N)
    C1 = np.linalg.cholesky(0.4 * np.eye(N) + 0.1 * B @ B.T)
    state = gpvi.State(m, np.stack([C1, 0.5 * C1]))
    sums = obj.sums(state)
    assert sums.rows_h.shape == obj.chunks.mask.shape + (2, 2)
    _same_sums(gpvi.Objective(model, X, y, chunk_size=64, cache_bytes=0).sums(state), sums)


def _same_sums(a, b):
    np.testing.assert_allclose(float(a.vlb), float(b.vlb), rtol=1e-11)
    for x, y in ((a.grad, b.grad), (a.S, b.S)):
        x, y = np.asarray(x), np.asarray(y)
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-9 * np.abs(y).max())


@pytest.mark.parametrize("kind", ["glm", "sparse_cached", "sparse_raw", "full_gp", "two_latents", "clipped"])
@pytest.mark.slow
def test_trace_of_SV_from_the_pass_matches_the_dense_product(rng, kind):
    # Sums.trSV = Σ λ_i a_iᵀ V a_i comes from the marginal variances of the pass (in the raw
    # features of a recomputed sparse GP: Σ λ aᵀ(V − I)a + tr S); against tr(S V) formed
    # densely, and the gap estimate with it against the one by the d×d×d product.
    import jax.numpy as jnp

    from gpvi.engines._common import estimated_gap
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    N, D = 203, 2
    X = rng.uniform(-2, 2, (N, D))
    y = rng.poisson(2.0, size=N).astype(float)
    k = gpvi.kernels.RBF(variance=0.8, lengthscale=0.7)
    cache, clip, Q = 2**30, False, None
    if kind == "glm":
        model = gpvi.GLM(likelihood=L.Poisson(), prior_variance=0.7)
    elif kind in ("sparse_cached", "sparse_raw"):
        model = gpvi.SparseGP(k, L.Poisson(), inducing=X[:17], mean=0.2)
        cache = 0 if kind == "sparse_raw" else cache
    elif kind == "full_gp":
        model = gpvi.GP(k, L.Poisson(), mean=0.2)
    elif kind == "two_latents":
        y = (X[:, 0] > 0).astype(float)
        model, Q = MultiLatent.full([k, gpvi.kernels.Matern52(lengthscale=0.5)], Softmax(num_classes=2)), 2
    else:  # Student-t: some λ_i > 0, clipped to 0 in S and in tr(S V) alike
        y = rng.standard_t(2.0, size=N) * 3.0
        model, clip = gpvi.SparseGP(k, L.StudentT(df=3.0, scale=0.3), inducing=X[:17]), True
    obj = gpvi.Objective(model, X, y, chunk_size=64, cache_bytes=cache)
    d = obj.dim
    shape = (Q, d) if Q else (d,)
    B = rng.normal(size=shape + (d,)) / np.sqrt(d)
    C = np.linalg.cholesky(0.3 * np.eye(d) + 0.2 * B @ np.swapaxes(B, -1, -2))
    state = gpvi.State(jnp.asarray(rng.normal(size=shape) * 0.3), jnp.asarray(C))
    sums = obj.sums(state, clip_gamma=clip)
    assert sums.trSV is not None and obj.cached == (cache > 0)
    if clip:  # some λ_i > 0 were clipped
        assert np.abs(np.asarray(obj.sums(state).trSV) - np.asarray(sums.trSV)) > 1e-3
    S, V = np.asarray(sums.S), C @ np.swapaxes(C, -1, -2)
    np.testing.assert_allclose(np.asarray(sums.trSV), np.einsum("...ij,...ji->...", S, V), rtol=1e-10, atol=1e-10)
    with_pass = float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
    dense = float(estimated_gap(state, sums.grad, sums.S)[0])
    assert np.isfinite(dense) and dense > 0
    np.testing.assert_allclose(with_pass, dense, rtol=1e-9)


def test_objective_options_are_set_when_built_and_checked(rng):
    # coupled and newton_rtol were attributes set from outside after construction (issue 31)
    X = rng.normal(size=(20, 2))
    y = rng.poisson(1.0, size=20)
    model = gpvi.GP(kernel=gpvi.kernels.RBF(), likelihood=L.Poisson()).initialise(X)
    assert gpvi.Objective(model, X, y).coupled is False  # one latent: nothing to couple
    with pytest.raises(ValueError, match="coupled=True needs several latents"):
        gpvi.Objective(model, X, y, coupled=True)
    with pytest.raises(ValueError, match="coupled must be"):
        gpvi.Objective(model, X, y, coupled="yes")
    with pytest.raises(ValueError, match="newton_rtol must be"):
        gpvi.Objective(model, X, y, newton_rtol=0.0)
    assert gpvi.Objective(model, X, y, newton_rtol=1e-6).newton_rtol == 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("d, rows", [(7, 300), (23, 5), (24, 8)])
def test_inverse_precision_operator_by_row_blocks_matches_dense_algebra(d, rows):
    # H_q⁻¹ r_q = J RH_q⁻ᵀ RH_q⁻¹ J r_q for lower-triangular RH_q⁻¹, here from dense NumPy
    # (J reverses the order); one block (d = 7) and several uneven or even ones.
    import jax.numpy as jnp
    from gpvi.objective.newton import inverse_precision_operator

    rng = np.random.default_rng(d)
    Q = 3
    Ti = np.tril(rng.standard_normal((Q, d, d))) + 3 * np.eye(d)
    R = rng.standard_normal((Q, d))
    got = np.asarray(inverse_precision_operator(jnp.asarray(Ti), rows)(jnp.asarray(R)))
    for q in range(Q):
        want = (Ti[q].T @ (Ti[q] @ R[q][::-1]))[::-1]
        np.testing.assert_allclose(got[q], want, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("d, n, leaf", [(7, 5, 256), (9, 4, 2), (301, 40, 64)])
def test_products_with_one_lower_triangular_factor_match_numpy(d, n, leaf):
    """lower_left_matmul (L @ B) and lower_right_matmul (B @ L) against NumPy's dense products
    of the lower triangle; L carries nonzero entries above its diagonal, which both must ignore."""
    from gpvi._linalg import lower_left_matmul, lower_right_matmul

    rng = np.random.default_rng(d + n + leaf)
    L, B, C = rng.standard_normal((d, d)), rng.standard_normal((d, n)), rng.standard_normal((n, d))
    want = np.tril(L) @ B
    np.testing.assert_allclose(np.asarray(lower_left_matmul(jnp.asarray(L), jnp.asarray(B), leaf)), want,
                               rtol=0, atol=1e-12 * np.abs(want).max())
    want = C @ np.tril(L)
    np.testing.assert_allclose(np.asarray(lower_right_matmul(jnp.asarray(C), jnp.asarray(L), leaf)), want,
                               rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("d, leaf", [(7, 256), (9, 2), (600, 256), (301, 64)])
def test_lower_triangular_products_match_numpy(d, leaf):
    """lower_matmul and lower_gram against NumPy's dense products, on one and on stacked factors
    (even and odd sizes, one leaf and several levels of recursion).  The factors carry nonzero
    entries above the diagonal, which both must ignore: the products are those of the lower
    triangles."""
    from gpvi._linalg import lower_gram, lower_matmul

    rng = np.random.default_rng(d + leaf)
    A = rng.standard_normal((d, d))
    B = rng.standard_normal((3, d, d))
    lA, lB = np.tril(A), np.tril(B)
    got = np.asarray(lower_matmul(jnp.asarray(A), jnp.asarray(B), leaf))
    want = lA @ lB
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert np.all(np.triu(got, 1) == 0.0)
    got = np.asarray(lower_gram(jnp.asarray(B), leaf))
    want = lB @ np.swapaxes(lB, -1, -2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    np.testing.assert_allclose(np.asarray(lower_gram(jnp.asarray(A), leaf)), lA @ lA.T, rtol=0,
                               atol=1e-12 * np.abs(lA @ lA.T).max())
