"""Model components and fitted states as JSON metadata plus named arrays: the encoding that
:mod:`gpvi.io` writes into model files, and that the scikit-learn estimators use for their own
parts.

A component (kernel, likelihood, model) is stored as its class name, its static settings and
one array per parameter; only gpvi's own classes, classes given to :func:`register` and the
subclasses of :class:`gpvi.kernels.Kernel` that the running program has defined can be rebuilt,
so decoding never imports or runs code named by a file.

A user's kernel (a ``Kernel`` subclass) needs no :func:`register` call: the subclasses of
``Kernel`` defined when a file is saved or loaded are found by walking ``__subclasses__()``,
keyed by class name.  A class defined again under the same module and qualified name (a
notebook cell run twice) means its latest definition; an earlier definition is then refused
when saved.  A name is the class's identity in a file, so a kernel whose name is that of one of
gpvi's classes, of a registered class or of a different ``Kernel`` subclass (another module or
qualified name) is refused with a ``ValueError`` naming both (rename it, or :func:`register`
the one a file's name should mean).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from gpvi import kernels, likelihoods, models
from gpvi._module import Module
from gpvi.fitting.mog import MoGResult, latent_gps
from gpvi.fitting.posterior import FitResult
from gpvi.objective import State

__all__ = ["register", "encode", "decode", "known_classes", "short", "why", "real_array", "fit_result_to_arrays",
           "fit_result_from_arrays", "mog_result_to_arrays", "mog_result_from_arrays"]

_REGISTRY: dict[str, type] = {}


def register(cls):
    """Allow a user-defined component class (e.g. a custom likelihood) in model files.

    A subclass of :class:`gpvi.kernels.Kernel` needs no registration (see the module); registering
    one makes its name mean it even when another class has the same name."""
    _REGISTRY[cls.__name__] = cls
    return cls


# Names that files written by an earlier gpvi give to classes since renamed: old name → current
# name.  Read only (a file is always written with the current name).
_RENAMED = {"_QuasiPoisson": "QuasiPoisson"}  # gpvi.sklearn.estimators' private class, now gpvi.likelihoods'


def _own_classes():
    """gpvi's own component classes (those in the ``__all__`` of its kernels, likelihoods and
    models) by name, with the old names of :data:`_RENAMED`, then the registered classes."""
    out = {}
    for mod in (kernels, likelihoods, models):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, Module):
                out[name] = obj
    out.update({old: out[new] for old, new in _RENAMED.items() if new in out})
    out.update(_REGISTRY)
    return out


def _kernel_subclasses() -> dict[str, list[type]]:
    """The subclasses of :class:`gpvi.kernels.Kernel` defined outside gpvi.kernels (a user's
    kernels), by class name.  (JAX's pytree registry holds every one, so a class once defined
    stays here, even when defined again.)"""
    found: dict[str, list[type]] = {}
    seen: set[type] = set()
    todo = [kernels.Kernel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            if sub.__module__ != kernels.__name__:
                found.setdefault(sub.__name__, []).append(sub)
    return found


def _where(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _discovered(own: dict) -> tuple[dict, dict]:
    """``(unique, clashing)``: the class each name of a user's Kernel subclass means (the latest
    definition, where all classes of that name have one module and qualified name), and, by name,
    the classes that share a name with a different Kernel subclass or with a class of ``own``."""
    unique, clashing = {}, {}
    for name, classes in _kernel_subclasses().items():
        if name in own:
            others = [c for c in classes if c is not own[name]]
            if others:
                clashing[name] = [own[name]] + others
        elif len({_where(c) for c in classes}) > 1:
            clashing[name] = classes
        else:
            unique[name] = max(classes, key=lambda c: getattr(c, "_gpvi_defined", -1))
    return unique, clashing


def known_classes():
    """The classes a model file may name, by name: gpvi's own, the registered ones and every
    user's :class:`~gpvi.kernels.Kernel` subclass whose name is its own (see the module)."""
    own = _own_classes()
    unique, _ = _discovered(own)
    return {**unique, **own}


def _clash_message(name, classes, action):
    shown = ", ".join(_where(c) for c in classes)
    return (f"cannot {action} class {name}: a model file names a class by its name, and {len(classes)} different "
            f"classes are called {name} ({shown}); rename your kernel class, or call gpvi.io.register on the "
            f"one that {name} should mean (before saving and before loading)")


def encode(obj, arrays, path):
    """Module → JSON-able dict; arrays go to ``arrays`` under dotted keys."""
    if isinstance(obj, Module):
        cls = type(obj)
        if known_classes().get(cls.__name__) is not cls:
            unique, clashing = _discovered(_own_classes())
            if cls in clashing.get(cls.__name__, ()):
                raise ValueError(_clash_message(cls.__name__, clashing[cls.__name__], "save"))
            if cls.__name__ in unique:
                raise ValueError(f"cannot save {_where(cls)}: the class has been defined again since this object was "
                                 f"built, and a model file names a class by its name, which now means the latest "
                                 f"definition; build the object again from the latest {cls.__name__}")
            raise ValueError(f"cannot save {cls.__name__}: only gpvi's own classes and subclasses of "
                             "gpvi.kernels.Kernel are saved by default; call gpvi.io.register(YourClass) first (and "
                             "again before loading)")
        fields = {}
        for f in dataclasses.fields(obj):
            fields[f.name] = encode(getattr(obj, f.name), arrays, f"{path}.{f.name}")
        return {"class": cls.__name__, "fields": fields}
    if isinstance(obj, (tuple, list)):
        return {"sequence": [encode(v, arrays, f"{path}.{i}") for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (str, bool, int, float)) and not isinstance(obj, np.generic):
        return {"value": obj}
    arrays[path] = np.asarray(obj)
    return {"array": path}


_ABSTRACT_METHODS = {kernels.Kernel: ("_K", "_diag"), likelihoods.Likelihood: ("log_prob",),
                     models.Model: ("num_weights", "prior_cache", "project")}


def _is_abstract(cls) -> bool:
    """Whether ``cls`` leaves a method of its gpvi base class unimplemented (``Kernel`` itself,
    ``Likelihood``, ``Model``, or a registered subclass that overrides too little)."""
    return any(issubclass(cls, base) and getattr(cls, name) is getattr(base, name)
               for base, names in _ABSTRACT_METHODS.items() for name in names)


class UnknownClassError(ValueError):
    """A model file names a class this process does not know (the file itself may be sound)."""


def decode(spec, arrays):
    """Inverse of :func:`encode`.  A malformed spec, an unknown or abstract class, or a
    component whose construction fails raises ``ValueError`` (or ``KeyError`` for an array
    that is not in the file)."""
    if not isinstance(spec, dict) or set(spec) not in ({"class", "fields"}, {"sequence"}, {"array"}, {"value"}):
        raise ValueError(f"malformed component {short(spec)}")
    if "class" in spec:
        name, fields = spec["class"], spec["fields"]
        cls = known_classes().get(name) if isinstance(name, str) else None
        if cls is None and isinstance(name, str):
            _, clashing = _discovered(_own_classes())
            if name in clashing:
                raise ValueError(_clash_message(name, clashing[name], "load"))
        if cls is None:
            raise UnknownClassError(
                f"the model file uses the class {short(name)}, which is not defined in this process: import "
                "(or define) it before loading — a Kernel subclass needs nothing more, any other class of "
                "your own must also be registered with gpvi.io.register")
        if _is_abstract(cls):
            raise ValueError(f"class {name} is abstract: a model file names only concrete classes")
        if not isinstance(fields, dict):
            raise ValueError(f"malformed fields of {name}: {short(fields)}")
        kw = {k: decode(v, arrays) for k, v in fields.items()}
        # fields added to a class since a file was written: the value that such a file means
        # (e.g. Softmax's rule: files written before the field used the rule over all latents)
        for k, v in getattr(cls, "_file_defaults", {}).items():
            kw.setdefault(k, v)
        try:
            return cls(**kw)
        except Exception as err:  # noqa: BLE001 - any failure to build is a damaged file
            raise ValueError(f"cannot rebuild {name}: {why(err)}") from None
    if "sequence" in spec:
        if not isinstance(spec["sequence"], list):
            raise ValueError(f"malformed sequence {short(spec['sequence'])}")
        return tuple(decode(v, arrays) for v in spec["sequence"])
    if "array" in spec:
        if not isinstance(spec["array"], str):
            raise ValueError(f"malformed array name {short(spec['array'])}")
        return jax.device_put(np.asarray(arrays[spec["array"]]))  # (jnp.asarray: a staging program per shape)
    value = spec["value"]
    if value is not None and not isinstance(value, (str, bool, int, float)):
        raise ValueError(f"malformed value {short(value)}")
    return value


# Fields of FitResult stored in meta["scalars"] and their types (int: a non-negative int).
_SCALARS = {"vlb": float, "iterations": int, "converged": bool, "message": str, "engine": str,
            "backtracks": int, "cycles": int, "evaluations": int, "clipped": int,
            "hyperparameter_rounds": int, "seconds": float, "chunk_size": int, "input_dim": int}


def _valid_scalar(key: str, value) -> bool:
    """Whether ``value`` (from JSON) has the type of ``FitResult.<key>``."""
    kind = _SCALARS[key]
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return type(value) is int and value >= (1 if key in ("chunk_size", "input_dim") else 0)
    return type(value) is kind


def fit_result_to_arrays(fit, prefix="fit"):
    """(meta dict, arrays dict) for a :class:`gpvi.FitResult` of a Gaussian posterior (a
    :class:`~gpvi.fitting.mog.MoGResult` is :func:`mog_result_to_arrays`')."""
    if isinstance(fit, MoGResult) or fit.state is None:
        raise ValueError("a mixture posterior (MoGResult) is encoded by mog_result_to_arrays")
    arrays: dict[str, np.ndarray] = {}
    meta = {"model": encode(fit.model, arrays, f"{prefix}.model"),
            "scalars": {k: getattr(fit, k) for k in _SCALARS}}
    meta["scalars"] = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in meta["scalars"].items()}
    arrays[f"{prefix}.state.mean"] = np.asarray(fit.state.mean)
    arrays[f"{prefix}.state.chol"] = np.asarray(fit.state.chol)
    arrays[f"{prefix}.trace"] = np.asarray(fit.trace)
    # the certificate and the jitter (NaN where unknown, which JSON cannot hold) as an array
    arrays[f"{prefix}.gap_jitter"] = np.array([fit.gap, fit.jitter], dtype=np.float64)
    meta["search_message"] = str(fit.search_message)
    leaves = jax.tree_util.tree_leaves(fit.prior)
    meta["prior_leaves"] = len(leaves)
    for i, leaf in enumerate(leaves):
        arrays[f"{prefix}.prior.{i}"] = np.asarray(leaf)
    return meta, arrays


def fit_result_from_arrays(meta, arrays, prefix="fit"):
    """Rebuild a :class:`gpvi.FitResult` written by :func:`fit_result_to_arrays`.

    Everything is checked before it is used: the types of the scalar fields; that the model
    has a likelihood and finite parameters; that the state is a finite mean (d,) and a
    lower-triangular chol (d, d); and (:func:`_checked_prior`) that ``input_dim``, d and the
    prior cache fit the model.  Raises ``ValueError`` (or ``KeyError``, ``TypeError``) if not.
    """

    scalars = _checked_scalars(meta, _SCALARS)
    model = _checked_model(meta, arrays)
    mean = real_array(arrays[f"{prefix}.state.mean"], "state.mean")
    chol = real_array(arrays[f"{prefix}.state.chol"], "state.chol")
    Q = getattr(model, "num_latents", None)  # Q latent blocks (gpvi.models.multilatent): (Q, d), (Q, d, d)
    lead = () if Q is None else (Q,)
    d = mean.shape[-1] if mean.ndim == 1 + len(lead) and mean.shape[:-1] == lead else 0
    if d < 1 or chol.shape != lead + (d, d) or np.any(np.triu(chol, 1)):
        q = "Q, " if lead else ""
        raise ValueError(f"the state must be a mean ({q}d) and a lower-triangular chol ({q}d, d), got shapes "
                         f"{mean.shape} and {chol.shape}")
    trace = real_array(arrays[f"{prefix}.trace"], "trace", finite=False)
    if trace.ndim != 2 or trace.shape[1] != 2:
        raise ValueError(f"trace must have shape (K, 2), got {trace.shape}")
    n = meta["prior_leaves"]
    if type(n) is not int or not 0 <= n <= len(arrays):
        raise ValueError(f"prior_leaves = {short(n)} is not a count of arrays in the file")
    leaves = [real_array(arrays[f"{prefix}.prior.{i}"], f"prior.{i}") for i in range(n)]
    prior = _checked_prior(model, leaves, scalars["input_dim"], d)
    gap, jitter = _gap_and_jitter(meta, arrays, prefix)
    return FitResult(model=model, state=State(*jax.device_put((np.asarray(mean), np.asarray(chol)))), trace=trace,
                     prior=prior, gap=gap, jitter=jitter, search_message=_search_message(meta), **scalars)


def _gap_and_jitter(meta, arrays, prefix):
    """``(gap, jitter)`` of a file written since they are stored; NaN for an older file."""
    key = f"{prefix}.gap_jitter"
    if key not in arrays:
        return float("nan"), float("nan")
    a = real_array(arrays[key], "gap_jitter", finite=False)
    if a.shape != (2,) or np.any(a[~np.isnan(a)] < 0):
        raise ValueError(f"gap_jitter must be two non-negative numbers (or NaN), got {short(a.tolist())}")
    return float(a[0]), float(a[1])


def _search_message(meta) -> str:
    msg = meta.get("search_message", "")
    if not isinstance(msg, str):
        raise ValueError(f"search_message = {short(msg)} is not a string")
    return msg


# Fields of MoGResult stored in meta["scalars"] (the others are those of every MoGResult).
_MOG_SCALARS = ("vlb", "iterations", "converged", "message", "engine", "evaluations", "hyperparameter_rounds",
                "seconds", "input_dim")


def mog_result_to_arrays(fit, prefix="mog"):
    """(meta dict, arrays dict) for a :class:`~gpvi.fitting.mog.MoGResult`: the model as
    :func:`encode` writes it, the scalar fields and ``extras`` as metadata, and the training
    inputs, the components' means and variances and the trace as arrays."""
    arrays: dict[str, np.ndarray] = {}
    scalars = {k: getattr(fit, k) for k in _MOG_SCALARS}
    meta = {"model": encode(fit.model, arrays, f"{prefix}.model"),
            "scalars": {k: (v.item() if isinstance(v, np.generic) else v) for k, v in scalars.items()},
            "extras": {k: (v.item() if isinstance(v, np.generic) else v) for k, v in fit.extras.items()}}
    for name in ("X", "means", "variances", "trace"):
        arrays[f"{prefix}.{name}"] = np.asarray(getattr(fit, name), dtype=np.float64)
    return meta, arrays


def mog_result_from_arrays(meta, arrays, prefix="mog"):
    """Rebuild a :class:`~gpvi.fitting.mog.MoGResult` written by :func:`mog_result_to_arrays`.

    Everything is checked before it is used: the types of the scalar fields; that the model is
    a full GP or a MultiLatent of full GPs with a likelihood and finite parameters; that ``X`` is
    finite (N, input_dim) and that every latent's kernel takes it; that ``means`` and positive
    ``variances`` are finite (K, N), or (K, Q, N) with Q latent functions, with K the
    ``components`` of ``extras``; that the trace is (rows, 2).  Raises ``ValueError`` (or
    ``KeyError``, ``TypeError``) if not.
    """
    scalars = _checked_scalars(meta, _MOG_SCALARS)
    extras = meta["extras"]
    K = extras.get("components") if isinstance(extras, dict) else None
    if type(K) is not int or K < 1:
        raise ValueError(f"extras must name the number of components, got {short(extras)}")
    model = _checked_model(meta, arrays)
    lats = latent_gps(model)  # a ValueError unless full GPs
    D = scalars["input_dim"]
    X = real_array(arrays[f"{prefix}.X"], "X")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] != D:
        raise ValueError(f"X must have shape (N, {D}), got {X.shape}")
    for lat in lats:  # each kernel takes D columns (shapes traced, nothing computed)
        jax.eval_shape(lambda k, x: k(x[:1], x[:1]), lat.kernel, jax.ShapeDtypeStruct(X.shape, np.float64))
    shape = (K, X.shape[0]) if len(lats) == 1 else (K, len(lats), X.shape[0])
    means = real_array(arrays[f"{prefix}.means"], "means")
    variances = real_array(arrays[f"{prefix}.variances"], "variances")
    if means.shape != shape or variances.shape != shape:
        raise ValueError(f"means and variances must have shape {shape}, got {means.shape} and {variances.shape}")
    if np.any(variances <= 0):
        raise ValueError("variances must be positive")
    trace = real_array(arrays[f"{prefix}.trace"], "trace", finite=False)
    if trace.ndim != 2 or trace.shape[1] != 2:
        raise ValueError(f"trace must have shape (K, 2), got {trace.shape}")
    return MoGResult(model=model, state=None, trace=trace, extras=dict(extras), X=X, means=means,
                     variances=variances, **scalars)


def _checked_prior(model, leaves, D, d):
    """The prior cache rebuilt from its ``leaves``, once they are shown to fit the model.

    ``D`` (the file's ``input_dim``) must match the inducing inputs of a sparse GP or the
    training inputs of a full GP (the cache's first leaf), ``d`` (the state's size) the
    model's number of weights, and the leaves and the projections must have the shapes the
    model computes.  Shapes are traced abstractly (:func:`jax.eval_shape`), so a file
    declaring a huge ``input_dim`` is refused without allocating anything.
    """
    first = model.latents[0] if hasattr(model, "latents") else model  # MultiLatent: as its latents
    if isinstance(first, models.GP):
        # A full GP's prior cache starts with its (N, D) training inputs.
        if not leaves or leaves[0].ndim != 2 or leaves[0].shape[0] == 0:
            raise ValueError("the prior cache of a full GP must start with its (N, D) training inputs")
        X_like, known, what = leaves[0], leaves[0].shape[1], "training"
    else:
        X_like, known, what = jax.ShapeDtypeStruct((1, D), np.float64), model.input_dim(), "inducing"
    if known is not None and known != D:
        raise ValueError(f"input_dim = {D} but the model's {what} inputs have {known} columns")
    weights = model.num_weights(X_like)
    if weights != d:
        raise ValueError(f"the model has {weights} weights for input_dim = {D}, but the state has {d}")
    expected = jax.eval_shape(model.prior_cache, X_like)
    shapes = [np.shape(e) for e in jax.tree_util.tree_leaves(expected)]
    if shapes != [a.shape for a in leaves]:
        raise ValueError(f"the prior cache has arrays of shapes {[a.shape for a in leaves]}, the model's {shapes}")
    prior = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(expected), jax.device_put([np.asarray(a) for a in leaves]))
    At = jax.eval_shape(model.project, prior, jax.ShapeDtypeStruct((1, D), np.float64))[0]
    lead = () if getattr(model, "num_latents", None) is None else (model.num_latents,)
    if At.shape != lead + (d, 1):
        raise ValueError(f"the model projects onto {At.shape[-2]} weights, the state has {d}")
    return prior


def short(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about crafted contents."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def why(err: Exception) -> str:
    """An exception as a message: its text, after its type unless it is a plain ValueError."""
    return str(err) if type(err) is ValueError else f"{type(err).__name__}: {err}"


def real_array(a, name: str, finite: bool = True) -> np.ndarray:
    """``a`` as a NumPy array of real numbers (finite unless ``finite=False``), else ValueError."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return arr


def _checked_scalars(meta, fields) -> dict:
    """``meta["scalars"]`` if it has exactly ``fields``, each valid; a ``ValueError`` otherwise."""
    scalars = meta["scalars"]
    if not isinstance(scalars, dict) or set(scalars) != set(fields):
        raise ValueError(f"scalars must have the fields {sorted(fields)}, got {short(scalars)}")
    for k, v in scalars.items():
        if not _valid_scalar(k, v):
            raise ValueError(f"scalars.{k} = {short(v)} is not a valid {k}")
    return scalars


def _checked_model(meta, arrays):
    """The stored model, a gpvi model with a likelihood and real parameters; a ``ValueError`` otherwise."""
    model = decode(meta["model"], arrays)
    if not isinstance(model, models.Model):
        raise ValueError(f"the model is a {type(model).__name__}, not a gpvi model")
    if not isinstance(getattr(model, "likelihood", None), likelihoods.Likelihood):
        raise ValueError(f"the model {type(model).__name__} has no likelihood")
    for name, value in model.parameters().items():
        real_array(value, f"parameter {name}")
    return model
