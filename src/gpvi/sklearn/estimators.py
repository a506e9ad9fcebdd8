"""scikit-learn estimators on top of :func:`gpvi.fit`.

- :class:`GPClassifier`: Bernoulli likelihood (logit or probit) for two classes, softmax on one
  latent GP per class for more; ``predict``
  gives the most probable class, ``predict_proba`` the class probabilities.
- :class:`GPRegressor`: Gaussian, Laplace, Student-t, warped or heteroscedastic (input-dependent)
  noise; ``predict`` gives the predictive mean (and standard deviation).
- :class:`GPCountRegressor`: Poisson likelihood with a log link and optional exposure;
  ``predict`` gives the expected count (and standard deviation).
- :class:`GPOrdinalRegressor`: cumulative-logit ordinal likelihood with learned bin edges;
  ``predict`` gives the most probable level, ``predict_proba`` the level probabilities.  The
  order of the levels comes from ``levels=``, an ordered pandas Categorical ``y`` or numeric
  labels; string labels without one are refused.

Each estimator fits a full GP when the training set has at most ``full_max`` rows and a
sparse GP with ``inducing`` k-means inducing inputs otherwise (``model="auto"``; force
either with ``model="full"`` or ``"sparse"``).  Inputs are NumPy arrays or pandas
DataFrames (column names are recorded in ``feature_names_in_`` and checked at predict time),
optionally standardised (``standardize=True``, the default).  The default kernel is an RBF
with one lengthscale per feature (ARD); kernel variance, lengthscales, the constant prior mean
and the likelihood's parameters are learned by maximising the variational lower bound
(``learn_hyperparameters=True``), for likelihoods other than Gaussian in two stages: first one
lengthscale shared by all features, started at the median distance between training rows, then
one per feature from there.  With a Gaussian likelihood the bound is the closed-form collapsed
bound (:mod:`gpvi.fitting.collapsed`).  These defaults (model kind, inducing inputs, kernel,
standardisation, starting values, the two stages) are :mod:`gpvi.fitting.defaults`, which
``gpvi fit`` uses too: the same data give the same model through either front end.

After ``fit`` every estimator exposes ``fit_result_`` (the :class:`gpvi.FitResult`; ``print`` it
for a summary), ``kernel_`` and ``likelihood_`` (the learned kernel and likelihood), ``vlb_``
(final bound, nats) and ``vlb_trace_`` ((K, 2) array of (seconds, VLB) per iteration).  These
fitted attributes do not exist before ``fit`` (scikit-learn's ``check_is_fitted`` convention)
and are read off ``fit_result_``, so a loaded estimator has them too.
:meth:`GPRegressor.predict` also gives the predictive covariance (``return_cov=True``) and
:meth:`GPRegressor.sample_y` joint draws, as scikit-learn's ``GaussianProcessRegressor``.
Fitted estimators are saved and loaded without pickle by :func:`gpvi.io.save` /
:func:`gpvi.io.load`.

``GPOrdinalRegressor`` predicts labels, so it follows scikit-learn's *classifier*
conventions (``classes_``, ``predict_proba``, ``score`` = accuracy, stratified
cross-validation); use :func:`gpvi.metrics` for the mean absolute error.
"""
from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from gpvi.fitting.codec import decode, encode, fit_result_from_arrays, fit_result_to_arrays
from gpvi.fitting import defaults as _defaults
from gpvi.sklearn import damping as _damping
from gpvi import kernels
from gpvi import likelihoods, priors
from gpvi.likelihoods.warped import Warped
from gpvi.likelihoods.scalar import QuasiPoisson
from gpvi.fitting.fit import fit as _fit
from gpvi.fitting.problem import check_offset as _check_offset
from gpvi.models.base import pandas_to_array, check_input_range

__all__ = ["GPClassifier", "GPRegressor", "GPCountRegressor", "GPOrdinalRegressor"]

_MODELS = ("auto", "full", "sparse")




def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _bucket(n):
    """Row count that predictions are padded to, so that few shapes are ever compiled."""
    if n <= 2048:
        return max(16, 1 << (int(n) - 1).bit_length())
    return -(-n // 2048) * 2048


def _log_exposure(exposure, n):
    """``log(exposure)`` as an (n,) offset, or None."""
    if exposure is None:
        return None
    expo = _check_offset(exposure, n, "exposure")
    if np.any(expo <= 0):
        raise ValueError("exposure must be positive")
    return np.log(expo)


def _json_value(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _encode_labels(a):
    """1-D array of labels → JSON spec (object arrays as lists, others as .npy)."""
    a = np.asarray(a)
    if a.dtype == object:
        items = [_json_value(v) for v in a.tolist()]
        if not all(isinstance(v, (str, int, float, bool)) or v is None for v in items):
            raise ValueError("cannot save labels that are not strings, numbers or booleans")
        return {"list": items}, None
    if a.dtype.kind not in "biufUS":
        raise ValueError(f"cannot save labels of dtype {a.dtype}")
    return {"array": True}, a


def _decode_labels(spec, array):
    if "list" in spec:
        out = np.empty(len(spec["list"]), dtype=object)
        out[:] = spec["list"]
        return out
    return np.asarray(array)


def _encode_levels(levels, arrays):
    """The ``levels`` parameter → JSON spec (its labels as :func:`_encode_labels` writes them,
    and whether it was a list, a tuple or an array, so that it is rebuilt as it was given)."""
    kind = "array" if isinstance(levels, np.ndarray) else "tuple" if isinstance(levels, tuple) else "list"
    if kind == "array":
        spec, arr = _encode_labels(levels)
    else:
        spec, arr = _encode_labels(_object_array(list(levels)))
    if arr is not None:
        arrays["params.levels"] = arr
    return {"labels": spec, "type": kind}


def _decode_levels(spec, arrays):
    labels = _decode_labels(spec["labels"], arrays.get("params.levels"))
    kind = spec["type"]
    if kind == "array":
        return labels
    if kind in ("list", "tuple"):
        return labels.tolist() if kind == "list" else tuple(labels.tolist())
    raise ValueError(f"unknown levels type {kind!r}")


def _object_array(items):
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _label_array(items, y):
    """The labels ``items`` (in that order) as a 1-D array: NumPy's own dtype for numbers or
    strings when ``y``'s labels are not Python objects and NumPy keeps every label as it is;
    an object array otherwise (so that predictions are labels of y's kind)."""
    if y.dtype != object:
        try:
            arr = np.asarray(items)
        except (TypeError, ValueError):
            arr = None
        if (arr is not None and arr.shape == (len(items),) and arr.dtype.kind in "biufUS"
                and arr.tolist() == list(items)):
            return arr
    return _object_array(items)


def _first_ones(values, k=10):
    """The first ``k`` distinct values of a list, in order of appearance."""
    return list(dict.fromkeys(values))[:k]


def _label_codes(y, index):
    """Codes of the labels of the 1-D array ``y`` under ``index`` ({label: code}); −1 for a
    label that is not in ``index``.  Works for labels in any order (not only sorted ones)."""
    try:
        uniq, inverse = np.unique(y, return_inverse=True)
    except TypeError:  # labels of kinds that do not sort together
        return np.array([index.get(v, -1) for v in y.tolist()], dtype=np.int64)
    lookup = np.array([index.get(u, -1) for u in uniq.tolist()], dtype=np.int64)
    return lookup[np.asarray(inverse).reshape(-1)]


def _ordered_categories(y):
    """The categories of an ordered pandas Categorical (or of a Series with an ordered
    categorical dtype), lowest first, as a list; None for anything else."""
    dtype = getattr(y, "dtype", None)
    if getattr(dtype, "name", None) != "category" or getattr(dtype, "ordered", None) is not True:
        return None
    return list(dtype.categories.tolist())


class _GPEstimator(BaseEstimator):
    """Shared logic of the gpvi estimators (not public).

    Subclasses set ``_fitted_arrays`` (extra fitted array attributes to save) and implement
    ``_prepare_targets`` (validate and encode ``y``; set label or scaling attributes) and
    ``_likelihood`` (the likelihood and the prior mean to start from).
    """

    _fitted_arrays: tuple = ()

    # ---- parameters ------------------------------------------------------------------------
    def _check_params(self):
        if self.model not in _MODELS:
            raise ValueError(f"model must be one of {_MODELS}, got {self.model!r}")
        for name in ("full_max", "inducing", "max_iter", "max_rounds"):
            v = getattr(self, name)
            if not _is_int(v) or v < (0 if name == "full_max" else 1):
                raise ValueError(f"{name} must be a {'non-negative' if name == 'full_max' else 'positive'} "
                                 f"int, got {v!r}")
        if not isinstance(self.standardize, (bool, np.bool_)):
            raise ValueError(f"standardize must be True or False, got {self.standardize!r}")
        lh = self.learn_hyperparameters
        if not (isinstance(lh, (bool, np.bool_)) or
                isinstance(lh, (list, tuple)) and all(isinstance(n, str) for n in lh)):
            raise ValueError("learn_hyperparameters must be True, False or a list of parameter names, "
                             f"got {lh!r}")
        _defaults.check_hyperprior_spec(self.hyperprior)
        if not isinstance(self.tol, numbers.Real) or not self.tol > 0:
            raise ValueError(f"tol must be a positive number, got {self.tol!r}")
        if self.kernel is not None and not isinstance(self.kernel, kernels.Kernel) and not (
                getattr(self, "_multi_kernel", False) and isinstance(self.kernel, (list, tuple)) and self.kernel
                and all(isinstance(k, kernels.Kernel) for k in self.kernel)):
            raise ValueError(f"kernel must be None or a gpvi kernel, got {type(self.kernel).__name__}")

    # ---- fitting ---------------------------------------------------------------------------
    def _validate_X(self, X, reset):
        # C order: a DataFrame (column-major) and an array give bit-identical results.
        pandas_to_array(X, "X")  # a missing value in a nullable (Int64, …) column, by name
        X = validate_data(self, X, reset=reset, dtype=np.float64, order="C")
        check_input_range(X, "X", self._feature_labels())
        return X

    def _feature_labels(self):
        names = getattr(self, "feature_names_in_", None)
        return None if names is None else list(names)

    def _fit(self, X, y, exposure=None, _kind=None):
        self._check_params()
        pandas_to_array(X, "X")
        X, y = validate_data(self, X, y, dtype=np.float64, order="C", y_numeric=self._y_numeric)
        check_input_range(X, "X", self._feature_labels())
        offset = _log_exposure(exposure, X.shape[0])
        y_int = self._prepare_targets(y)
        n, D = X.shape
        if self.standardize:
            self.x_mean_, self.x_scale_ = _defaults.standardise_inputs(X)
        else:
            self.x_mean_ = np.zeros(D)
            self.x_scale_ = np.ones(D)
        Xs = (X - self.x_mean_) / self.x_scale_
        likelihood, mean0 = self._likelihood(y_int, offset)
        # The default model and fit that gpvi fit also builds (gpvi.fitting.defaults): ARD RBF at
        # the median distance, learned isotropic first unless the likelihood is Gaussian.
        two_stage = _defaults.uses_two_stages(likelihood, D, default_kernel=self.kernel is None,
                                              learn_all=self.learn_hyperparameters is True)
        kind = _defaults.model_kind(n, likelihood, self.model if _kind is None else _kind, self.full_max)
        M = _defaults.inducing_count(Xs, self.inducing) if kind == "sparse" else None
        model = _defaults.build_model(kind, likelihood, mean0, Xs, kernel=self.kernel, inducing=M)
        learn = self.learn_hyperparameters
        if isinstance(learn, (bool, np.bool_)):
            learn = _defaults.learned_parameters(model) if learn else False
        else:
            learn = list(learn)
        rs = self.random_state
        seed = rs if _is_int(rs) else int(check_random_state(rs).randint(2**31 - 1))
        hyperprior = _defaults.hyperprior(self.hyperprior, model, likelihood, D, engine=self.engine, learn=learn,
                                          standardised=self.standardize)
        # damped: damped fixed-point steps over the whole fit (hyperparameter search included)
        self.fit_result_, damped = _defaults.fit_default(
            model, Xs, y_int, fit=_fit, learn=learn, two_stage=two_stage, engine=self.engine, tol=float(self.tol),
            max_iter=self.max_iter, max_rounds=self.max_rounds, offset=offset, seed=seed, hyperprior=hyperprior)
        self.model_kind_ = kind
        self.n_iter_ = max(1, int(self.fit_result_.iterations))
        self.n_damped_steps_ = damped
        _damping.warn_if_dominated(self.fit_result_, stacklevel=4)
        return self

    def partial_fit(self, X, y, exposure=None):
        """Online learning: update the fit by a batch of rows.

        The first call (on an unfitted estimator) is :meth:`fit` on that batch with a sparse GP
        (its standardisation, labels, inducing inputs and learned hyperparameters are then kept).
        Every later call, or a call after :meth:`fit`, updates the posterior over the inducing
        values by the new rows with the hyperparameters fixed (:func:`gpvi.fitting.stream.update`:
        assumed-density steps; exact for Gaussian noise); a full GP fitted by :meth:`fit` first
        becomes the sparse GP with its training inputs as inducing inputs (the same posterior).
        ``exposure`` is for :class:`GPCountRegressor` only.
        """
        if not hasattr(self, "fit_result_"):
            args = (X, y) if exposure is None else (X, y, exposure)
            return self._fit(*args, _kind="sparse")
        from gpvi.fitting.stream import update

        X = self._validate_X(X, reset=False)
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(f"y must have one entry per row of X ({X.shape[0]}), got shape {y.shape}")
        offset = _log_exposure(exposure, X.shape[0])
        if self.model_kind_ == "full":
            # the full GP's posterior is that of a sparse GP with the training inputs as inducing inputs
            from gpvi.fitting.stream import as_sparse

            self.fit_result_ = as_sparse(self.fit_result_)
            self.model_kind_ = "sparse"
        Xs = (X - self.x_mean_) / self.x_scale_
        self.fit_result_ = update(self.fit_result_, Xs, self._encode_more(y), offset)
        return self

    def _encode_more(self, y):
        """Targets of a later ``partial_fit`` batch, coded as the first batch's were."""
        return self._prepare_targets(y)

    @property
    def vlb_(self):
        """Final variational lower bound of the fit (nats, summed over the training data)."""
        check_is_fitted(self, "fit_result_")
        return float(self.fit_result_.vlb)

    @property
    def kernel_(self):
        """The learned kernel (a :class:`gpvi.kernels.Kernel`, on the standardised inputs when
        ``standardize=True``): ``fit_result_.model.kernel``.  For a model with several latent
        functions (:class:`GPClassifier` with more than two classes: one latent GP per class) a
        list of the C kernels, in ``classes_`` order (they may differ: each class learns its own)."""
        check_is_fitted(self, "fit_result_")
        model = self.fit_result_.model
        lats = getattr(model, "latents", None)
        if lats is not None:
            return [lat.kernel for lat in lats]
        return model.kernel

    @property
    def likelihood_(self):
        """The learned likelihood (a :class:`gpvi.likelihoods.Likelihood`, on the standardised
        targets for :class:`GPRegressor` with ``standardize=True``): ``fit_result_.model.likelihood``."""
        check_is_fitted(self, "fit_result_")
        return self.fit_result_.model.likelihood

    @property
    def vlb_trace_(self):
        """(K, 2) array of (seconds since the start of the fit, VLB) for every iteration."""
        check_is_fitted(self, "fit_result_")
        return self.fit_result_.trace

    # ---- prediction ------------------------------------------------------------------------
    def _call(self, method, X, exposure=None):
        """``fit_result_.<method>`` on validated, standardised X (padded to a bucketed row count,
        so that predicting on many batch sizes compiles few shapes); outputs sliced back."""
        check_is_fitted(self, "fit_result_")
        X = self._validate_X(X, reset=False)
        n = X.shape[0]
        offset = _log_exposure(exposure, n)
        Xs = (X - self.x_mean_) / self.x_scale_
        pad = _bucket(n) - n
        if pad:
            Xs = np.concatenate([Xs, np.repeat(Xs[:1], pad, axis=0)])
            if offset is not None:
                offset = np.concatenate([offset, np.zeros(pad)])
        out = getattr(self.fit_result_, method)(Xs, offset=offset)
        if isinstance(out, tuple):
            return tuple(np.asarray(o)[:n] for o in out)
        return np.asarray(out)[:n]

    # ---- files -----------------------------------------------------------------------------
    def _to_gpvi_file(self):
        """(meta, arrays) for :func:`gpvi.io.save`: parameters, fitted attributes, FitResult."""
        check_is_fitted(self, "fit_result_")
        arrays = {}
        params = {}
        for k, v in self.get_params(deep=False).items():
            if k == "kernel":
                params[k] = None if v is None else encode(v, arrays, "params.kernel")
            elif k == "random_state":
                params[k] = _json_value(v) if _is_int(v) else None  # generators are not saved
            elif k == "learn_hyperparameters" and isinstance(v, (list, tuple)):
                params[k] = [str(s) for s in v]
            elif k == "levels" and v is not None:
                params[k] = _encode_levels(v, arrays)
            elif k == "hyperprior" and isinstance(v, dict):
                params[k] = priors.to_json(v)
            else:
                params[k] = _json_value(v)
        fitted = {"n_features_in_": int(self.n_features_in_), "n_iter_": int(self.n_iter_),
                  "n_damped_steps_": int(self.n_damped_steps_),
                  "model_kind_": self.model_kind_, "labels": {}}
        for name in ("x_mean_", "x_scale_") + self._fitted_arrays:
            arrays[f"fitted.{name}"] = np.asarray(getattr(self, name))
        for name in ("classes_", "feature_names_in_"):
            if hasattr(self, name):
                spec, arr = _encode_labels(getattr(self, name))
                if arr is not None:
                    arrays[f"fitted.{name}"] = arr
                fitted["labels"][name] = spec
        fit_meta, fit_arrays = fit_result_to_arrays(self.fit_result_, "fit")
        arrays.update(fit_arrays)
        return {"params": params, "fitted": fitted, "fit": fit_meta}, arrays

    @classmethod
    def _from_gpvi_file(cls, meta, arrays):
        """Rebuild a fitted estimator from what :meth:`_to_gpvi_file` wrote."""
        params = dict(meta["params"])
        if params.get("kernel") is not None:
            params["kernel"] = decode(params["kernel"], arrays)
        if isinstance(params.get("learn_hyperparameters"), list):
            params["learn_hyperparameters"] = list(params["learn_hyperparameters"])
        if params.get("levels") is not None:
            params["levels"] = _decode_levels(params["levels"], arrays)
        if isinstance(params.get("hyperprior"), dict):
            params["hyperprior"] = priors.from_json(params["hyperprior"])
        est = cls(**params)
        fitted = meta["fitted"]
        est.n_features_in_ = fitted["n_features_in_"]
        est.n_iter_ = fitted["n_iter_"]
        est.model_kind_ = fitted["model_kind_"]
        for name in ("x_mean_", "x_scale_") + cls._fitted_arrays:
            setattr(est, name, np.asarray(arrays[f"fitted.{name}"]))
        for name, spec in fitted["labels"].items():
            if name not in ("classes_", "feature_names_in_"):
                raise KeyError(name)
            setattr(est, name, _decode_labels(spec, arrays.get(f"fitted.{name}")))
        est.fit_result_ = fit_result_from_arrays(meta["fit"], arrays, "fit")
        est.n_damped_steps_ = int(fitted.get("n_damped_steps_", est.fit_result_.backtracks))
        return est


_COMMON_DOC = """
    kernel : gpvi kernel or None
        Covariance function on the (standardised) inputs.  None (default): an RBF kernel
        with one lengthscale per feature (ARD), started at variance 1 and lengthscales equal to
        the median distance between training rows (on at most 1 000 rows).  When all
        hyperparameters are learned (``learn_hyperparameters=True``), there are several
        features and the likelihood is not Gaussian, one shared (isotropic) lengthscale is
        learned first — a few parameters, a few
        L-BFGS-B rounds, a sensible start in any dimension — and the ARD search continues from
        its optimum and variational state for at most 30 rounds (``max_rounds`` if smaller).
        The argument is never modified; the learned kernel is in ``fit_result_.model.kernel``.
    model : {"auto", "full", "sparse"}
        ``"auto"``: a full GP when the training set has at most ``full_max`` rows, a sparse
        GP otherwise.
    full_max : int, default 1000 for GPRegressor, 500 for the others
        Largest training set fitted by a full GP under ``model="auto"``.  With Gaussian noise
        the hyperparameters are learned on the closed-form collapsed bound and a full GP of
        1 000 rows is cheap; for other likelihoods every evaluation runs the engine on an
        N×N problem: on 1 000 rows × 60 features (musk, logistic) the full GP took 363 s
        and the sparse one (M = 200) 40 s, test error 0.055 against 0.068.
    inducing : int, default 200
        Number of inducing inputs of a sparse GP (k-means centres of the standardised
        inputs), capped at the number of distinct training rows.
    engine : {"fpi", "fpb", "gradient", "jj", "taylor", "jj-hybrid", "jj-full"}
        Variational inference engine (see :func:`gpvi.fit`); the last four (Izmailov & Kropotov
        2017) only for the classifier with the logit link.
    learn_hyperparameters : bool or list of str
        True: learn the kernel parameters, the constant prior mean and the likelihood's
        parameters by maximising the bound; False: keep their starting values; or a list of
        dotted names as in :func:`gpvi.fit`.
    standardize : bool, default True
        Centre and scale every input column to unit variance before fitting (constant
        columns are only centred).
    tol, max_iter : convergence tolerance (relative change of the bound) and iteration
        limit of each engine run.
    max_rounds : int, default 100
        Iteration limit of the hyperparameter optimiser (L-BFGS-B).
    random_state : int, RandomState or None
        Seeds the k-means placement of inducing inputs.
    hyperprior : "weak" (default), "none"/None, or a dict of parameter name -> prior
        "weak": weakly informative log-normal priors on the kernel variance (median 1) and
        lengthscales (median √D) and, for regression, the noise (median 0.1 of the
        standardised targets), :func:`gpvi.priors.weak`; the search maximises bound + log
        prior, which keeps nearly separable data from sending the variance and lengthscales
        off (breast cancer, median of 3 splits: variance 1 096 → 62, lengthscales up to 2e7 →
        15, damped steps 767 → 142 in all, test NLPD 0.143 → 0.111; ``benchmarks/hyperprior.py``).  Applies when the inputs
        are standardised and the engine learns by the profile search (fpi, fpb, gradient, …);
        the jj engines learn without it.  "none": maximum likelihood-II, as ``gpvi.fit``
        does by default.  A dict: your own priors (:mod:`gpvi.priors`)."""

_FITTED_DOC = """
    fit_result_ : gpvi.FitResult (``print(est.fit_result_)`` shows its summary)
    kernel_ : the learned gpvi kernel (on the standardised inputs when ``standardize=True``); a
        list of one kernel per class for a multiclass (softmax) :class:`GPClassifier`
    likelihood_ : the learned gpvi likelihood
    vlb_ : float, final variational lower bound (nats; the bound alone, without the hyperprior's
        log density)
    vlb_trace_ : (K, 2) array of (seconds, VLB) per iteration
    n_iter_ : int, engine iterations of the final run (counted as 1 when a warm-started final
        run after hyperparameter learning stops at once)
    n_damped_steps_ : int, damped (VLB-lowering, rejected) fixed-point steps over the whole fit,
        hyperparameter search included; a :class:`gpvi.sklearn.damping.DampingWarning` is raised when
        they were at least 25 % of the passes over the data (and at least 50)
    model_kind_ : "full" or "sparse"
    n_features_in_, feature_names_in_ : number and (for DataFrames) names of the input columns
    x_mean_, x_scale_ : (D,) arrays used to standardise the inputs (0 and 1 when
        ``standardize=False``)"""


# ------------------------------------------------------------------------------------------
class _LabelEstimator(_GPEstimator):
    """Shared logic of the estimators that predict labels from ``classes_``."""

    _y_numeric = False

    def _encode_classes(self, y):
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__} needs at least two classes in y, but y has only one "
                             f"class ({self.classes_[0]!r})")
        return codes.astype(np.float64)

    def partial_fit(self, X, y, classes=None):
        """Online learning (see :meth:`_GPEstimator.partial_fit`).  ``classes`` (scikit-learn's
        convention) lists every label, in any order; the first batch must contain all of them
        (for :class:`GPOrdinalRegressor` with ``levels``: they must be the levels)."""
        if classes is not None:
            classes = np.unique(np.asarray(classes))
            if hasattr(self, "fit_result_"):
                known = self.classes_
                if set(classes.tolist()) != set(known.tolist()):
                    raise ValueError(f"classes {classes.tolist()} differ from the fitted classes {known.tolist()}")
            else:
                self._check_first_batch_classes(classes, y)
        return super().partial_fit(X, y)

    def _check_first_batch_classes(self, classes, y):
        """``classes`` (sorted, unique) are the classes the first ``partial_fit`` batch ``y`` fits."""
        have = np.unique(np.asarray(y))
        if set(have.tolist()) != set(classes.tolist()):
            raise ValueError(f"the first partial_fit batch must contain every class in classes "
                             f"({classes.tolist()}); it has {have.tolist()}")

    def _encode_more(self, y):
        """Codes of later labels: the position of each label in ``classes_`` (in whatever order
        ``classes_`` is)."""
        y = np.asarray(y)
        index = {label: k for k, label in enumerate(self.classes_.tolist())}
        codes = _label_codes(y, index)
        bad = codes < 0
        if np.any(bad):
            raise ValueError(f"y has labels {_first_ones(y[bad].tolist(), 5)} not seen in the first batch "
                             f"(classes {self.classes_.tolist()})")
        return codes.astype(np.float64)

    def predict_proba(self, X):
        """Class probabilities, shape (n_samples, n_classes), columns in ``classes_`` order."""
        return self._call("predict_proba", X)

    def predict(self, X):
        """The most probable label of each row of ``X`` (n_samples, n_features): (n_samples,)."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]


class GPClassifier(ClassifierMixin, _LabelEstimator):
    __doc__ = """Gaussian-process classifier fitted by variational inference.

    Two classes: a Bernoulli likelihood with a logit or probit link on a latent GP; the prior
    mean starts at the link of the base rate of the second class.  C > 2 classes: the softmax
    likelihood on C latent GPs (:class:`gpvi.likelihoods.softmax.Softmax`, Nguyen & Bonilla 2014), each
    with its own kernel (``kernel`` may be a list of C kernels; one kernel is used for every
    class), hyperparameters and prior mean (started at the log base rate of its class); engines
    ``"fpi"`` or ``"gradient"``.

    Parameters
    ----------""" + _COMMON_DOC + """
    link : {"logit", "probit"}, default "logit"
        Link of the binary model (ignored with more than two classes).

    Attributes
    ----------
    classes_ : (C,) array of the class labels, sorted""" + _FITTED_DOC + """
    """

    _multi_kernel = True

    def __init__(self, kernel=None, *, model="auto", full_max=_defaults.FULL_MAX, inducing=_defaults.INDUCING,
                 engine="fpi", learn_hyperparameters=True, standardize=True, tol=1e-6, max_iter=500, max_rounds=100,
                 random_state=0, link="logit", hyperprior="weak"):
        self.kernel = kernel
        self.model = model
        self.full_max = full_max
        self.inducing = inducing
        self.engine = engine
        self.learn_hyperparameters = learn_hyperparameters
        self.standardize = standardize
        self.tol = tol
        self.max_iter = max_iter
        self.max_rounds = max_rounds
        self.random_state = random_state
        self.hyperprior = hyperprior
        self.link = link

    def _prepare_targets(self, y):
        check_classification_targets(y)
        kind = type_of_target(y, input_name="y", raise_unknown=True)
        if kind not in ("binary", "multiclass"):
            raise ValueError(f"y must hold binary or multiclass labels, got a target of type {kind}")
        return self._encode_classes(y)

    def _likelihood(self, y, offset):
        C = len(self.classes_)
        if C > 2:
            return _defaults.likelihood_start("softmax", y, levels=C)
        return _defaults.likelihood_start("bernoulli", y, link=self.link)

    def partial_fit(self, X, y, classes=None):
        """Online learning (see :meth:`_GPEstimator.partial_fit`).  ``classes`` (scikit-learn's
        convention) lists every label, in any order; it is needed on the first call only, and
        that first batch may then lack some of them: ``classes_`` (and ``predict_proba``'s
        columns) are the given classes from the start, a class without rows starting at a small
        prior mean (half a row's frequency; the Bernoulli base rate is clipped likewise).
        Labels outside ``classes`` are refused.  Later batches update the posterior (for several
        classes latent by latent: :func:`gpvi.fitting.stream.update`)."""
        if classes is None or hasattr(self, "fit_result_"):
            return super().partial_fit(X, y, classes)
        classes = np.unique(np.asarray(classes))
        if classes.ndim != 1 or len(classes) < 2:
            raise ValueError(f"classes must list at least two labels, got {classes.tolist()}")
        labels = np.asarray(y)
        unknown = _label_codes(labels.reshape(-1), {c: k for k, c in enumerate(classes.tolist())}) < 0
        if np.any(unknown):
            raise ValueError(f"y has labels {_first_ones(labels.reshape(-1)[unknown].tolist(), 5)} that are not "
                             f"in classes {classes.tolist()}")
        self._given_classes = classes
        try:
            return super().partial_fit(X, y)
        finally:
            del self._given_classes

    def _encode_classes(self, y):
        given = getattr(self, "_given_classes", None)
        if given is None:
            return super()._encode_classes(y)
        check_classification_targets(y)
        self.classes_ = given
        return _label_codes(np.asarray(y).reshape(-1), {c: k for k, c in enumerate(given.tolist())}).astype(np.float64)

    def fit(self, X, y):
        """Fit to inputs ``X`` (n_samples, n_features) and class labels ``y`` (n_samples,)."""
        return self._fit(X, y)

    def predict_proba(self, X):
        """Predictive class probabilities at ``X`` (n_samples, n_features): an (n_samples,
        n_classes) array whose rows sum to 1, columns in ``classes_`` order.

        Two classes (Bernoulli likelihood): column 1 is ``p(y = classes_[1] | x, data) =
        E_q[σ(f(x))]`` (logit link, by Gauss-Hermite quadrature over the latent's posterior
        ``q(f(x)) = N(m, v)``) or ``Φ(m / √(1 + v))`` (probit link, exact), and column 0 is one
        minus it.  These are the posterior-averaged probabilities, not the link of the posterior
        mean: uncertain inputs (large ``v``) are pulled towards 0.5.

        More classes (softmax over one latent GP per class): column c is
        ``E_q[softmax(f(x))_c]``, the softmax averaged over the C independent latent posteriors
        ``N(m_c, v_c)`` (by quadrature, :class:`gpvi.likelihoods.softmax.Softmax`).

        ``predict`` returns the label of the largest column.
        """
        return self._call("predict_proba", X)


class GPOrdinalRegressor(ClassifierMixin, _LabelEstimator):
    __doc__ = """Gaussian-process ordinal regression (cumulative logit) by variational inference.

    The labels of ``y`` are L ordered levels 0..L−1, lowest first: level j is ``classes_[j]``.
    Their order comes from, in this order of precedence:

    1. ``levels=[lowest, …, highest]``: every label of ``y`` must be one of them;
    2. ``y`` given as an ordered pandas Categorical (``pd.Categorical(…, ordered=True)`` or a
       Series of that dtype): the order of its categories (all of them are levels);
    3. labels of a numeric dtype (integers, floats, booleans): numerical order (False < True).

    Anything else — strings, or labels of an object dtype, an unordered Categorical of
    strings included — has no known order and is refused with a ``ValueError`` that says how
    to give it (numeric strings such as ``"10"`` are strings: give ``levels`` or convert them).
    Levels named by ``levels`` (or by a Categorical's categories) but absent from ``y`` keep
    their place; ``y`` must still hold at least two of them.

    The L−1 bin edges start where the empirical cumulative proportions of the levels put them
    under a zero latent (a level absent from ``y`` counts as half a row, so that the edges are
    strictly increasing) and are learned with the kernel parameters (the latent's constant
    mean and the likelihood's slope are kept fixed: both are redundant with the edges and
    the kernel variance).  ``predict`` returns the label of the most probable level and
    ``score`` the accuracy (scikit-learn's classifier conventions); ``predict_proba`` gives
    the level probabilities, columns in level (``classes_``) order.  Later ``partial_fit``
    batches are coded by ``classes_`` (their labels must be among them).

    Parameters
    ----------""" + _COMMON_DOC + """
    levels : list of labels or None, default None
        The order of the labels, lowest first (a list, tuple or 1-D array of distinct labels,
        at least two).  Required for labels that are not numbers unless ``y`` is an ordered
        pandas Categorical; takes precedence over a Categorical's order.  Checked at ``fit``.

    Attributes
    ----------
    classes_ : (L,) array of the labels in level order, lowest first (level j is
        ``classes_[j]``)""" + _FITTED_DOC + """
    """

    def __init__(self, kernel=None, *, model="auto", full_max=_defaults.FULL_MAX, inducing=_defaults.INDUCING,
                 engine="fpi", learn_hyperparameters=True, standardize=True, tol=1e-6, max_iter=500, max_rounds=100,
                 random_state=0, levels=None, hyperprior="weak"):
        self.kernel = kernel
        self.model = model
        self.full_max = full_max
        self.inducing = inducing
        self.engine = engine
        self.learn_hyperparameters = learn_hyperparameters
        self.standardize = standardize
        self.tol = tol
        self.max_iter = max_iter
        self.max_rounds = max_rounds
        self.random_state = random_state
        self.hyperprior = hyperprior
        self.levels = levels

    def _check_levels(self):
        """``levels`` as a list (None when not given), checked."""
        lv = self.levels
        if lv is None:
            return None
        try:
            one_d = np.ndim(lv) == 1
        except ValueError:  # ragged nested sequences
            one_d = False
        if (isinstance(lv, (str, bytes, dict, set, frozenset)) or not hasattr(lv, "__len__")
                or not hasattr(lv, "__iter__") or not one_d):
            raise ValueError(f"levels must be None or a list of the labels, lowest first, got {lv!r}")
        items = list(lv)
        _level_index(items, "levels")
        return items

    def _explicit_order(self, cats):
        """(labels in level order, what gave that order) from ``levels`` or else ``cats``, the
        categories of an ordered Categorical y (or None); (None, None) when neither is given."""
        levels = self._check_levels()
        if levels is not None:
            return levels, "levels"
        if cats is not None:
            return cats, "the categories of the ordered Categorical y"
        return None, None

    def _fit(self, X, y, exposure=None, _kind=None):
        # validate_data turns a pandas Categorical into a plain array: keep its order first.
        self._y_categories = _ordered_categories(y)
        try:
            return super()._fit(X, y, exposure, _kind)
        finally:
            del self._y_categories

    def _prepare_targets(self, y):
        name = type(self).__name__
        levels, source = self._explicit_order(getattr(self, "_y_categories", None))
        if levels is None:
            try:
                check_classification_targets(y)
            except ValueError as err:
                if type_of_target(y) != "continuous":
                    raise
                raise ValueError(f"{err} ({name}: to use numbers that are not integers as levels, list them "
                                 "with levels=[lowest, ..., highest])") from None
            if y.dtype.kind not in "biuf":
                labels = sorted(set(y.tolist()), key=str)
                shown = f"{labels}" if len(labels) <= 10 else f"{labels[:10]} and {len(labels) - 10} more"
                raise ValueError(
                    f"{name}: y has non-numeric labels {shown} whose order is unknown; give it with "
                    f"levels=[lowest, ..., highest] listing every label, lowest first, or pass y as an "
                    f"ordered pandas Categorical (pd.Categorical(y, categories=[lowest, ..., highest], "
                    f"ordered=True))")
            return self._encode_classes(y)
        codes = _label_codes(y, _level_index(levels, source))
        bad = codes < 0
        if np.any(bad):
            raise ValueError(f"{name}: y has labels {_first_ones(y[bad].tolist())} that are not in {source} "
                             f"{levels}")
        seen = np.unique(codes)
        if len(seen) < 2:
            raise ValueError(f"{name} needs at least two classes in y, but y has only one class "
                             f"({levels[int(seen[0])]!r}) of the {len(levels)} in {source}")
        self.classes_ = _label_array(levels, y)
        return codes.astype(np.float64)

    def partial_fit(self, X, y, classes=None):
        """Online learning (see :meth:`_GPEstimator.partial_fit`).  The first call fits the
        level order as :meth:`fit` does; later batches keep ``classes_`` (an ordered Categorical
        batch must not contradict it)."""
        cats = _ordered_categories(y)
        if cats is not None and hasattr(self, "fit_result_"):
            order = {label: k for k, label in enumerate(self.classes_.tolist())}
            ranks = [order[c] for c in cats if c in order]
            if ranks != sorted(ranks):
                raise ValueError(f"the ordered Categorical y puts its categories in the order {cats}, which "
                                 f"contradicts the fitted level order classes_ {self.classes_.tolist()}")
        return super().partial_fit(X, y, classes)

    def _check_first_batch_classes(self, classes, y):
        order, source = self._explicit_order(_ordered_categories(y))
        if order is None:
            return super()._check_first_batch_classes(classes, y)
        if set(classes.tolist()) != set(order):
            raise ValueError(f"classes {classes.tolist()} differ from {source} {order}")

    def _likelihood(self, y, offset):
        # edges from the level proportions; a level absent from y (named by levels) counts half a row
        return _defaults.likelihood_start("ordinal", y, levels=len(self.classes_))

    def fit(self, X, y):
        """Fit to inputs ``X`` (n_samples, n_features) and ordered labels ``y`` (n_samples,):
        their order from ``levels``, an ordered pandas Categorical ``y`` or numeric labels."""
        return self._fit(X, y)

    @classmethod
    def _from_gpvi_file(cls, meta, arrays):
        est = super()._from_gpvi_file(meta, arrays)
        levels = est._check_levels()
        if levels is not None and est.classes_.tolist() != levels:
            raise ValueError(f"classes_ {est.classes_.tolist()} are not the levels {levels}")
        return est


def _level_index(items, source):
    """{label: level} of a list of labels, lowest first; ValueError (naming ``source``) for
    fewer than two labels, labels that cannot be looked up (unhashable) or repeated ones."""
    if len(items) < 2:
        raise ValueError(f"{source} must list at least two labels, got {items}")
    index = {}
    repeated = []
    for k, label in enumerate(items):
        try:
            if label in index:
                repeated.append(label)
            index.setdefault(label, k)
        except TypeError:
            raise ValueError(f"{source} must hold labels (strings, numbers, …), got {label!r}") from None
    if repeated:
        raise ValueError(f"{source} names {_first_ones(repeated)} more than once: {items}")
    return index


# ------------------------------------------------------------------------------------------
class _ValueEstimator(RegressorMixin, _GPEstimator):
    """Shared logic of the estimators that predict a numeric value."""

    _y_numeric = True

    def _predict_value(self, X, exposure, return_std):
        mean, var = self._call("predict_y", X, exposure)
        scale, shift = self._target_scale()
        mean = mean * scale + shift
        return (mean, np.sqrt(var) * scale) if return_std else mean

    def _target_scale(self):
        return 1.0, 0.0


class _BothRequested(ValueError, RuntimeError):
    """``return_std`` and ``return_cov`` both requested (a ``ValueError``; a ``RuntimeError`` as in
    scikit-learn's ``GaussianProcessRegressor``)."""


_NOISES = {"gaussian": likelihoods.Gaussian, "laplace": likelihoods.Laplace, "studentt": likelihoods.StudentT,
           "warped": Warped, "heteroscedastic": likelihoods.HeteroscedasticGaussian}


class GPRegressor(_ValueEstimator):
    __doc__ = """Gaussian-process regression with Gaussian, Laplace, Student-t, warped or heteroscedastic noise.

    With ``standardize=True`` the targets are also centred and scaled to unit variance for
    the fit, and predictions are mapped back.  With Gaussian noise and a full GP the
    variational posterior is the exact GP posterior.

    Parameters
    ----------""" + _COMMON_DOC + """
    noise : {"gaussian", "laplace", "studentt", "warped", "heteroscedastic"}, default "gaussian"
        ``"warped"``: Gaussian noise on ``t(y)``, a monotone tanh-sum warping of the
        (standardised) targets with three terms, learned with the other hyperparameters
        (:class:`gpvi.likelihoods.warped.Warped`); predictions are in the original units.
        ``"heteroscedastic"``: Gaussian noise whose log standard deviation is a second GP over
        the inputs (:class:`gpvi.likelihoods.HeteroscedasticGaussian`; each of the two latent
        GPs has its own default kernel, and the noise GP's constant mean starts at
        ``log noise_scale``), so the predictive std grows where the data are noisier.
    noise_scale : float, default 0.1
        Starting value (the fixed value when not learned) of the noise standard deviation
        (Gaussian) or scale (Laplace, Student-t), in units of the standardised targets when
        ``standardize=True``.
    df : float, default 3.0
        Degrees of freedom of Student-t noise (fixed).

    Attributes
    ----------
    y_mean_, y_scale_ : floats used to standardise the targets (0 and 1 when
        ``standardize=False``)""" + _FITTED_DOC + """
    """

    _fitted_arrays = ("y_mean_", "y_scale_")

    def __init__(self, kernel=None, *, noise="gaussian", noise_scale=_defaults.NOISE_SCALE, df=_defaults.STUDENT_T_DF,
                 model="auto", full_max=_defaults.FULL_MAX_REGRESSION, inducing=_defaults.INDUCING, engine="fpi",
                 learn_hyperparameters=True, standardize=True, tol=1e-6, max_iter=500, max_rounds=100,
                 random_state=0, hyperprior="weak"):
        self.kernel = kernel
        self.noise = noise
        self.noise_scale = noise_scale
        self.df = df
        self.model = model
        self.full_max = full_max
        self.inducing = inducing
        self.engine = engine
        self.learn_hyperparameters = learn_hyperparameters
        self.standardize = standardize
        self.tol = tol
        self.max_iter = max_iter
        self.max_rounds = max_rounds
        self.random_state = random_state
        self.hyperprior = hyperprior

    def _prepare_targets(self, y):
        if self.noise not in _NOISES:
            raise ValueError(f"noise must be one of {sorted(_NOISES)}, got {self.noise!r}")
        for name in ("noise_scale", "df"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or not v > 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if self.standardize:
            sd = float(np.std(y))
            self.y_mean_, self.y_scale_ = np.float64(np.mean(y)), np.float64(sd if sd > 0 else 1.0)
        else:
            self.y_mean_, self.y_scale_ = np.float64(0.0), np.float64(1.0)
        return (y - self.y_mean_) / self.y_scale_

    def _encode_more(self, y):
        return (np.asarray(y, dtype=np.float64) - self.y_mean_) / self.y_scale_

    def _likelihood(self, y, offset):
        return _defaults.likelihood_start(self.noise, y, noise_scale=float(self.noise_scale), df=float(self.df))

    def _target_scale(self):
        return self.y_scale_, self.y_mean_

    def fit(self, X, y):
        """Fit to inputs ``X`` (n_samples, n_features) and real targets ``y`` (n_samples,)."""
        return self._fit(X, y)

    def predict(self, X, return_std=False, return_cov=False):
        """Predictive mean of y at ``X`` (n_samples, n_features): (n_samples,).

        As scikit-learn's ``GaussianProcessRegressor.predict`` (whose noise, when modelled by a
        ``WhiteKernel``, is in its std and covariance): the std and covariance are those of the
        predictive distribution of the *observations* y, noise included, in the units of y.

        - ``return_std=True``: also the predictive standard deviation of y, (n_samples,)
          (infinite for Student-t noise with ``df ≤ 2``).
        - ``return_cov=True``: also the predictive covariance of y, (n_samples, n_samples):
          the posterior covariance of the latent ``f`` (:meth:`gpvi.FitResult.predict_f_cov`,
          by triangular solves in whitened coordinates) plus the noise variance on the
          diagonal.  The noise is independent across rows, so off the diagonal it is the latent
          covariance; its diagonal is ``return_std ** 2`` (the same numbers) and it is positive
          semi-definite.  For Gaussian noise and a full GP it is the exact GP posterior
          predictive covariance.  O(n_samples²) memory.  Not available with
          ``noise="warped"`` (y is a nonlinear function of a Gaussian: use :meth:`sample_y`).

        At most one of ``return_std`` and ``return_cov``: both raise a ``ValueError`` (also a
        ``RuntimeError``, the class scikit-learn raises).
        """
        if return_std and return_cov:
            raise _BothRequested("At most one of return_std or return_cov can be requested.")
        if not return_cov:
            return self._predict_value(X, None, return_std)
        check_is_fitted(self, "fit_result_")
        if isinstance(self.fit_result_.model.likelihood, Warped):
            raise ValueError("return_cov is not available with noise='warped': the predictive of y is not "
                             "Gaussian (y is the inverse warping of a Gaussian); use sample_y for joint draws")
        mean, var = self._call("predict_y", X)
        cov = self._latent_cov(X)[1]
        if cov.ndim == 3:  # heteroscedastic noise: y's latent is the mean function (latent 0)
            cov = cov[0]
        np.fill_diagonal(cov, var)  # independent noise: only the diagonal gains its variance
        scale, shift = self._target_scale()
        return mean * scale + shift, cov * (scale * scale)

    def _latent_cov(self, X):
        """Latent mean (n,) and posterior covariance (n, n) at ``X``, in standardised units."""
        check_is_fitted(self, "fit_result_")
        X = self._validate_X(X, reset=False)
        n = X.shape[0]
        Xs = (X - self.x_mean_) / self.x_scale_
        pad = _bucket(n) - n  # a few compiled shapes (the padded rows are dropped below)
        if pad:
            Xs = np.concatenate([Xs, np.repeat(Xs[:1], pad, axis=0)])
        mean, cov = self.fit_result_.predict_f_cov(Xs)  # (n,), (n, n); several latents: (n, Q), (Q, n, n)
        return np.array(mean[:n]), np.array(cov[..., :n, :n])

    def sample_y(self, X, n_samples=1, random_state=0):
        """Draw joint samples of y from the predictive distribution at ``X`` (n_samples_X,
        n_features), as scikit-learn's ``GaussianProcessRegressor.sample_y``: an
        (n_samples_X, n_samples) array (one column per draw).

        Each draw is a joint sample of the latent ``f`` at all rows of ``X`` from its posterior
        (mean and covariance of :meth:`gpvi.FitResult.predict_f_cov`) plus independent noise
        from the learned likelihood (Gaussian, Laplace or Student-t; for ``noise="warped"``
        Gaussian noise in the warped space, mapped back by the inverse warping), in the units
        of y.  With Gaussian noise the draws are from ``N(mean, cov)`` of
        ``predict(X, return_cov=True)``.

        ``random_state`` : int, RandomState or None (scikit-learn's convention; default 0).
        """
        if not _is_int(n_samples) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
        rng = check_random_state(random_state)
        mean, cov = self._latent_cov(X)
        if mean.ndim == 2:  # heteroscedastic noise: joint draws of the mean and log-noise functions
            f, g = (_joint_draws(mean[:, q], cov[q], n_samples, rng) for q in range(2))
            y = f + np.exp(g) * rng.standard_normal(f.shape)
        else:
            y = self._add_noise(_joint_draws(mean, cov, n_samples, rng), rng)
        scale, shift = self._target_scale()
        return y * scale + shift

    def _add_noise(self, f, rng):
        """Latent draws ``f`` plus independent noise from the learned likelihood (standardised units)."""
        lik = self.fit_result_.model.likelihood
        if isinstance(lik, Warped):
            z = f + np.sqrt(float(lik.likelihood.variance)) * rng.standard_normal(f.shape)
            return np.asarray(lik.unwarp(z))
        if isinstance(lik, likelihoods.StudentT):
            return f + float(lik.scale) * rng.standard_t(float(lik.df), size=f.shape)
        if isinstance(lik, likelihoods.Laplace):
            return f + rng.laplace(0.0, float(lik.scale), size=f.shape)
        if isinstance(lik, likelihoods.Gaussian):
            return f + np.sqrt(float(lik.variance)) * rng.standard_normal(f.shape)
        raise ValueError(f"sample_y: no noise sampler for the {type(lik).__name__} likelihood")


def _joint_draws(mean, cov, n_samples, rng):
    """``n_samples`` joint draws (columns) from ``N(mean, cov)``, mean (n,) and PSD cov (n, n)."""
    w, U = np.linalg.eigh(cov)  # a factor of a PSD matrix that tolerates rounding (no Cholesky failure)
    factor = U * np.sqrt(np.clip(w, 0.0, None))
    return mean[:, None] + factor @ rng.standard_normal((mean.shape[0], n_samples))


class GPCountRegressor(_ValueEstimator):
    __doc__ = """Gaussian-process Poisson regression (log link) with optional exposure.

    ``y ~ Poisson(exposure · exp(f))``.  Targets are non-negative counts; non-integer values
    (rates, averaged counts) are accepted and fitted by the same quasi-likelihood as
    scikit-learn's ``PoissonRegressor``.  The prior mean starts at the log of the overall
    rate.  ``score`` is the fraction of Poisson deviance explained (D²).

    Parameters
    ----------""" + _COMMON_DOC + """

    Attributes
    ----------""" + _FITTED_DOC + """
    """

    def __init__(self, kernel=None, *, model="auto", full_max=_defaults.FULL_MAX, inducing=_defaults.INDUCING,
                 engine="fpi", learn_hyperparameters=True, standardize=True, tol=1e-6, max_iter=500, max_rounds=100,
                 random_state=0, hyperprior="weak"):
        self.kernel = kernel
        self.model = model
        self.full_max = full_max
        self.inducing = inducing
        self.engine = engine
        self.learn_hyperparameters = learn_hyperparameters
        self.standardize = standardize
        self.tol = tol
        self.max_iter = max_iter
        self.max_rounds = max_rounds
        self.random_state = random_state
        self.hyperprior = hyperprior

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        # scikit-learn's check_regressors_train scores R² > 0.5 on a standardised continuous
        # target shifted to [1, 7.5]: it is under-dispersed for a Poisson model (variance 1,
        # mean 4.4), so the marginal likelihood rightly explains it all as Poisson noise
        # (kernel variance → 0) and D² ≈ 0.  ``poor_score`` is the tag for exactly that check.
        tags.regressor_tags.poor_score = True
        return tags

    def _prepare_targets(self, y):
        return QuasiPoisson().validate(y)

    def _likelihood(self, y, offset):
        return _defaults.likelihood_start("quasipoisson", y, offset=offset)  # mean: log of the overall rate

    def fit(self, X, y, exposure=None):
        """Fit to inputs ``X`` (n_samples, n_features) and counts ``y`` (n_samples,).

        ``exposure`` : (n_samples,) positive exposures (time at risk, population, …) or None.
        """
        return self._fit(X, y, exposure)

    def predict(self, X, exposure=None, return_std=False):
        """Expected count at ``X`` (n_samples, n_features) for the given exposures
        ((n_samples,), default 1): (n_samples,).  With ``return_std=True`` also the predictive
        standard deviation of the count."""
        return self._predict_value(X, exposure, return_std)

    def score(self, X, y, exposure=None):
        """D² (fraction of Poisson deviance explained) of ``predict(X, exposure)`` for ``y``."""
        from sklearn.metrics import d2_tweedie_score

        return float(d2_tweedie_score(y, self.predict(X, exposure), power=1))

