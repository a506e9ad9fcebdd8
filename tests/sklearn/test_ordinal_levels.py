"""GPOrdinalRegressor's level order: ``levels=``, ordered pandas Categoricals, numeric labels,
and the refusal of labels whose order is unknown (gpvi.estimators)."""
import numpy as np
import pytest

import gpvi
from gpvi import GPOrdinalRegressor, kernels

pd = pytest.importorskip("pandas")

ORDER = ["low", "mid", "high"]  # not alphabetical: sorted, it would be high, low, mid
FIXED = dict(kernel=kernels.RBF(variance=4.0, lengthscale=1.0), learn_hyperparameters=False)


def _data(n=45):
    """One input on a line; the latent increases with it: low, then mid, then high."""
    X = np.linspace(-2.0, 2.0, n)[:, None]
    level = np.digitize(X[:, 0], [-0.7, 0.7])
    return X, level, np.array(ORDER)[level]


def _expected_level(est, X):
    return est.predict_proba(X) @ np.arange(len(est.classes_))


def _assert_follows_order(est, X, level):
    """classes_ is in level order and predictions go up the levels with the latent."""
    assert est.predict_proba(X).shape == (len(X), len(est.classes_))
    pred = est.predict(X[[0, -1]])
    assert list(pred) == [est.classes_[level[0]], est.classes_[level[-1]]]
    assert list(pred) == ["low", "high"]
    _assert_rises(_expected_level(est, X), level)


def _assert_rises(ev, level):
    """The expected level rises from the rows of the lowest true level to those of the highest."""
    by_level = [ev[level == j].mean() for j in range(3)]
    assert by_level[0] < 0.5 < by_level[1] < 1.5 < by_level[2], by_level


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["Categorical", "Series"])
def test_ordered_categorical_gives_the_level_order(wrap):
    X, level, labels = _data()
    y = pd.Categorical(labels, categories=ORDER, ordered=True)
    if wrap == "Series":
        y = pd.Series(y)
    est = GPOrdinalRegressor(**FIXED).fit(X, y)
    assert list(est.classes_) == ORDER
    _assert_follows_order(est, X, level)
    # the Categorical's codes are the levels: same fit as levels= on the plain labels
    ref = GPOrdinalRegressor(levels=ORDER, **FIXED).fit(X, labels)
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_levels_order_plain_strings_and_learned_fit():
    X, level, labels = _data()
    for y in (labels, labels.astype(object), pd.Series(labels)):
        est = GPOrdinalRegressor(levels=ORDER, **FIXED).fit(X, y)
        assert list(est.classes_) == ORDER
        _assert_follows_order(est, X, level)
    # with hyperparameters learned (a few rounds), every row gets its level back
    est = GPOrdinalRegressor(levels=tuple(ORDER), max_rounds=5).fit(X, labels)
    assert list(est.classes_) == ORDER
    assert est.score(X, labels) > 0.9
    assert np.all(np.diff(np.asarray(est.fit_result_.model.likelihood.edges)) > 0)
    # levels= takes precedence over a Categorical's own order
    rev = pd.Categorical(labels, categories=ORDER[::-1], ordered=True)
    assert list(GPOrdinalRegressor(levels=ORDER, **FIXED).fit(X, rev).classes_) == ORDER


def test_numbers_sort_numerically_and_levels_can_reorder_them():
    X, level, _ = _data()
    for codes, want in (([1, 2, 10], [1, 2, 10]), ([-3.0, 2.0, 10.0], [-3.0, 2.0, 10.0])):
        y = np.array(codes)[level]
        shuffled = np.array([codes[1], codes[2], codes[0]])[level]  # also fine: its own sorted order
        est = GPOrdinalRegressor(**FIXED).fit(X, y)
        assert est.classes_.tolist() == want and est.classes_.dtype.kind in "if"
        assert est.predict(X[[0, -1]]).tolist() == [codes[0], codes[2]]
        assert GPOrdinalRegressor(**FIXED).fit(X, shuffled).classes_.tolist() == sorted(codes)
    y = np.array([2, 10, 1])[2 - level]  # 1 at the low end, then 10, then 2: [2, 10, 1] → [1, 2, 10]
    assert GPOrdinalRegressor(**FIXED).fit(X, y).classes_.tolist() == [1, 2, 10]
    # an unordered Categorical of numbers: numeric order, not its categories' order
    cat = pd.Categorical(np.array([1, 2, 10])[level], categories=[10, 1, 2])
    assert GPOrdinalRegressor(**FIXED).fit(X, cat).classes_.tolist() == [1, 2, 10]
    # booleans are numbers: False < True
    assert GPOrdinalRegressor(**FIXED).fit(X, level > 0).classes_.tolist() == [False, True]
    # levels= overrides the numeric order: reversed levels mirror the fit
    y = np.array([1, 2, 10])[level]
    up = GPOrdinalRegressor(**FIXED).fit(X, y)
    down = GPOrdinalRegressor(levels=[10, 2, 1], **FIXED).fit(X, y)
    assert down.classes_.tolist() == [10, 2, 1]
    assert down.predict(X[[0, -1]]).tolist() == [1, 10]
    np.testing.assert_allclose(down.predict_proba(X)[:, ::-1], up.predict_proba(X), atol=1e-6)
    # non-integer float labels are a regression target unless levels= names them
    y = np.array([0.5, 1.5, 2.5])[level]
    with pytest.raises(ValueError, match=r"Unknown label type: continuous.*levels="):
        GPOrdinalRegressor(**FIXED).fit(X, y)
    assert GPOrdinalRegressor(levels=[0.5, 1.5, 2.5], **FIXED).fit(X, y).classes_.tolist() == [0.5, 1.5, 2.5]


@pytest.mark.parametrize("make_y", [
    lambda lab: lab,
    lambda lab: lab.astype(object),
    lambda lab: pd.Series(lab),
    lambda lab: pd.Categorical(lab),  # unordered: its (alphabetical) categories are no order
    lambda lab: pd.Series(pd.Categorical(lab, categories=ORDER)),
    lambda lab: np.array(["1", "2", "10"])[np.searchsorted(ORDER[::-1], lab) % 3],  # numeric strings
], ids=["str", "object", "Series", "unordered-Categorical", "unordered-Series", "numeric-strings"])
def test_unordered_labels_without_levels_are_refused(make_y):
    X, _, labels = _data()
    with pytest.raises(ValueError, match=r"GPOrdinalRegressor: y has non-numeric labels .* order is unknown; "
                                         r"give it with levels=.*ordered pandas Categorical"):
        GPOrdinalRegressor(**FIXED).fit(X, make_y(labels))


@pytest.mark.parametrize("levels, match", [
    (["low", "mid"], r"y has labels \['high'\] that are not in levels \['low', 'mid'\]"),
    (["low", "mid", "top"], r"y has labels \['high'\] that are not in levels"),
    (["low", "mid", "high", "mid"], r"levels names \['mid'\] more than once"),
    ("low,mid,high", "levels must be None or a list"),
    ({"low", "mid", "high"}, "levels must be None or a list"),
    ([["low"], ["mid"], ["high"]], "levels must be None or a list"),
    (["low"], "levels must list at least two labels"),
])
def test_bad_levels_raise_at_fit(levels, match):
    X, _, labels = _data()
    est = GPOrdinalRegressor(levels=levels, **FIXED)  # nothing is checked in __init__
    assert est.get_params()["levels"] is levels
    with pytest.raises(ValueError, match=match):
        est.fit(X, labels)


def test_levels_absent_from_y_keep_their_place():
    X, level, labels = _data()
    levels = ["none", "low", "mid", "very", "high", "max"]
    est = GPOrdinalRegressor(levels=levels, **FIXED).fit(X, labels)
    assert list(est.classes_) == levels
    proba = est.predict_proba(X)
    assert proba.shape == (len(X), 6) and np.allclose(proba.sum(1), 1.0)
    assert np.all(np.diff(np.asarray(est.fit_result_.model.likelihood.edges)) > 0)
    assert est.predict(X[[0, -1]]).tolist() == ["low", "high"]
    # an ordered Categorical's unused categories are levels too
    cat = pd.Categorical(labels, categories=levels, ordered=True)
    assert list(GPOrdinalRegressor(**FIXED).fit(X, cat).classes_) == levels
    with pytest.raises(ValueError, match="only one class"):
        GPOrdinalRegressor(levels=levels, **FIXED).fit(X, np.full(len(X), "mid"))


@pytest.mark.slow
def test_partial_fit_follows_a_non_alphabetical_order():
    X, level, labels = _data(60)
    est = GPOrdinalRegressor(levels=ORDER, inducing=12, **FIXED)
    est.partial_fit(X[::2], labels[::2], classes=["mid", "high", "low"])  # classes= in any order
    assert list(est.classes_) == ORDER and est.model_kind_ == "sparse"
    before = _expected_level(est, X)
    est.partial_fit(X[1::2], labels[1::2])
    assert list(est.classes_) == ORDER
    after = _expected_level(est, X)
    # more rows of the same data sharpen the fit: the ends move further apart, in order
    assert after[0] <= before[0] + 1e-6 and after[-1] >= before[-1] - 1e-6
    assert est.predict(X[[0, -1]]).tolist() == ["low", "high"]
    _assert_rises(after, level)
    # a batch of only "high" rows (code 2) at the top end raises the expected level there
    top = X[-10:]
    e0 = _expected_level(est, top)
    est.partial_fit(top, np.full(10, "high"), classes=ORDER)
    assert np.all(_expected_level(est, top) > e0)
    # an ordered Categorical batch in the same order is fine; a contradicting one is refused
    est.partial_fit(X[:5], pd.Categorical(labels[:5], categories=ORDER, ordered=True))
    with pytest.raises(ValueError, match="contradicts the fitted level order"):
        est.partial_fit(X[:5], pd.Categorical(labels[:5], categories=ORDER[::-1], ordered=True))
    with pytest.raises(ValueError, match="not seen in the first batch"):
        est.partial_fit(X[:3], np.array(["low", "top", "mid"]))
    with pytest.raises(ValueError, match="differ from the fitted classes"):
        est.partial_fit(X[:3], labels[:3], classes=["low", "mid"])
    # the first batch: classes= must be the levels; without levels=, strings are refused
    with pytest.raises(ValueError, match="differ from levels"):
        GPOrdinalRegressor(levels=ORDER, **FIXED).partial_fit(X, labels, classes=["low", "high"])
    with pytest.raises(ValueError, match="levels="):
        GPOrdinalRegressor(**FIXED).partial_fit(X, labels)
    # first batch as an ordered Categorical
    cat = GPOrdinalRegressor(inducing=12, **FIXED).partial_fit(X, pd.Categorical(labels, categories=ORDER,
                                                                                  ordered=True))
    assert list(cat.classes_) == ORDER
    cat.partial_fit(X[:10], labels[:10])
    assert cat.predict(X[[0, -1]]).tolist() == ["low", "high"]


@pytest.mark.parametrize("how", ["list", "tuple", "array", "object-array", "Categorical"])
@pytest.mark.slow
def test_save_and_load_keep_the_level_order(how, tmp_path):
    X, level, labels = _data()
    kw = dict(FIXED)
    y = labels
    if how == "Categorical":
        y = pd.Categorical(labels, categories=ORDER, ordered=True)
    else:
        kw["levels"] = {"list": list(ORDER), "tuple": tuple(ORDER), "array": np.array(ORDER),
                        "object-array": np.array(ORDER, dtype=object)}[how]
    est = GPOrdinalRegressor(**kw).fit(X, y)
    back = gpvi.io.load(gpvi.io.save(est, tmp_path / "ord.gpvi"))
    assert list(back.classes_) == ORDER and back.classes_.dtype == est.classes_.dtype
    assert type(back.levels) is type(est.levels)
    if est.levels is not None:
        assert list(back.levels) == ORDER
        if isinstance(est.levels, np.ndarray):
            assert back.levels.dtype == est.levels.dtype
    assert np.array_equal(back.predict(X), est.predict(X))
    assert np.array_equal(back.predict_proba(X), est.predict_proba(X))
    assert back.predict(X[[0, -1]]).tolist() == ["low", "high"]
    back.partial_fit(X[:6], labels[:6])  # later batches are coded by the loaded order
    assert list(back.classes_) == ORDER
