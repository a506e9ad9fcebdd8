"""Online use: gpvi.fit_stream, interrupted streams, gpvi.fitting.stream.update and partial_fit."""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.data import stream as stream
from gpvi.engines._stochastic import StreamError
from gpvi.objective import Objective


def _poisson(rng, N=600, D=2):
    X = rng.uniform(-2, 2, size=(N, D))
    y = rng.poisson(np.exp(np.sin(1.5 * X[:, 0]) + 0.3 * X[:, 1])).astype(float)
    return X, y


@pytest.mark.slow
def test_fit_stream_from_parquet_matches_batch_fit(rng, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y = _poisson(rng)
    pq.write_table(pa.table({"x0": X[:, 0], "x1": X[:, 1], "count": y}), tmp_path / "d.parquet",
                   row_group_size=100)
    model = gpvi.SparseGP(gpvi.kernels.RBF(), L.Poisson(), inducing=X[:12].copy())
    ref = gpvi.fit(model, X, y)
    seen = []
    res = gpvi.fit_stream(model, tmp_path / "d.parquet", "count", batch_size=50, epochs=5,
                          callback=lambda it, vlb, s: seen.append(it))
    assert res.engine == "sfp" and res.extras["epochs"] == 5 and res.extras["steps"] == 60
    assert len(seen) == 5 and res.trace.shape == (5, 2)  # one estimate per epoch
    full = float(Objective(res.model, X, y).vlb(res.state))
    assert ref.vlb - 1.0 < full <= ref.vlb + 1e-8  # within a nat of the batch optimum
    assert abs(res.vlb - full) < 0.05 * abs(full)  # the epoch's minibatch estimate is near it
    np.testing.assert_allclose(res.predict_f(X[:20])[0], ref.predict_f(X[:20])[0], atol=0.1)
    # svi through the same door, k-means inducing inputs from the stream's head
    res2 = gpvi.fit_stream(gpvi.SparseGP(gpvi.kernels.RBF(), L.Poisson(), inducing=8), X, y, engine="svi",
                           batch_size=100, epochs=3, engine_options={"optimizer": "adam", "learning_rate": 0.05})
    assert np.asarray(res2.model.inducing).shape == (8, 2) and np.isfinite(res2.vlb)
    with pytest.raises(ValueError, match="engine"):
        gpvi.fit_stream(model, X, y, engine="fpi")
    with pytest.raises(ValueError, match="batch_size"):
        gpvi.fit_stream(model, X, y, batch_size=601)


def _batches(X, y, B, bad=None):
    out = [(X[i:i + B], y[i:i + B]) for i in range(0, len(y), B)]
    if bad is not None:
        Xb = out[bad][0].copy()
        Xb[3, 0] = np.nan
        out[bad] = (Xb, out[bad][1])
    return out


def test_stream_failing_mid_epoch_keeps_last_complete_state(rng):
    X, y = _poisson(rng, N=400)
    model = gpvi.SparseGP(gpvi.kernels.RBF(), L.Poisson(), inducing=X[:10].copy())
    B = 40
    src = stream.from_iterator(_batches(X, y, B, bad=6), num_rows=400, buffer_rows=B)
    with pytest.raises(StreamError, match=r"batch 6, row 3 \(row 243 of the epoch\)") as info:
        gpvi.fit_stream(model, src, batch_size=B, epochs=2)
    partial = info.value.result
    assert isinstance(partial, gpvi.FitResult) and partial.extras["interrupted"]
    assert partial.extras["steps"] == 5  # batches 0-4 stepped; 5 was buffered when 6 failed
    # the kept state is exactly that of a clean run stopped after the same steps, and usable
    good = stream.from_iterator(_batches(X, y, B), num_rows=400, buffer_rows=B)
    clean = gpvi.fit_stream(model, good, batch_size=B, epochs=2, engine_options={"max_steps": 5})
    np.testing.assert_array_equal(np.asarray(partial.state.mean), np.asarray(clean.state.mean))
    m, v = partial.predict_f(X[:5])
    assert np.all(np.isfinite(m)) and np.all(v > 0)


def test_ctrl_c_mid_epoch_returns_last_state(rng):
    X, y = _poisson(rng, N=400)
    model = gpvi.SparseGP(gpvi.kernels.RBF(), L.Poisson(), inducing=X[:10].copy())
    parts = _batches(X, y, 40)

    def source():
        for k, p in enumerate(parts):
            if k == 4:
                raise KeyboardInterrupt
            yield p

    res = gpvi.fit_stream(model, stream.from_iterator(source, num_rows=400, buffer_rows=40), batch_size=40)
    assert res.extras["interrupted"] and res.extras["steps"] == 3 and "interrupted" in res.message
    assert np.all(np.isfinite(res.predict_f(X[:5])[0]))


def test_update_is_exact_for_gaussian_noise(rng):
    """Assumed-density updates batch by batch give the full-data posterior (Gaussian noise,
    fixed θ): the same as fitting all rows at once."""
    X = rng.uniform(-3, 3, size=(500, 1))
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=500)
    model = gpvi.SparseGP(gpvi.kernels.RBF(), L.Gaussian(variance=0.04), inducing=np.linspace(-3, 3, 12)[:, None])
    first = gpvi.fit(model, X[:100], y[:100], tol=1e-12)
    fit = gpvi.fitting.stream.update(first, X[100:330], y[100:330], batch_size=64)
    fit = gpvi.fitting.stream.update(fit, X[330:], y[330:], batch_size=64)
    ref = gpvi.fit(model, X, y, tol=1e-12)
    np.testing.assert_allclose(np.asarray(fit.state.mean), np.asarray(ref.state.mean), atol=1e-8)
    V = np.asarray(fit.state.chol) @ np.asarray(fit.state.chol).T
    Vr = np.asarray(ref.state.chol) @ np.asarray(ref.state.chol).T
    np.testing.assert_allclose(V, Vr, atol=1e-8)
    assert fit.extras["rows_seen"] == 400


@pytest.mark.slow
def test_partial_fit_estimators(rng):
    X = rng.uniform(-3, 3, size=(600, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=600)
    est = gpvi.GPRegressor(gpvi.kernels.RBF(), learn_hyperparameters=False, standardize=False, inducing=15,
                           noise_scale=0.1, tol=1e-12)
    for s in range(0, 600, 150):
        est.partial_fit(X[s:s + 150], y[s:s + 150])
    ref = gpvi.fit(est.fit_result_.model, X, y, tol=1e-12)  # same Z (k-means of batch 1) and θ
    np.testing.assert_allclose(est.predict(X[:50]), ref.predict_y(X[:50])[0], atol=1e-7)

    lab = np.where(np.sin(X[:, 0]) + 0.2 * rng.normal(size=600) > 0, "yes", "no")
    clf = gpvi.GPClassifier(inducing=10, learn_hyperparameters=False)
    clf.partial_fit(X[:200], lab[:200])
    acc0 = clf.score(X[400:], lab[400:])
    clf.partial_fit(X[200:400], lab[200:400])
    assert clf.score(X[400:], lab[400:]) >= acc0 - 0.02 and clf.score(X[400:], lab[400:]) > 0.8
    with pytest.raises(ValueError, match="not seen in the first batch"):
        clf.partial_fit(X[:3], np.array(["yes", "maybe", "no"]))


def test_partial_fit_after_a_full_gp_fit(rng):
    """partial_fit after fit() on a full GP continues from the same posterior as a sparse GP
    whose inducing inputs are the training inputs: predictions unchanged before new rows."""
    X = rng.uniform(-3, 3, size=(60, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    est = gpvi.GPRegressor(learn_hyperparameters=False, model="full", tol=1e-10).fit(X[:40], y[:40])
    before = est.predict(X[40:])
    sparse = gpvi.fitting.stream.as_sparse(est.fit_result_)
    m_full, v_full = est.fit_result_.predict_f(X[40:])
    m_sp, v_sp = sparse.predict_f(X[40:])
    np.testing.assert_allclose(m_sp, m_full, atol=1e-6)
    np.testing.assert_allclose(v_sp, v_full, atol=1e-6)
    est.partial_fit(X[40:], y[40:])
    assert est.model_kind_ == "sparse" and not np.allclose(est.predict(X[40:]), before)


@pytest.mark.slow
def test_fit_stream_learn_inducing_with_a_list_of_names(rng):
    """Issue 30 §2: ``learn_inducing=True`` was silently ignored when ``learn_hyperparameters``
    was a list of names (as in gpvi.fit)."""
    X, y = _poisson(rng, N=300)
    Z0 = X[:6].copy()
    model = gpvi.SparseGP(gpvi.kernels.RBF(), L.Poisson(), inducing=Z0)
    kw = dict(engine="svi", batch_size=100, epochs=3, learn_hyperparameters=["kernel.lengthscale"],
              engine_options={"optimizer": "adam", "learning_rate": 0.05})
    moved = gpvi.fit_stream(model, X, y, learn_inducing=True, **kw)
    kept = gpvi.fit_stream(model, X, y, **kw)
    assert np.max(np.abs(np.asarray(moved.model.inducing) - Z0)) > 1e-3
    np.testing.assert_array_equal(np.asarray(kept.model.inducing), Z0)
    assert not np.allclose(np.asarray(kept.model.kernel.lengthscale), 1.0)  # the named one is learned
