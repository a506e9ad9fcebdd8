"""``GPClassifier.partial_fit(classes=...)`` (issue 33): the first batch may lack some of the
listed classes; ``classes_`` and ``predict_proba``'s columns are the given classes from the start;
later batches update a multiclass (softmax) posterior latent by latent."""
import numpy as np
import pytest

from gpvi import GPClassifier

FAST = {"inducing": 12, "max_rounds": 5}


def _blobs(n, labels, seed):
    rng = np.random.default_rng(seed)
    centres = {lab: np.array([3.0 * k, 0.0]) for k, lab in enumerate(labels)}
    y = rng.choice(labels, size=n)
    X = np.stack([centres[lab] for lab in y]) + 0.7 * rng.normal(size=(n, 2))
    return X, y


def _disc(n, seed, outside=False):
    """Rows on [-2, 2]², labelled "yes" inside the disc of radius 0.8 (a rare class), else "no";
    with ``outside`` only rows outside the disc (a first batch in which "yes" did not occur)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, size=(4 * n, 2))
    inside = np.hypot(X[:, 0], X[:, 1]) < 0.8
    if outside:
        X, inside = X[~inside], inside[~inside]
    return X[:n], np.where(inside[:n], "yes", "no")


@pytest.mark.slow
def test_binary_first_batch_with_one_class_then_both():
    X1, y1 = _disc(40, 0, outside=True)
    assert set(y1.tolist()) == {"no"}
    est = GPClassifier(**FAST).partial_fit(X1, y1, classes=["yes", "no"])
    assert est.classes_.tolist() == ["no", "yes"]
    centre = np.zeros((1, 2))
    p_before = est.predict_proba(centre)[0, 1]
    assert est.predict_proba(X1).shape == (40, 2) and np.all(est.predict(X1) == "no")
    for seed in (1, 2, 3):  # later batches (the inducing inputs came from the first one)
        X2, y2 = _disc(60, seed)
        est.partial_fit(X2, y2)
    p_after = est.predict_proba(centre)[0, 1]
    assert p_after > 0.5 > p_before  # it learned "yes" at the centre
    Xt, yt = _disc(400, 4)
    pred = est.predict(Xt)
    # (measured: 0.97 overall, 0.76 of the disc's rows; "no" everywhere would score 0.875 and 0)
    assert np.mean(pred == yt) > 0.93 and np.mean(pred[yt == "yes"] == "yes") > 0.5


@pytest.mark.slow
def test_multiclass_first_batch_missing_a_class():
    X, y = _blobs(60, [0, 1], 3)
    est = GPClassifier(**FAST).partial_fit(X, y, classes=[0, 1, 2])
    assert est.classes_.tolist() == [0, 1, 2]
    p = est.predict_proba(X)
    assert p.shape == (60, 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-8)
    assert np.mean(est.predict(X) == y) > 0.9
    assert np.all(p[:, 2] < 0.5)  # never seen: not predicted
    # later batches with the third class update all three latents
    for seed in (5, 6):
        X2, y2 = _blobs(90, [0, 1, 2], seed)
        est.partial_fit(X2, y2)
    Xt, yt = _blobs(300, [0, 1, 2], 7)
    assert np.mean(est.predict(Xt) == yt) > 0.9
    assert est.fit_result_.extras["rows_seen"] == 180


@pytest.mark.slow
def test_block_update_is_the_single_latent_update():
    """The latent-block path of ``update`` (an Objective's unscaled batch sums, then the
    assumed-density step in each block) on a one-latent model gives the minibatch path's
    posterior: two ways of taking the same sums."""
    import gpvi
    from gpvi.fitting import stream

    rng = np.random.default_rng(8)
    X = rng.normal(size=(80, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=80) > 0).astype(float)
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=[1.0, 1.0]), gpvi.likelihoods.Bernoulli(), inducing=X[:10])
    fit = gpvi.fit(model, X[:40], y[:40])
    ref = stream.update(fit, X[40:], y[40:], batch_size=16)
    codes = fit.model.likelihood.validate(y[40:])  # the likelihood's internal coding, as update() passes it
    state = stream._update_blocks(fit.model, fit.state, X[40:], codes, np.zeros(40), 16)
    np.testing.assert_allclose(np.asarray(state.mean), np.asarray(ref.state.mean), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(np.asarray(state.chol), np.asarray(ref.state.chol), rtol=1e-9, atol=1e-10)
    assert not np.allclose(np.asarray(state.mean), np.asarray(fit.state.mean))  # it moved


def test_labels_outside_classes_and_too_few_classes_are_refused():
    X, y = _blobs(20, ["a", "b"], 4)
    with pytest.raises(ValueError, match="not in classes"):
        GPClassifier(**FAST).partial_fit(X, y, classes=["a", "c"])
    with pytest.raises(ValueError, match="at least two"):
        GPClassifier(**FAST).partial_fit(X[y == "a"], y[y == "a"], classes=["a"])
    est = GPClassifier(**FAST).partial_fit(X, y, classes=["a", "b"])
    with pytest.raises(ValueError, match="differ from the fitted classes"):
        est.partial_fit(X, y, classes=["a", "b", "c"])
