"""Parameters are checked where they are set (issue 14 §3, B1, B2, B3, B6).

Building a kernel, likelihood or model with a value outside its range raises a ``ValueError``
that names the parameter and the range; lists and tuples become arrays; ``fit`` checks its own
arguments and the size of the inputs before any work.  Checks must not get in JAX's way:
tracers, pytree placeholders and the hyperparameter optimiser's trial points pass unchecked.

Almost everything here runs in milliseconds; the few fits are ~20 rows with a handful of
iterations.
"""
import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import gpvi
from gpvi.engines import ENGINES
from gpvi import kernels as K
from gpvi import likelihoods as L
from gpvi._module import flatten_params, unflatten_params
from gpvi.models.base import X_ABS_MAX, check_X

FAST = settings(max_examples=60, deadline=None)


def names(arg):
    """Regex matching a message that names ``arg`` as a word."""
    return rf"(?<![\w.]){re.escape(arg)}(?![\w])"


STATIONARY = [K.RBF, K.Matern12, K.Matern32, K.Matern52]
# (builder, parameter name, shape) for every positive parameter of every built-in component.
POSITIVE = (
    [(cls, "variance", "scalar") for cls in STATIONARY + [K.Linear, K.Constant]]
    + [(cls, "lengthscale", "scalar_or_vector") for cls in STATIONARY]
    + [(L.Gaussian, "variance", "scalar"), (L.Laplace, "scale", "scalar"), (L.StudentT, "scale", "scalar"),
       (L.StudentT, "df", "scalar"), (lambda **kw: L.Ordinal(edges=[0.0, 1.0], **kw), "shape", "scalar"),
       (lambda **kw: gpvi.GLM(L.Gaussian(), **kw), "prior_variance", "scalar")]
)
POSITIVE_IDS = [f"{getattr(b, '__name__', 'built')}-{p}" for b, p, _ in POSITIVE]
REAL = [(lambda **kw: gpvi.GP(K.RBF(), L.Bernoulli(), **kw), "mean"),
        (lambda **kw: gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=3, **kw), "mean")]
LIKELIHOODS = [L.Gaussian, L.Bernoulli, L.Poisson, lambda **kw: L.Ordinal(edges=[0.0], **kw), L.Laplace,
               L.StudentT, L.Exponential, L.StochasticVolatility]

nonpositive = st.one_of(st.floats(max_value=0.0, allow_nan=False), st.just(math.nan), st.just(math.inf),
                        st.just(-math.inf), st.integers(max_value=0))
positive = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)


# ------------------------------------------------------------------------------------------
# positive parameters (variances, lengthscales, scales, df, prior variance)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build, name, shape", POSITIVE, ids=POSITIVE_IDS)
@FAST
@given(bad=nonpositive)
def test_nonpositive_parameter_rejected_at_construction(build, name, shape, bad):
    with pytest.raises(ValueError, match=names(name) + r".*finite number > 0"):
        build(**{name: bad})


@pytest.mark.parametrize("build, name, shape", POSITIVE, ids=POSITIVE_IDS)
@FAST
@given(good=positive)
def test_positive_parameter_accepted(build, name, shape, good):
    obj = build(**{name: good})
    assert float(getattr(obj, name)) == good


@pytest.mark.slow
@pytest.mark.parametrize("build, name, shape", POSITIVE, ids=POSITIVE_IDS)
@pytest.mark.parametrize("bad", ["1.0", True, None, 1 + 2j, [[1.0, 2.0]], np.ones((2, 2)), [], object()],
                         ids=["str", "bool", "None", "complex", "nested", "2d", "empty", "object"])
def test_non_numeric_or_misshapen_parameter_rejected(build, name, shape, bad):
    with pytest.raises(ValueError, match=names(name)):
        build(**{name: bad})


@pytest.mark.parametrize("build, name, shape", [p for p in POSITIVE if p[2] == "scalar"],
                         ids=[i for i, p in zip(POSITIVE_IDS, POSITIVE) if p[2] == "scalar"])
def test_scalar_parameter_rejects_vectors(build, name, shape):
    with pytest.raises(ValueError, match=names(name) + ".*number"):
        build(**{name: [1.0, 2.0]})


@pytest.mark.parametrize("build, name", REAL)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0", [0.0, 1.0]])
def test_real_parameter_must_be_a_finite_number(build, name, bad):
    with pytest.raises(ValueError, match=names(name) + ".*finite number"):
        build(**{name: bad})


@pytest.mark.parametrize("cls", STATIONARY)
@FAST
@given(ls=st.lists(positive, min_size=1, max_size=5), where=st.integers(0, 4), bad=nonpositive)
def test_ard_lengthscale_lists(cls, ls, where, bad):
    k = cls(lengthscale=ls)  # a list (or tuple) is stored as a float64 array
    assert isinstance(k.lengthscale, np.ndarray) and k.lengthscale.dtype == np.float64
    np.testing.assert_array_equal(k.lengthscale, ls)
    assert isinstance(cls(lengthscale=tuple(ls)).lengthscale, np.ndarray)
    ls[where % len(ls)] = bad
    with pytest.raises(ValueError, match=names("lengthscale")):
        cls(lengthscale=ls)


def test_negative_lengthscale_with_learning_is_rejected_before_fitting(monkeypatch):
    # B3: RBF(lengthscale=-1) used to fit with converged=True, a trace of [-inf] and "0 L-BFGS-B
    # iterations" (log(-1) = NaN in the optimiser's coordinates).
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    X = np.linspace(-1, 1, 20)[:, None]
    with pytest.raises(ValueError, match=names("lengthscale") + ".*> 0"):
        gpvi.fit(gpvi.GP(K.RBF(lengthscale=-1.0), L.Bernoulli()), X, (X[:, 0] > 0) * 1.0,
                 learn_hyperparameters=True)


@pytest.mark.parametrize("bad", [-1.0, 0.0, math.nan, math.inf])
def test_glm_prior_variance_is_a_value_error(bad):
    # B2: used to be AttributeError: 'GLM' object has no attribute 'jitter' (at fit time).
    with pytest.raises(ValueError, match=names("prior_variance") + ".*> 0"):
        gpvi.GLM(L.Gaussian(), prior_variance=bad)


def test_replace_checks_too():
    with pytest.raises(ValueError, match=names("variance")):
        K.RBF().replace(variance=-1.0)
    with pytest.raises(ValueError, match=names("variance")):
        L.Gaussian().with_parameters({"variance": 0.0})


# ------------------------------------------------------------------------------------------
# quadrature points, static settings, sub-modules, abstract bases
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", LIKELIHOODS)
@FAST
@given(bad=st.one_of(st.integers(max_value=1), st.integers(min_value=201), st.floats(allow_nan=True),
                     st.just(True), st.just("20"), st.none()))
def test_quadrature_points_out_of_range(build, bad):
    with pytest.raises(ValueError, match=names("quadrature_points") + r".*\[2, 200\]"):
        build(quadrature_points=bad)


@pytest.mark.parametrize("build", LIKELIHOODS)
@FAST
@given(n=st.integers(2, 200))
def test_quadrature_points_in_range(build, n):
    assert build(quadrature_points=n).quadrature_points == n
    assert build(quadrature_points=np.int64(n)).quadrature_points == n


@pytest.mark.parametrize("model", [gpvi.GP, lambda k, lik, **kw: gpvi.SparseGP(k, lik, inducing=3, **kw)])
@pytest.mark.parametrize("bad", [0.0, -1e-8, 2.0, math.nan, math.inf, True, "1e-8", None])
def test_jitter_range(model, bad):
    with pytest.raises(ValueError, match=names("jitter") + r".*\(0, 1\]"):
        model(K.RBF(), L.Bernoulli(), jitter=bad)


@pytest.mark.parametrize("bad", [True, False, 0, -3, 2.5, np.float64(3.0), "10", [[math.nan, 0.0]],
                                 [[1e200, 0.0]], np.zeros((0, 2))])
def test_sparse_inducing_must_be_a_positive_int_or_an_array(bad):
    with pytest.raises(ValueError, match=names("inducing")):
        gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=bad)


def test_sparse_inducing_accepted_forms():
    assert gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=3).inducing == 3
    assert gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=np.int64(3)).inducing == 3
    Z = gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=[[0.0, 1.0], [1.0, 0.0]]).inducing
    assert isinstance(Z, np.ndarray) and Z.shape == (2, 2)
    assert gpvi.SparseGP(K.RBF(), L.Bernoulli(), inducing=jnp.zeros((2, 2))).inducing.shape == (2, 2)


def test_submodule_types_are_checked():
    with pytest.raises(ValueError, match=names("kernel")):
        gpvi.GP(L.Gaussian(), L.Gaussian())
    with pytest.raises(ValueError, match=names("likelihood")):
        gpvi.SparseGP(K.RBF(), K.RBF(), inducing=3)
    with pytest.raises(ValueError, match=names("likelihood")):
        gpvi.GLM("gaussian")
    with pytest.raises(ValueError, match=names("kernels")):
        K.Sum(kernels=())
    with pytest.raises(ValueError, match=names("kernels")):
        K.Product(kernels=(K.RBF(), L.Gaussian()))
    assert isinstance(K.Sum(kernels=[K.RBF(), K.Linear()]).kernels, tuple)
    with pytest.raises(ValueError, match=names("link")):
        L.Bernoulli(link=["logit"])


@pytest.mark.parametrize("cls", [K.Kernel, K.Stationary, L.Likelihood, gpvi.models.Model])
def test_abstract_bases_cannot_be_built(cls):
    with pytest.raises(ValueError, match="abstract"):
        cls()


def test_user_subclass_post_init_does_not_skip_field_checks():
    class MyLik(L.Gaussian):
        def __post_init__(self):  # no super().__post_init__()
            pass

    with pytest.raises(ValueError, match=names("variance")):
        MyLik(variance=-1.0)
    assert float(MyLik(variance=2.0).variance) == 2.0


# ------------------------------------------------------------------------------------------
# Ordinal edges (B1)
# ------------------------------------------------------------------------------------------
@FAST
@given(steps=st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=6),
       start=st.floats(-10.0, 10.0), as_tuple=st.booleans())
def test_ordinal_edges_list_or_tuple_becomes_an_array(steps, start, as_tuple):
    edges = list(np.cumsum([start] + steps[:-1]))
    lik = L.Ordinal(edges=tuple(edges) if as_tuple else edges)
    assert isinstance(lik.edges, np.ndarray) and lik.edges.dtype == np.float64
    assert lik.num_levels == len(edges) + 1


@pytest.mark.parametrize("bad", [[0.5, -0.5], [0.0, 0.0], [0.0, math.nan], [-math.inf, 0.0], [], [[0.0, 1.0]],
                                 0.5, ["a", "b"]])
def test_ordinal_edges_must_be_finite_and_increasing(bad):
    with pytest.raises(ValueError, match=names("edges") + ".*increasing"):
        L.Ordinal(edges=bad)


@pytest.mark.slow
@pytest.mark.parametrize("edges", [[-0.5, 0.5], (-0.5, 0.5)], ids=["list", "tuple"])
def test_ordinal_fit_with_list_edges(edges):
    # B1: a list or tuple of edges made every fit fail with TracerArrayConversionError.
    X = np.linspace(-1.5, 1.5, 20)[:, None]
    y = np.digitize(X[:, 0], [-0.5, 0.5]).astype(float)
    res = gpvi.fit(gpvi.GP(K.RBF(), L.Ordinal(edges=edges)), X, y, max_iter=5)
    assert np.isfinite(res.vlb)
    assert res.predict_proba(X[:3]).shape == (3, 3)


# ------------------------------------------------------------------------------------------
# JAX: tracers, pytree placeholders and the optimiser's trial points are not checked
# ------------------------------------------------------------------------------------------
def _model():
    return gpvi.GP(K.RBF(variance=1.0, lengthscale=[1.0, 2.0]) + K.Linear(),
                   L.Ordinal(edges=[-1.0, 0.0, 1.0]), mean=0.5)


def test_pytree_round_trip_with_placeholder_leaves():
    m = _model()
    leaves, tree = jax.tree_util.tree_flatten(m)
    for fill in (None, object(), -1.0, jnp.nan):
        rebuilt = jax.tree_util.tree_unflatten(tree, [fill] * len(leaves))
        assert type(rebuilt) is type(m)
    same = jax.tree_util.tree_unflatten(tree, leaves)
    assert jax.tree_util.tree_structure(same) == tree
    flags = jax.tree.map(lambda x: bool(np.all(np.asarray(x) > 0)), m)  # bool leaves
    assert type(flags) is type(m)
    assert jax.eval_shape(lambda mm: mm.kernel(jnp.zeros((3, 2))), m).shape == (3, 3)


def test_tracers_pass_through_construction_and_jit():
    X = jnp.linspace(-1.0, 1.0, 5)[:, None]

    def f(log_ls, log_var):
        return jnp.sum(K.Matern32(variance=jnp.exp(log_var), lengthscale=jnp.exp(log_ls))(X))

    g = jax.jit(jax.grad(f, argnums=(0, 1)))(0.0, 0.0)
    assert all(np.isfinite(np.asarray(v)) for v in g)
    m = _model()
    out = jax.jit(lambda mm: mm.likelihood.edges * 2.0 + mm.kernel.kernels[0].lengthscale[0])(m)
    np.testing.assert_allclose(np.asarray(out), [-1.0, 1.0, 3.0])
    # the constructor itself under jit, with a negative value that only the trace sees
    assert float(jax.jit(lambda s: L.Gaussian(variance=s).variance)(-1.0)) == -1.0


def test_unflatten_params_accepts_overflowing_trial_points():
    m = _model()
    names_ = ["kernel.kernels.0.lengthscale", "kernel.kernels.0.variance", "likelihood.edges"]
    theta = flatten_params(m, names_)
    theta = {k: v + 1000.0 for k, v in theta.items()}  # exp(1001) = inf
    trial = unflatten_params(m, theta)
    assert not np.all(np.isfinite(np.asarray(trial.kernel.kernels[0].lengthscale)))


# ------------------------------------------------------------------------------------------
# fit arguments
# ------------------------------------------------------------------------------------------
def _no_engine(objective, state, *, tol, max_iter, callback=None, on_state=None, **kwargs):
    raise AssertionError("the engine ran: fit's arguments should have been rejected first")


@pytest.fixture
def data():
    X = np.linspace(-2.0, 2.0, 20)[:, None]
    return X, (X[:, 0] > 0).astype(float)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10", None])
def test_max_rounds(bad, data, monkeypatch):
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    with pytest.raises(ValueError, match=names("max_rounds") + ".*≥ 1"):
        gpvi.fit(gpvi.GP(K.RBF(), L.Bernoulli()), *data, learn_hyperparameters=True, max_rounds=bad)


@pytest.mark.parametrize("bad", ["kernel.nope", ["kernel.variance", 3], [None], 5, ["kernel"]])
def test_learn_hyperparameters_rejected_before_any_work(bad, data, monkeypatch):
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    with pytest.raises(ValueError, match=names("learn_hyperparameters")):
        gpvi.fit(gpvi.GP(K.RBF(), L.Bernoulli()), *data, learn_hyperparameters=bad)


def test_learn_inducing_must_be_a_bool(data, monkeypatch):
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    with pytest.raises(ValueError, match=names("learn_inducing")):
        gpvi.fit(gpvi.GP(K.RBF(), L.Bernoulli()), *data, learn_inducing="yes")


def test_learn_hyperparameters_single_name(data):
    model = gpvi.GP(K.RBF(variance=1.0, lengthscale=1.0), L.Bernoulli())
    res = gpvi.fit(model, *data, learn_hyperparameters="kernel.variance", max_rounds=3, max_iter=50)
    assert float(res.model.kernel.lengthscale) == 1.0
    assert float(res.model.kernel.variance) != 1.0
    assert res.hyperparameter_rounds >= 1


# ------------------------------------------------------------------------------------------
# inputs too large for the kernel (B6) and pandas nullable integers
# ------------------------------------------------------------------------------------------
@FAST
@given(D=st.integers(1, 4), col=st.integers(0, 3), row=st.integers(0, 19),
       big=st.floats(min_value=X_ABS_MAX * 1.0001, max_value=1.7e308), sign=st.sampled_from([-1.0, 1.0]))
def test_overflowing_inputs_are_rejected_by_column(D, col, row, big, sign):
    X = np.random.default_rng(0).normal(size=(20, D))
    col %= D
    X[row, col] = sign * big
    with pytest.raises(ValueError, match=rf"X column {col} \(X\[:, {col}\]\) has values up to .*1e\+150"):
        check_X(X)


@FAST
@given(scale=st.floats(min_value=-X_ABS_MAX, max_value=X_ABS_MAX))
def test_inputs_up_to_the_bound_are_accepted(scale):
    X = np.array([[0.0, scale], [1.0, -scale]])
    np.testing.assert_array_equal(check_X(X), X)


@pytest.mark.parametrize("model", ["gp", "sparse", "glm"])
def test_fit_rejects_overflowing_column_before_any_work(model, monkeypatch):
    # B6: a column near 1e307 ran the whole fit (k-means included) and then failed with a NumPy
    # overflow warning.
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    X = np.c_[np.linspace(-1, 1, 20), np.ones(20), np.linspace(0, 1e307, 20)]
    y = (X[:, 0] > 0).astype(float)
    lik = L.Bernoulli()
    mdl = {"gp": gpvi.GP(K.RBF(), lik), "sparse": gpvi.SparseGP(K.RBF(), lik, inducing=5),
           "glm": gpvi.GLM(lik)}[model]
    with pytest.raises(ValueError, match=r"X column 2 .*up to 1e\+307.*rescale"):
        gpvi.fit(mdl, X, y)


def test_overflowing_dataframe_column_named_by_label(monkeypatch):
    monkeypatch.setitem(ENGINES, "fpi", dataclasses.replace(ENGINES["fpi"], run=_no_engine))
    df = pd.DataFrame({"age": np.arange(20.0), "income": np.full(20, 1e200)})
    with pytest.raises(ValueError, match="X column 'income' has values up to 1e\\+200"):
        gpvi.fit(gpvi.GP(K.RBF(), L.Bernoulli()), df, np.arange(20) % 2)
    with pytest.raises(ValueError, match="X column 'income'"):
        gpvi.GPClassifier().fit(df, np.arange(20) % 2)


def _int64_frame(n=20):
    return pd.DataFrame({"a": pd.array(np.arange(n) % 7, dtype="Int64"), "b": np.linspace(-1, 1, n)})


def test_nullable_int_column_is_numeric():
    df = _int64_frame()
    X = check_X(df)
    assert X.dtype == np.float64
    np.testing.assert_array_equal(X, df.astype(float).to_numpy())
    np.testing.assert_array_equal(check_X(df["a"]), np.arange(20.0)[:, None] % 7)


def test_nullable_int_column_with_missing_value_is_named():
    df = _int64_frame()
    df.loc[4, "a"] = pd.NA
    with pytest.raises(ValueError, match=r"X column 'a' has 1 missing value.*row 4"):
        check_X(df)
    with pytest.raises(ValueError, match=r"X column 'a' has 1 missing value"):
        gpvi.GPRegressor(learn_hyperparameters=False).fit(df, np.arange(20.0))


def test_nullable_int_frame_fits_like_float_frame():
    df = _int64_frame()
    y = np.sin(np.arange(20.0))
    lik = L.Gaussian(variance=0.1)
    a = gpvi.fit(gpvi.GP(K.RBF(), lik), df, y, max_iter=3)
    b = gpvi.fit(gpvi.GP(K.RBF(), lik), df.astype(float), y, max_iter=3)
    assert a.vlb == b.vlb
    est = gpvi.GPRegressor(learn_hyperparameters=False, max_iter=3).fit(df, y)
    np.testing.assert_allclose(est.predict(df), gpvi.GPRegressor(learn_hyperparameters=False, max_iter=3)
                               .fit(df.astype(float), y).predict(df.astype(float)))


@pytest.mark.parametrize("duplicates", [False, True])
def test_relative_jitter_from_the_prior_cache_is_the_jitter_used(duplicates):
    """The jitter a full GP reports from its prior cache (read off the factor) is the one a fresh
    factorisation of K(X, X) finds: the starting 1e-8 for distinct rows, a larger power of ten
    where repeated rows make K singular and the starting jitter (1e-15) is below rounding."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    if duplicates:
        X = np.concatenate([X, X, X])
    start = 1e-15 if duplicates else 1e-8
    model = gpvi.GP(gpvi.kernels.RBF(variance=3.0, lengthscale=4.0), gpvi.likelihoods.Bernoulli(), jitter=start)
    cache = model.prior_cache(jnp.asarray(X))
    got, fresh = model.relative_jitter(cache), model.relative_jitter(None, X)
    assert got == fresh
    assert (got > start) if duplicates else (got == start)
