"""``GPClassifier.partial_fit(classes=...)`` (issue 33): the first batch may lack some of the
listed classes; ``classes_`` and ``predict_proba``'s columns are the given classes from the start."""
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


def test_multiclass_first_batch_missing_a_class():
    X, y = _blobs(60, [0, 1], 3)
    est = GPClassifier(**FAST).partial_fit(X, y, classes=[0, 1, 2])
    assert est.classes_.tolist() == [0, 1, 2]
    p = est.predict_proba(X)
    assert p.shape == (60, 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-8)
    assert np.mean(est.predict(X) == y) > 0.9
    assert np.all(p[:, 2] < 0.5)  # never seen: not predicted
    with pytest.raises(NotImplementedError, match="multiclass"):
        est.partial_fit(X[:5], y[:5])


def test_labels_outside_classes_and_too_few_classes_are_refused():
    X, y = _blobs(20, ["a", "b"], 4)
    with pytest.raises(ValueError, match="not in classes"):
        GPClassifier(**FAST).partial_fit(X, y, classes=["a", "c"])
    with pytest.raises(ValueError, match="at least two"):
        GPClassifier(**FAST).partial_fit(X[y == "a"], y[y == "a"], classes=["a"])
    est = GPClassifier(**FAST).partial_fit(X, y, classes=["a", "b"])
    with pytest.raises(ValueError, match="differ from the fitted classes"):
        est.partial_fit(X, y, classes=["a", "b", "c"])
