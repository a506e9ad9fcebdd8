"""Bad input to :func:`gpvi.fit` and the predict methods gets a ``ValueError`` naming the argument.

Validation runs before any inference, so almost every test here fails within milliseconds;
only the fixtures that give the predict-time tests a fitted result run (tiny) fits.  The
property-based tests corrupt random valid data sets and never fit valid data: that valid
data passes is checked on the validation layer itself.
"""
import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import gpvi
from gpvi.engines import EngineResult
from gpvi.likelihoods import Bernoulli, Exponential, Gaussian, Laplace, Ordinal, Poisson, StudentT
from gpvi.models.base import check_X

N, D = 12, 2
EDGES = np.array([-1.0, 0.0, 1.0])  # 4 ordinal levels 0..3


def names(arg):
    """Regex that matches a message naming ``arg`` as a word (``y`` not inside ``array``)."""
    return rf"(?<![\w.]){re.escape(arg)}(?![\w])"


def sparse(lik, inducing=3):
    return gpvi.SparseGP(kernel=gpvi.kernels.RBF(), likelihood=lik, inducing=inducing)


def full(lik):
    return gpvi.GP(kernel=gpvi.kernels.RBF(), likelihood=lik)


def glm(lik):
    return gpvi.GLM(likelihood=lik, prior_variance=1.0)


MODELS = {"sparse": sparse, "gp": full, "glm": glm}


@pytest.fixture
def X(rng):
    return rng.normal(size=(N, D))


@pytest.fixture
def y01(rng):
    y = (rng.random(N) < 0.5).astype(float)
    y[:2] = [0.0, 1.0]
    return y


def fit(model, X, y, **kw):
    kw.setdefault("max_iter", 2)
    return gpvi.fit(model, X, y, **kw)


# ------------------------------------------------------------------------------------------
# X
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_X(model, bad, X, y01):
    X[3, 1] = bad
    with pytest.raises(ValueError, match=names("X") + ".*NaN or infinite"):
        fit(MODELS[model](Bernoulli()), X, y01)


@pytest.mark.parametrize("Xbad, what", [
    (np.empty((0, 2)), "empty"),
    (np.empty((N, 0)), "no columns"),
    (np.zeros((N, 2, 1)), "2-D"),
    (3.0, "2-D"),
    (None, "2-D"),
])
def test_X_bad_shape_or_empty(Xbad, what, y01):
    with pytest.raises(ValueError, match=names("X") + ".*" + what):
        fit(glm(Bernoulli()), Xbad, y01)


def test_empty_data():
    with pytest.raises(ValueError, match=names("X") + ".*empty"):
        fit(sparse(Gaussian()), np.empty((0, 2)), np.empty(0))
    with pytest.raises(ValueError, match=names("X") + ".*empty"):
        fit(glm(Gaussian()), [], [])


@pytest.mark.parametrize("Xbad", [
    np.array([["a", "b"]] * N),
    np.array([[1.0, "x"]] * N, dtype=object),
    np.array([[1.0, 2.0]] * N, dtype=object),  # numbers, but object dtype
    np.ones((N, 2)) + 1j,
    [[1.0, 2.0]] * (N - 1) + [[1.0]],  # ragged
])
def test_X_non_numeric(Xbad, y01):
    with pytest.raises(ValueError, match=names("X") + ".*(numeric|rectangular)"):
        fit(glm(Bernoulli()), Xbad, y01)


# ------------------------------------------------------------------------------------------
# y
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("lik", [Gaussian(), Bernoulli(), Poisson(), Ordinal(edges=EDGES),
                                 Laplace(scale=1.0), StudentT(df=4.0, scale=1.0), Exponential()])
def test_nonfinite_y(lik, bad, X):
    y = np.ones(N)
    y[5] = bad
    with pytest.raises(ValueError, match=names("y") + ".*NaN or infinite"):
        fit(sparse(lik), X, y)


@pytest.mark.parametrize("ybad", [np.ones((N, 1)), np.ones((N, 2)), np.float64(1.0)])
def test_y_not_1d(ybad, X):
    with pytest.raises(ValueError, match=names("y") + ".*1-D"):
        fit(sparse(Gaussian()), X, ybad)


@pytest.mark.parametrize("ybad", [
    np.array(["0", "1"] * (N // 2)),
    np.array([0.0, 1.0] * (N // 2), dtype=object),
    np.array([0, None] * (N // 2), dtype=object),
    np.zeros(N) + 1j,
    [[0.0]] * (N - 1) + [[0.0, 1.0]],  # ragged
])
@pytest.mark.parametrize("lik", [Gaussian(), Bernoulli()])
def test_y_non_numeric(lik, ybad, X):
    with pytest.raises(ValueError, match=names("y") + ".*(numeric|rectangular)"):
        fit(glm(lik), X, ybad)


@pytest.mark.parametrize("n_y", [0, N - 1, N + 1])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_length_mismatch(model, n_y, X):
    with pytest.raises(ValueError, match=rf"{names('X')}.*{names('y')}.*lengths must match"):
        fit(MODELS[model](Gaussian()), X, np.zeros(n_y))


# ------------------------------------------------------------------------------------------
# labels outside the likelihood's support
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("labels", [
    [0, 1, 2],          # 2
    [-1, 0, 1],         # {0, 1} and {−1, +1} codings mixed
    [-1, 0],
    [0, 0.5, 1],
    [-2, 1],
    [1, 3],
])
@pytest.mark.parametrize("link", ["logit", "probit"])
def test_bernoulli_support(labels, link, X):
    y = np.resize(np.asarray(labels, float), N)
    with pytest.raises(ValueError, match=names("y") + ".*Bernoulli support"):
        fit(sparse(Bernoulli(link=link)), X, y)


@pytest.mark.parametrize("labels", [[0, 1], [-1, 1], [True, False], [1, 1], [0, 0], [-1, -1]])
def test_bernoulli_valid_codings(labels):
    y = np.resize(np.asarray(labels), N)
    codes = Bernoulli().validate(y)
    np.testing.assert_array_equal(codes, np.where(y.astype(float) > 0, 1.0, -1.0))


@pytest.mark.parametrize("bad", [-1, -0.5, 0.5, 2.25, -3])
def test_poisson_support(bad, X):
    y = np.arange(N, dtype=float)
    y[4] = bad
    with pytest.raises(ValueError, match=names("y") + ".*Poisson support"):
        fit(sparse(Poisson()), X, y)


@pytest.mark.parametrize("bad", [-1, 4, 7, 0.5, 2.5])
def test_ordinal_unknown_level(bad, X):
    y = np.resize(np.arange(4.0), N)
    y[2] = bad
    with pytest.raises(ValueError, match=names("y") + ".*ordinal levels"):
        fit(sparse(Ordinal(edges=EDGES)), X, y)


@pytest.mark.parametrize("edges", [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0, 0.5], [], [[0.0, 1.0]],
                                   np.array([2.0, 1.0])])
def test_ordinal_edges_not_increasing(edges):
    with pytest.raises(ValueError, match=names("edges")):
        Ordinal(edges=edges)


def test_ordinal_edges_required():
    with pytest.raises(ValueError, match=names("edges")):
        Ordinal()


def test_bernoulli_unknown_link():
    with pytest.raises(ValueError, match=names("link")):
        Bernoulli(link="cauchit")


@pytest.mark.parametrize("bad", [-1.0, -1e-9])
def test_exponential_negative(bad, X):
    y = np.ones(N)
    y[0] = bad
    with pytest.raises(ValueError, match=names("y") + ".*Exponential support"):
        fit(sparse(Exponential()), X, y)


# ------------------------------------------------------------------------------------------
# offset, exposure
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["offset", "exposure"])
@pytest.mark.parametrize("value, what", [
    (np.ones(N - 1), "one entry per row"),
    (np.ones((N, 1)), "one entry per row"),
    (np.r_[np.ones(N - 1), np.nan], "NaN or infinite"),
    (np.r_[np.ones(N - 1), np.inf], "NaN or infinite"),
    (np.array(["1"] * N), "numeric"),
    ([[1.0]] * (N - 1) + [[1.0, 2.0]], "rectangular"),
])
def test_offset_exposure_bad(arg, value, what, X):
    y = np.ones(N)
    with pytest.raises(ValueError, match=names(arg) + ".*" + what):
        fit(sparse(Poisson()), X, y, **{arg: value})


@pytest.mark.parametrize("value", [np.r_[np.ones(N - 1), -2.0], np.r_[np.ones(N - 1), 0.0], -1.0])
def test_exposure_not_positive(value, X):
    with pytest.raises(ValueError, match=names("exposure") + ".*positive"):
        fit(sparse(Poisson()), X, np.ones(N), exposure=value)


# ------------------------------------------------------------------------------------------
# inducing inputs
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", [N + 1, 10 * N])
def test_inducing_int_larger_than_N(M, X):
    with pytest.raises(ValueError, match=names("inducing") + ".*M ≤ N"):
        fit(sparse(Gaussian(), inducing=M), X, np.zeros(N))


def test_inducing_array_more_rows_than_N(X):
    Z = np.random.default_rng(1).normal(size=(N + 2, D))
    with pytest.raises(ValueError, match=names("inducing") + ".*M ≤ N"):
        fit(sparse(Gaussian(), inducing=Z), X, np.zeros(N))


@pytest.mark.parametrize("cols", [1, D + 1])
def test_inducing_wrong_columns(cols, X):
    Z = np.random.default_rng(1).normal(size=(3, cols))
    with pytest.raises(ValueError, match=names("inducing") + ".*columns"):
        fit(sparse(Gaussian(), inducing=Z), X, np.zeros(N))


@pytest.mark.parametrize("Z", [0, -2, 2.5, None, np.full((3, D), np.nan), np.empty((0, D))])
def test_inducing_invalid(Z, X):
    with pytest.raises(ValueError, match=names("inducing")):
        fit(sparse(Gaussian(), inducing=Z), X, np.zeros(N))


def test_inducing_more_than_distinct_rows():
    X = np.ones((N, D))
    with pytest.raises(ValueError, match=names("inducing") + ".*distinct rows"):
        fit(sparse(Gaussian(), inducing=3), X, np.zeros(N))


# ------------------------------------------------------------------------------------------
# other arguments of fit
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["newton", "FPI", "", None, ["fpi"]])
def test_unknown_engine(engine, X, y01):
    with pytest.raises(ValueError, match=names("engine") + ".*one of"):
        fit(sparse(Bernoulli()), X, y01, engine=engine)


@pytest.mark.parametrize("tol", [0.0, -1e-6, -np.inf, np.nan])
def test_tol_not_positive(tol, X, y01):
    with pytest.raises(ValueError, match=names("tol") + ".*positive"):
        fit(sparse(Bernoulli()), X, y01, tol=tol)


@pytest.mark.parametrize("max_iter", [0, -5])
def test_max_iter(max_iter, X, y01):
    with pytest.raises(ValueError, match=names("max_iter")):
        fit(sparse(Bernoulli()), X, y01, max_iter=max_iter)


@pytest.mark.parametrize("model", [None, "glm", Gaussian()])
def test_not_a_model(model, X, y01):
    with pytest.raises(ValueError, match=names("model")):
        fit(model, X, y01)


def test_model_without_likelihood(X, y01):
    with pytest.raises(ValueError, match=names("model") + ".*likelihood"):
        fit(gpvi.GLM(), X, y01)


@pytest.mark.parametrize("d", [D - 1, D + 1])
def test_glm_init_wrong_columns(d, X, y01):
    """A GLM has one weight per column of X; a starting state of another size is rejected."""
    with pytest.raises(ValueError, match=names("init")):
        fit(glm(Bernoulli()), X, y01, init=gpvi.prior_state(d))


# ------------------------------------------------------------------------------------------
# predict time
# ------------------------------------------------------------------------------------------
def _no_inference(obj, start, *, tol, max_iter, callback=None, on_state=None):
    """Stand-in engine: predict-time validation needs a FitResult, not a good posterior, and
    skipping inference keeps these fixtures free of JIT compilation."""
    return EngineResult(state=start, vlb=0.0, iterations=0, converged=False, message="skipped",
                        trace=np.zeros((1, 2)))


def _fit_without_inference(model, X, y):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gpvi.engines.ENGINES, "fpi", dataclasses.replace(gpvi.engines.ENGINES["fpi"], run=_no_inference))
        return gpvi.fit(model, X, y, engine="fpi", cache_bytes=0)


@pytest.fixture(scope="module", params=sorted(MODELS))
def fitted(request):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, D))
    y = np.r_[0.0, 1.0, (rng.random(N - 2) < 0.5)]
    model = (sparse(Bernoulli(), inducing=X[:3]) if request.param == "sparse"
             else MODELS[request.param](Bernoulli()))
    return _fit_without_inference(model, X, y)


@pytest.fixture(scope="module")
def fitted_poisson():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(N, D))
    return _fit_without_inference(sparse(Poisson(), inducing=X[:3]), X, rng.poisson(2.0, N).astype(float))


PREDICT = ["predict_f", "predict_y", "predict_proba"]


@pytest.mark.slow
@pytest.mark.parametrize("method", PREDICT)
@pytest.mark.parametrize("cols", [1, D + 1])
def test_predict_wrong_columns(fitted, method, cols):
    with pytest.raises(ValueError, match=names("X") + ".*columns"):
        getattr(fitted, method)(np.zeros((4, cols)))
    with pytest.raises(ValueError, match=names("X") + ".*columns"):
        fitted.log_predictive_density(np.zeros((4, cols)), np.ones(4))


@pytest.mark.parametrize("method", PREDICT)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_predict_nonfinite_X(fitted, method, bad):
    Xnew = np.zeros((4, D))
    Xnew[2, 0] = bad
    with pytest.raises(ValueError, match=names("X") + ".*NaN or infinite"):
        getattr(fitted, method)(Xnew)
    with pytest.raises(ValueError, match=names("X") + ".*NaN or infinite"):
        fitted.log_predictive_density(Xnew, np.ones(4))


@pytest.mark.parametrize("Xnew, what", [(np.empty((0, D)), "empty"), (np.array([["a"] * D]), "numeric"),
                                        (np.zeros((2, D, 1)), "2-D")])
def test_predict_bad_X(fitted, Xnew, what):
    with pytest.raises(ValueError, match=names("X") + ".*" + what):
        fitted.predict_f(Xnew)


@pytest.mark.parametrize("ynew", [[0, 1, 2, 1], [0, 1, -1, 1], [0, 0.5, 1, 1], [0, 1, np.nan, 1]])
def test_log_predictive_density_bad_labels(fitted, ynew):
    with pytest.raises(ValueError, match=names("y")):
        fitted.log_predictive_density(np.zeros((4, D)), np.asarray(ynew, float))


@pytest.mark.parametrize("n_y", [3, 5])
def test_log_predictive_density_wrong_length(fitted, n_y):
    with pytest.raises(ValueError, match=rf"{names('X')}.*{names('y')}"):
        fitted.log_predictive_density(np.zeros((4, D)), np.ones(n_y))


def test_log_predictive_density_y_2d(fitted):
    with pytest.raises(ValueError, match=names("y") + ".*1-D"):
        fitted.log_predictive_density(np.zeros((4, D)), np.ones((4, 1)))


@pytest.mark.parametrize("ynew", [[0, 1, -1, 1], [0, 1, 2.5, 1]])
def test_log_predictive_density_poisson_support(fitted_poisson, ynew):
    with pytest.raises(ValueError, match=names("y") + ".*Poisson support"):
        fitted_poisson.log_predictive_density(np.zeros((4, D)), np.asarray(ynew, float))


@pytest.mark.parametrize("offset", [np.ones(3), np.r_[0.0, 0.0, np.nan, 0.0]])
def test_predict_bad_offset(fitted_poisson, offset):
    with pytest.raises(ValueError, match=names("offset")):
        fitted_poisson.predict_y(np.zeros((4, D)), offset=offset)


def test_predict_proba_needs_classes(fitted_poisson):
    with pytest.raises(ValueError, match="predict_proba"):
        fitted_poisson.predict_proba(np.zeros((4, D)))


# ------------------------------------------------------------------------------------------
# property-based: corrupt random valid data sets
# ------------------------------------------------------------------------------------------
PROP = settings(max_examples=40, deadline=None)
NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _noninteger(lo=-1e6, hi=1e6):
    return st.floats(min_value=lo, max_value=hi).filter(lambda v: v != round(v))


LIKELIHOODS = {
    # name: (factory, valid labels from a Generator, strategy of labels outside the support)
    "gaussian": (Gaussian, lambda g, n: g.normal(size=n), None),
    "laplace": (lambda: Laplace(scale=1.0), lambda g, n: g.normal(size=n), None),
    "studentt": (lambda: StudentT(df=3.0, scale=1.0), lambda g, n: g.standard_t(3.0, size=n), None),
    "bernoulli": (Bernoulli, lambda g, n: g.integers(0, 2, n).astype(float),
                  st.one_of(st.integers(2, 10**6), st.integers(-10**6, -2), _noninteger(-10, 10))),
    "bernoulli_pm": (lambda: Bernoulli(link="probit"), lambda g, n: g.choice([-1.0, 1.0], n),
                     st.one_of(st.integers(2, 10**6), st.integers(-10**6, -2), _noninteger(-10, 10))),
    "poisson": (Poisson, lambda g, n: g.poisson(3.0, n).astype(float),
                st.one_of(st.integers(-10**6, -1), _noninteger(-100, 100))),
    "ordinal": (lambda: Ordinal(edges=EDGES), lambda g, n: g.integers(0, 4, n).astype(float),
                st.one_of(st.integers(-10**6, -1), st.integers(4, 10**6), _noninteger(-1, 5))),
    "exponential": (Exponential, lambda g, n: g.exponential(size=n),
                    st.floats(min_value=-1e6, max_value=-1e-300)),
}
BOUNDED = sorted(k for k, v in LIKELIHOODS.items() if v[2] is not None)


@st.composite
def datasets(draw, likelihoods=tuple(sorted(LIKELIHOODS))):
    """A random valid (model, X, y, likelihood name): N ≤ 30 rows, D ≤ 3 columns."""
    n = draw(st.integers(2, 30))
    d = draw(st.integers(1, 3))
    lik = draw(st.sampled_from(likelihoods))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = g.normal(size=(n, d)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    y = LIKELIHOODS[lik][1](g, n)
    kind = draw(st.sampled_from(sorted(MODELS)))
    model = (sparse(LIKELIHOODS[lik][0](), inducing=draw(st.integers(1, n))) if kind == "sparse"
             else MODELS[kind](LIKELIHOODS[lik][0]()))
    return model, X, y, lik


@PROP
@given(data=datasets())
def test_valid_random_data_passes_validation(data):
    """The validation layer accepts what the corrupting tests below start from (no fitting)."""
    model, X, y, _ = data
    Xc = check_X(X, "X")
    assert Xc.shape == X.shape and Xc.dtype == np.float64
    codes = model.likelihood.validate(y)
    assert codes.shape == y.shape and codes.dtype == np.float64 and np.all(np.isfinite(codes))


@PROP
@given(data=datasets(), bad=NONFINITE, where=st.data())
def test_property_nonfinite_X(data, bad, where):
    model, X, y, _ = data
    i = where.draw(st.integers(0, X.shape[0] - 1))
    j = where.draw(st.integers(0, X.shape[1] - 1))
    X[i, j] = bad
    with pytest.raises(ValueError, match=names("X") + ".*NaN or infinite"):
        gpvi.fit(model, X, y, max_iter=1)


@PROP
@given(data=datasets(), bad=NONFINITE, where=st.data())
def test_property_nonfinite_y(data, bad, where):
    model, X, y, _ = data
    y[where.draw(st.integers(0, y.shape[0] - 1))] = bad
    with pytest.raises(ValueError, match=names("y") + ".*NaN or infinite"):
        gpvi.fit(model, X, y, max_iter=1)


@PROP
@given(data=datasets(BOUNDED), where=st.data())
def test_property_label_outside_support(data, where):
    model, X, y, lik = data
    bad = where.draw(LIKELIHOODS[lik][2])
    y[where.draw(st.integers(0, y.shape[0] - 1))] = bad
    with pytest.raises(ValueError, match=names("y") + ".*(support|levels)") as err:
        gpvi.fit(model, X, y, max_iter=1)
    assert not re.search(names("X"), str(err.value))


@PROP
@given(n=st.integers(2, 30), seed=st.integers(0, 2**32 - 1), zero_based=st.booleans(),
       where=st.data())
def test_property_bernoulli_mixed_codings(n, seed, zero_based, where):
    """A label of the other coding ({0, 1} vs {−1, +1}) is rejected, as long as a label that
    only exists in the first coding (0 or −1) remains."""
    g = np.random.default_rng(seed)
    y = g.choice([0.0, 1.0] if zero_based else [-1.0, 1.0], n)
    keep = where.draw(st.integers(0, n - 1))
    y[keep] = 0.0 if zero_based else -1.0
    i = where.draw(st.integers(0, n - 1).filter(lambda k: k != keep))
    y[i] = -1.0 if zero_based else 0.0
    with pytest.raises(ValueError, match=names("y") + ".*Bernoulli support"):
        gpvi.fit(sparse(Bernoulli(), inducing=1), g.normal(size=(n, 2)), y, max_iter=1)


@PROP
@given(data=datasets(), new_len=st.integers(0, 35))
def test_property_length_mismatch(data, new_len):
    model, X, y, _ = data
    assume(new_len != y.shape[0])
    y = np.resize(y, new_len)  # truncate, or extend by repeating valid labels
    with pytest.raises(ValueError, match=rf"{names('X')}.*{names('y')}.*lengths must match"):
        gpvi.fit(model, X, y, max_iter=1)


@PROP
@given(data=datasets(), arg=st.sampled_from(["offset", "exposure"]), where=st.data())
def test_property_bad_offset_exposure(data, arg, where):
    model, X, y, _ = data
    n = X.shape[0]
    value = np.ones(n)
    how = where.draw(st.sampled_from(["nonfinite", "length"] + (["sign"] if arg == "exposure" else [])))
    if how == "nonfinite":
        value[where.draw(st.integers(0, n - 1))] = where.draw(NONFINITE)
    elif how == "sign":
        value[where.draw(st.integers(0, n - 1))] = where.draw(st.floats(-1e6, 0.0))
    else:
        value = np.ones(where.draw(st.integers(0, 35).filter(lambda k: k != n)))
    with pytest.raises(ValueError, match=names(arg)):
        gpvi.fit(model, X, y, max_iter=1, **{arg: value})


@PROP
@given(data=datasets(), extra=st.integers(1, 10))
def test_property_too_many_inducing(data, extra):
    _, X, y, lik = data
    model = sparse(LIKELIHOODS[lik][0](), inducing=X.shape[0] + extra)
    with pytest.raises(ValueError, match=names("inducing") + ".*M ≤ N"):
        gpvi.fit(model, X, y, max_iter=1)


@PROP
@given(data=datasets(), cols=st.integers(1, 4), M=st.integers(1, 5))
def test_property_inducing_wrong_columns(data, cols, M):
    _, X, y, lik = data
    assume(cols != X.shape[1] and M <= X.shape[0])
    Z = np.zeros((M, cols))
    with pytest.raises(ValueError, match=names("inducing") + ".*columns"):
        gpvi.fit(sparse(LIKELIHOODS[lik][0](), inducing=Z), X, y, max_iter=1)


@PROP
@given(value=st.one_of(NONFINITE, FINITE), shape=st.sampled_from([(0, 2), (3, 0), (2, 2, 2), ()]))
def test_property_check_X_bad_shapes(value, shape):
    X = np.full(shape, value)
    with pytest.raises(ValueError, match=names("X")):
        check_X(X, "X")
