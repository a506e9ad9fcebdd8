"""The data-stream layer (gpvi.stream) and the scaled minibatch sums (objective.minibatch_sums)."""
import itertools
import os

import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.data import stream as stream
from gpvi.objective import Chunks, Objective, minibatch_sums


def _data(rng, N=103, D=3):
    X = rng.normal(size=(N, D))
    y = np.arange(N, dtype=float)  # y = row id, so batches can be traced back to rows
    off = 0.01 * np.arange(N)
    return X, y, off


def _epoch_rows(s, B, epoch, seed=0):
    batches = list(s.minibatches(B, epoch=epoch, seed=seed))
    for b in batches:
        assert b.X.shape == (B, s.num_features) and b.y.shape == (B,) and b.mask.shape == (B,)
        assert b.mask.sum() == b.rows
    assert [b.last for b in batches] == [False] * (len(batches) - 1) + [True]
    ids = np.concatenate([b.y[b.mask > 0] for b in batches])
    return ids, batches


def _check_rows(s, X, y, off, B):
    """Every row exactly once per epoch, with its own X and offset; epochs shuffled differently."""
    orders = []
    for epoch in range(2):
        ids, batches = _epoch_rows(s, B, epoch)
        assert sorted(ids.astype(int).tolist()) == list(range(len(y)))
        Xs = np.concatenate([b.X[b.mask > 0] for b in batches])
        offs = np.concatenate([b.offset[b.mask > 0] for b in batches])
        np.testing.assert_array_equal(Xs, X[ids.astype(int)])
        np.testing.assert_array_equal(offs, off[ids.astype(int)])
        orders.append(ids)
    assert not np.array_equal(orders[0], orders[1])
    again, _ = _epoch_rows(s, B, 1)
    np.testing.assert_array_equal(again, orders[1])  # reproducible from (seed, epoch)


def test_arrays_every_row_once_and_fixed_shape(rng):
    X, y, off = _data(rng)
    s = stream.from_arrays(X, y, off)
    _check_rows(s, X, y, off, 10)
    ids, batches = _epoch_rows(s, 10, 0)
    assert len(batches) == 11 and batches[-1].rows == 3
    unshuffled = np.concatenate([b.y[b.mask > 0] for b in s.minibatches(10, shuffle=False)])
    np.testing.assert_array_equal(unshuffled, y)


def test_npy_memmap(rng, tmp_path):
    X, y, off = _data(rng)
    for name, a in (("X", X), ("y", y), ("o", off)):
        np.save(tmp_path / f"{name}.npy", a)
    s = stream.from_npy(tmp_path / "X.npy", tmp_path / "y.npy", tmp_path / "o.npy", block_rows=16, buffer_rows=32)
    assert s.num_rows == 103
    _check_rows(s, X, y, off, 8)


def test_parquet_row_groups_and_csv(rng, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y, off = _data(rng)
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "target": y, "off": off})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=20)
    s = stream.from_parquet(tmp_path / "d.parquet", "target", offset_column="off", buffer_rows=25)
    assert s.num_row_groups == 6 and s.x_columns == ["a", "b", "c"]
    _check_rows(s, X, y, off, 7)

    import pandas as pd

    pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "target": y, "off": off}).to_csv(
        tmp_path / "d.csv", index=False, float_format="%.17g")
    c = stream.from_csv(tmp_path / "d.csv", "target", offset_column="off", block_bytes=1024, buffer_rows=30)
    assert c.num_rows == 103
    _check_rows(c, X, y, off, 7)


def test_iterator_source(rng):
    X, y, off = _data(rng, N=40)
    parts = [(X[i:i + 13], y[i:i + 13]) for i in range(0, 40, 13)]
    s = stream.from_iterator(lambda: iter(parts))
    assert s.count_rows() == 40
    ids, _ = _epoch_rows(s, 6, 0)
    assert sorted(ids.astype(int).tolist()) == list(range(40))
    # a one-shot iterator serves one epoch, then says it is exhausted
    one = stream.from_iterator(iter(parts), num_rows=40)
    _epoch_rows(one, 6, 0)
    with pytest.raises(ValueError, match="exhausted"):
        list(one.minibatches(6, epoch=1))


def test_bad_input(rng, tmp_path):
    X, y, off = _data(rng, N=20)
    s = stream.from_arrays(X, y)
    for B in (0, -3, 21, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            list(s.minibatches(B))
    ragged = [(X[:5], y[:5]), (X[5:10, :2], y[5:10])]
    with pytest.raises(ValueError, match="batch 1 .*2 columns"):
        list(stream.from_iterator(ragged, num_rows=10).minibatches(2))
    with pytest.raises(ValueError, match="batch 1 .*2 columns"):  # head() too (k-means start: a NumPy error before)
        stream.from_iterator(ragged, num_rows=10).head(10)
    short_y = [(X[:5], y[:5]), (X[5:10], y[5:9])]
    with pytest.raises(ValueError, match="batch 1 .*ragged"):
        list(stream.from_iterator(short_y, num_rows=10).minibatches(2))
    Xn = X.copy()
    Xn[7, 1] = np.nan
    nan = [(Xn[:5], y[:5]), (Xn[5:10], y[5:10])]
    with pytest.raises(ValueError, match=r"batch 1, row 2 \(row 7 of the epoch\).*X"):
        list(stream.from_iterator(nan, num_rows=10).minibatches(2))
    with pytest.raises(ValueError, match="no rows"):
        list(stream.from_iterator([], num_rows=3).minibatches(2))
    with pytest.raises(ValueError, match="does not exist"):
        stream.from_npy(tmp_path / "nope.npy", tmp_path / "y.npy")
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    s = stream.from_npy(tmp_path / "X.npy", tmp_path / "y.npy")
    np.save(tmp_path / "y.npy", y + 1.0)
    os.utime(tmp_path / "y.npy", ns=(1, 1))
    with pytest.raises(ValueError, match=r"y\.npy changed while it was being read"):
        list(s.minibatches(4))
    os.remove(tmp_path / "y.npy")
    with pytest.raises(ValueError, match="disappeared"):
        list(s.minibatches(4))


# ---- scaled minibatch sums --------------------------------------------------------------------

def _sparse_problem(rng, N, lik, M=4):
    X = rng.uniform(-2, 2, size=(N, 2))
    f = np.sin(X[:, 0]) + 0.3 * X[:, 1]
    if isinstance(lik, L.Poisson):
        y = rng.poisson(np.exp(f)).astype(float)
    else:
        y = f + 0.3 * rng.normal(size=N)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=0.8), lik, inducing=X[:M].copy())
    return model, X, y


def test_minibatch_sums_unbiased_by_enumeration(rng):
    """The mean over all C(N, B) minibatches of the N/B-scaled sums is the full-data sums."""
    import jax.numpy as jnp

    N, B = 8, 3
    model, X, y = _sparse_problem(rng, N, L.Poisson())
    off = 0.1 * rng.normal(size=N)
    obj = Objective(model, X, y, off)
    d = obj.dim
    state = gpvi.State(jnp.asarray(0.3 * rng.normal(size=d)),
                       jnp.asarray(np.tril(0.2 * rng.normal(size=(d, d))) + 0.7 * np.eye(d)))
    full = obj.sums(state)
    acc = [0.0, 0.0, 0.0]
    subsets = list(itertools.combinations(range(N), B))
    for idx in subsets:
        idx = list(idx)
        ch = Chunks(jnp.asarray(X[idx]), jnp.asarray(y[idx]), jnp.asarray(off[idx]), jnp.ones(B))
        s = minibatch_sums(model, obj.prior, ch, state, N / B)
        acc = [a + np.asarray(t) / len(subsets) for a, t in zip(acc, s)]
    np.testing.assert_allclose(acc[0], float(full.vlb), rtol=1e-12)
    np.testing.assert_allclose(acc[1], np.asarray(full.grad), atol=1e-11)
    np.testing.assert_allclose(acc[2], np.asarray(full.S), atol=1e-11)


def test_minibatch_sums_padding_is_masked(rng):
    """A padded batch (mask 0 on padding) gives the sums of its real rows only; with B = N and
    scale 1 the sums are the full-data sums (another code path: Objective's chunked scan)."""
    import jax.numpy as jnp

    N = 11
    model, X, y = _sparse_problem(rng, N, L.Gaussian(variance=0.2))
    obj = Objective(model, X, y)
    state = gpvi.prior_state(obj.dim)
    b = next(stream.from_arrays(X, y).minibatches(N, shuffle=False))
    full = minibatch_sums(model, obj.prior, Chunks(*(jnp.asarray(a) for a in b[:4])), state, 1.0)
    ref = obj.sums(state)
    assert full.rows_h is None and ref.rows_h is None  # one latent
    for a, r in zip(full[:3], ref[:3]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-12, atol=1e-12)
    bs = list(stream.from_arrays(X, y).minibatches(4, shuffle=False))
    assert bs[-1].rows == 3
    parts = [minibatch_sums(model, obj.prior, Chunks(*(jnp.asarray(a) for a in bb[:4])), state, 1.0) for bb in bs]
    kl = 0.0  # at the prior state the KL term is 0, so the batch VLBs add up
    np.testing.assert_allclose(sum(float(p.vlb) for p in parts), float(ref.vlb) - kl, rtol=1e-12)
    np.testing.assert_allclose(sum(np.asarray(p.S) for p in parts), np.asarray(ref.S), atol=1e-12)


def test_minibatch_larger_than_a_chunk_is_summed_in_pieces(rng):
    """B = 2500 > DEFAULT_CHUNK: the batch is summed over padded sub-chunks (a scan); same sums
    as Objective's pass over those rows, and minibatch_vlb agrees."""
    import jax.numpy as jnp

    from gpvi.objective import minibatch_vlb

    N = 2500
    model, X, y = _sparse_problem(rng, N, L.Poisson(), M=6)
    obj = Objective(model, X, y)
    state = gpvi.State(jnp.asarray(0.1 * rng.normal(size=6)), jnp.asarray(0.9 * np.eye(6)))
    ch = Chunks(jnp.asarray(X), jnp.asarray(y), jnp.zeros(N), jnp.ones(N))
    got, ref = minibatch_sums(model, obj.prior, ch, state, 1.0), obj.sums(state)
    for a, r in zip(got[:3], ref[:3]):  # rows_h: None on both (one latent)
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-11, atol=1e-9)
    np.testing.assert_allclose(float(minibatch_vlb(model, ch, state, 1.0, prior=obj.prior)), float(ref.vlb), rtol=1e-12)
