"""Save and load fitted gpvi objects without pickle.

A model file is a zip archive (``numpy.savez`` layout) holding ``meta.json`` — the format
name and version, the object's kind, and every component (kernel, likelihood, model) as
class name + static settings — and one ``.npy`` array per parameter and per piece of
fitted state.  Only gpvi's own classes (and classes registered with :func:`register`) can be
rebuilt, so loading a file never imports or runs code named by the file.

``save(obj, path)`` accepts a :class:`gpvi.FitResult` or any object with ``_to_gpvi_file``
(the scikit-learn estimators); ``load(path)`` returns the same kind of object.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io as _io
import json
import math
import os
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import kernels, likelihoods, models
from ._module import Module
from .objective import State

__all__ = ["save", "load", "register", "atomic_write", "FORMAT", "VERSION"]

FORMAT = "gpvi-model"
VERSION = 1
_REGISTRY: dict[str, type] = {}


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temporary file in ``path``'s folder for writing; on a clean exit it is flushed,
    fsynced and renamed onto ``path`` with :func:`os.replace` (atomic on POSIX), otherwise it
    is removed.  So a failed write (full disk, an exception, an interrupt) leaves any previous
    ``path`` intact, and a concurrent reader sees either the old file or the new one, never a
    partial one.  Yields the open file object.

    A symlink is written through (its target is replaced, the link stays); an existing device or
    pipe (``/dev/null``, ``/dev/stdout``) cannot be replaced and is written in place.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, mode) as f:
            yield f
        return
    path = Path(os.path.realpath(path))
    # The name is chosen before the file exists, so the clean-up below knows it whenever an
    # exception or interrupt arrives, even one that lands just as the file is created.
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    created = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        created = True
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        # A FileExistsError before ``created`` is another writer's file of the same random name.
        if created or not isinstance(err, FileExistsError):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def register(cls):
    """Allow a user-defined component class (e.g. a custom likelihood) in model files."""
    _REGISTRY[cls.__name__] = cls
    return cls


def _known_classes():
    out = {}
    for mod in (kernels, likelihoods, models):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, Module):
                out[name] = obj
    out.update(_REGISTRY)
    return out


def _encode(obj, arrays, path):
    """Module → JSON-able dict; arrays go to ``arrays`` under dotted keys."""
    if isinstance(obj, Module):
        cls = type(obj)
        if _known_classes().get(cls.__name__) is not cls:
            raise ValueError(
                f"cannot save {cls.__name__}: only gpvi's own classes are saved by default; "
                "call gpvi.io.register(YourClass) first (and again before loading)"
            )
        fields = {}
        for f in dataclasses.fields(obj):
            fields[f.name] = _encode(getattr(obj, f.name), arrays, f"{path}.{f.name}")
        return {"class": cls.__name__, "fields": fields}
    if isinstance(obj, (tuple, list)):
        return {"sequence": [_encode(v, arrays, f"{path}.{i}") for i, v in enumerate(obj)]}
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


def _decode(spec, arrays):
    """Inverse of :func:`_encode`.  A malformed spec, an unknown or abstract class, or a
    component whose construction fails raises ``ValueError`` (or ``KeyError`` for an array
    that is not in the file)."""
    if not isinstance(spec, dict) or set(spec) not in ({"class", "fields"}, {"sequence"}, {"array"}, {"value"}):
        raise ValueError(f"malformed component {_short(spec)}")
    if "class" in spec:
        name, fields = spec["class"], spec["fields"]
        cls = _known_classes().get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"model file uses unknown class {_short(name)} "
                             "(register it with gpvi.io.register before loading)")
        if _is_abstract(cls):
            raise ValueError(f"class {name} is abstract: a model file names only concrete classes")
        if not isinstance(fields, dict):
            raise ValueError(f"malformed fields of {name}: {_short(fields)}")
        kw = {k: _decode(v, arrays) for k, v in fields.items()}
        try:
            return cls(**kw)
        except Exception as err:  # noqa: BLE001 - any failure to build is a damaged file
            raise ValueError(f"cannot rebuild {name}: {_why(err)}") from None
    if "sequence" in spec:
        if not isinstance(spec["sequence"], list):
            raise ValueError(f"malformed sequence {_short(spec['sequence'])}")
        return tuple(_decode(v, arrays) for v in spec["sequence"])
    if "array" in spec:
        if not isinstance(spec["array"], str):
            raise ValueError(f"malformed array name {_short(spec['array'])}")
        return jnp.asarray(arrays[spec["array"]])
    value = spec["value"]
    if value is not None and not isinstance(value, (str, bool, int, float)):
        raise ValueError(f"malformed value {_short(value)}")
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
    """(meta dict, arrays dict) for a :class:`gpvi.FitResult`."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"model": _encode(fit.model, arrays, f"{prefix}.model"),
            "scalars": {k: getattr(fit, k) for k in _SCALARS}}
    meta["scalars"] = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in meta["scalars"].items()}
    arrays[f"{prefix}.state.mean"] = np.asarray(fit.state.mean)
    arrays[f"{prefix}.state.chol"] = np.asarray(fit.state.chol)
    arrays[f"{prefix}.trace"] = np.asarray(fit.trace)
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
    from .fit import FitResult

    scalars = meta["scalars"]
    if not isinstance(scalars, dict) or set(scalars) != set(_SCALARS):
        raise ValueError(f"scalars must have the fields {sorted(_SCALARS)}, got {_short(scalars)}")
    for k, v in scalars.items():
        if not _valid_scalar(k, v):
            raise ValueError(f"scalars.{k} = {_short(v)} is not a valid {k}")
    model = _decode(meta["model"], arrays)
    if not isinstance(model, models.Model):
        raise ValueError(f"the model is a {type(model).__name__}, not a gpvi model")
    if not isinstance(getattr(model, "likelihood", None), likelihoods.Likelihood):
        raise ValueError(f"the model {type(model).__name__} has no likelihood")
    for name, value in model.parameters().items():
        _real_array(value, f"parameter {name}")
    mean = _real_array(arrays[f"{prefix}.state.mean"], "state.mean")
    chol = _real_array(arrays[f"{prefix}.state.chol"], "state.chol")
    Q = getattr(model, "num_latents", None)  # Q latent blocks (gpvi.multilatent): (Q, d), (Q, d, d)
    lead = () if Q is None else (Q,)
    d = mean.shape[-1] if mean.ndim == 1 + len(lead) and mean.shape[:-1] == lead else 0
    if d < 1 or chol.shape != lead + (d, d) or np.any(np.triu(chol, 1)):
        q = "Q, " if lead else ""
        raise ValueError(f"the state must be a mean ({q}d) and a lower-triangular chol ({q}d, d), got shapes "
                         f"{mean.shape} and {chol.shape}")
    trace = _real_array(arrays[f"{prefix}.trace"], "trace", finite=False)
    if trace.ndim != 2 or trace.shape[1] != 2:
        raise ValueError(f"trace must have shape (K, 2), got {trace.shape}")
    n = meta["prior_leaves"]
    if type(n) is not int or not 0 <= n <= len(arrays):
        raise ValueError(f"prior_leaves = {_short(n)} is not a count of arrays in the file")
    leaves = [_real_array(arrays[f"{prefix}.prior.{i}"], f"prior.{i}") for i in range(n)]
    prior = _checked_prior(model, leaves, scalars["input_dim"], d)
    return FitResult(model=model, state=State(jnp.asarray(mean), jnp.asarray(chol)), trace=trace,
                     prior=prior, **scalars)


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
    prior = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(expected), [jnp.asarray(a) for a in leaves])
    At = jax.eval_shape(model.project, prior, jax.ShapeDtypeStruct((1, D), np.float64))[0]
    lead = () if getattr(model, "num_latents", None) is None else (model.num_latents,)
    if At.shape != lead + (d, 1):
        raise ValueError(f"the model projects onto {At.shape[-2]} weights, the state has {d}")
    return prior


def save(obj, path, extra: dict | None = None) -> Path:
    """Write a fitted object to ``path`` (one file; the ``.gpvi`` suffix is conventional).

    ``extra`` is an optional JSON-serialisable dict stored alongside (e.g. the column names
    and preprocessing that ``gpvi fit`` used); read it back with ``load(path, with_extra=True)``.
    """
    from .fit import FitResult

    if extra is not None:
        if not isinstance(extra, dict):
            raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
        try:
            extra = json.loads(json.dumps(extra, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise ValueError(f"extra must be JSON-serialisable (finite numbers, strings, lists, dicts): {err}") from None

    if isinstance(obj, FitResult):
        kind, (meta, arrays) = "FitResult", fit_result_to_arrays(obj)
    elif hasattr(obj, "_to_gpvi_file"):
        kind = type(obj).__name__
        meta, arrays = obj._to_gpvi_file()
    else:
        raise ValueError(f"cannot save a {type(obj).__name__}: expected a gpvi FitResult or estimator")
    meta = {"format": FORMAT, "version": VERSION, "kind": kind, **meta}
    if extra is not None:
        meta["extra"] = extra
    buf = _io.BytesIO()
    np.savez(buf, **{k: v for k, v in arrays.items()},
             **{"meta.json": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    path = Path(path)
    with atomic_write(path) as f:
        f.write(buf.getvalue())
    return path


def load(path, with_extra: bool = False):
    """Read an object written by :func:`save`.

    With ``with_extra=True`` return ``(obj, extra)``, ``extra`` being the dict given to
    :func:`save` (``{}`` when none was).  Raises ``ValueError`` naming the file when it is
    not a gpvi model file, is truncated, corrupt or crafted (any inconsistency in its
    metadata or arrays), or was written by a newer format version.  Every size a file
    declares (zip members, array headers, ``input_dim``) is checked before anything is
    allocated, so a damaged file cannot exhaust memory, and only the arrays the object needs
    are read.
    """
    obj, extra = _load(path)
    return (obj, extra) if with_extra else obj


# Limits on what a model file may make the reader allocate.  ``save`` stores members
# uncompressed, so a file never declares more than its own size; the allowance covers zips
# deflated by other tools.
_MIN_BUDGET = 16 << 20  # bytes of arrays any file may declare ...
_MAX_INFLATION = 16  # ... or this many times the file's size, whichever is larger
_MAX_META_BYTES = 16 << 20  # meta.json
_READ_CHUNK = 1 << 20
_ARRAY_KINDS = "biufUS"  # booleans, numbers and strings: never objects (pickles)


class _Arrays(Mapping):
    """The arrays of an open model file by name, each read on first access.

    A member is never inflated unless it is asked for, and never read unless its declared
    size (zip directory), its ``.npy`` header (shape × item size) and the bytes actually
    stored all agree and fit in the file's budget (``_MIN_BUDGET`` or ``_MAX_INFLATION`` ×
    the file's size, for all the arrays read together); a member declaring more than the
    budget (``_MAX_META_BYTES`` for meta.json) refuses the whole file.
    """

    def __init__(self, zf: zipfile.ZipFile, file_size: int):
        self._zf = zf
        self._members = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
        self._budget = max(_MIN_BUDGET, _MAX_INFLATION * file_size)
        self._cache: dict[str, np.ndarray] = {}
        for name, info in self._members.items():
            limit = _MAX_META_BYTES if name == "meta.json" else self._budget
            if info.file_size > limit:
                raise ValueError(f"{info.filename} declares {info.file_size} bytes, more than the {limit} "
                                 f"allowed in a model file of {file_size} bytes")

    def __getitem__(self, key):
        if key not in self._cache:
            info = self._members[key]
            if info.file_size > self._budget:
                raise ValueError(f"{info.filename}: the arrays declare more bytes than the file may hold")
            self._budget -= info.file_size
            self._cache[key] = _read_npy(self._zf, info)
        return self._cache[key]

    def __contains__(self, key):
        return key in self._members

    def __iter__(self):
        return iter(self._members)

    def __len__(self):
        return len(self._members)


def _read_npy(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member, its header checked against the member's size before allocating."""
    fmt = np.lib.format
    with zf.open(info) as f:
        version = fmt.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{info.filename}: unsupported .npy format version {version}")
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.itemsize == 0:
            raise ValueError(f"{info.filename}: arrays of dtype {dtype} are not part of a model file")
        nbytes = math.prod(shape) * dtype.itemsize
        if min(shape, default=0) < 0 or nbytes != info.file_size - f.tell():
            raise ValueError(f"{info.filename}: the header declares shape {shape} of {dtype} "
                             f"({nbytes} bytes) but the member holds {info.file_size - f.tell()}")
        raw = np.empty(nbytes, np.uint8)
        view, pos = memoryview(raw), 0
        while pos < nbytes:
            got = f.readinto(view[pos:pos + _READ_CHUNK])
            if not got:
                raise ValueError(f"{info.filename} is truncated")
            pos += got
    arr = raw.view(dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _read_meta(arrays: _Arrays) -> dict:
    """The parsed ``meta.json`` of a model file; JSON nested too deeply is a ValueError."""
    if "meta.json" not in arrays:
        raise ValueError("no meta.json")
    raw = arrays["meta.json"]
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError("meta.json is not stored as bytes")
    try:
        return json.loads(raw.tobytes().decode())
    except RecursionError:
        raise ValueError("meta.json is nested too deeply") from None


def _short(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about crafted contents."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _why(err: Exception) -> str:
    """An exception as a message: its text, after its type unless it is a plain ValueError."""
    return str(err) if type(err) is ValueError else f"{type(err).__name__}: {err}"


def _real_array(a, name: str, finite: bool = True) -> np.ndarray:
    """``a`` as a NumPy array of real numbers (finite unless ``finite=False``), else ValueError."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or infinite values")
    return arr


def _check_estimator(est) -> None:
    """The fitted attributes of a rebuilt estimator agree with its (checked) ``fit_result_``:
    finite input (and target) scalings of the right shapes, an input centre that is itself a
    valid input, feature names, and for a classifier one label per level of its likelihood."""
    from sklearn.base import is_classifier

    D = est.fit_result_.input_dim
    if type(est.n_features_in_) is not int or est.n_features_in_ != D:
        raise ValueError(f"n_features_in_ = {_short(est.n_features_in_)} but the fit has input_dim {D}")
    for name in ("x_mean_", "x_scale_") + type(est)._fitted_arrays:
        arr = _real_array(getattr(est, name), name)
        if arr.shape != ((D,) if name.startswith("x_") else ()) or name.endswith("scale_") and np.any(arr <= 0):
            raise ValueError(f"{name} of shape {arr.shape} does not fit a model of {D} inputs")
    models._check_X(est.x_mean_[None, :], "x_mean_")  # the training inputs' centre is a valid input
    names = getattr(est, "feature_names_in_", None)
    if names is not None and np.shape(names) != (D,):
        raise ValueError(f"feature_names_in_ of shape {np.shape(names)} does not fit a model of {D} inputs")
    if is_classifier(est):
        lik = est.fit_result_.model.likelihood
        levels = 2 if isinstance(lik, likelihoods.Bernoulli) else getattr(lik, "num_levels",
                                                                           getattr(lik, "num_classes", 0))
        if levels < 2 or np.shape(getattr(est, "classes_", None)) != (levels,):
            raise ValueError(f"classes_ must hold one label for each of the {levels} levels of the "
                             f"{type(lik).__name__} likelihood")


def _load(path):
    path = Path(path)
    with contextlib.ExitStack() as stack:
        try:
            arrays = _Arrays(stack.enter_context(zipfile.ZipFile(path)), path.stat().st_size)
            meta = _read_meta(arrays)
        except FileNotFoundError:
            raise
        except Exception as err:  # noqa: BLE001 - zipfile, numpy and json raise many kinds
            raise ValueError(f"{path} is not a readable gpvi model file (truncated, corrupt or foreign): "
                             f"{_why(err)}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a gpvi model file "
                             f"(format {_short(meta.get('format')) if isinstance(meta, dict) else None})")
        version = meta.get("version")
        if type(version) is int and version > VERSION:
            raise ValueError(f"{path} was written by a newer gpvi (format version {version} > {VERSION}); "
                             "upgrade gpvi")
        if type(version) is not int or version != VERSION:
            raise ValueError(f"{path} is a damaged gpvi model file: unknown format version {_short(version)} "
                             f"(this gpvi reads version {VERSION})")
        extra = meta.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{path} is a damaged gpvi model file: malformed extra metadata")
        from . import estimators  # noqa: F401  (registers the estimator kinds and their likelihoods)

        try:
            kind = meta["kind"]
            if kind == "FitResult":
                return fit_result_from_arrays(meta, arrays), extra
            cls = _ESTIMATORS.get(kind) if isinstance(kind, str) else None
            if cls is None:
                raise ValueError(f"unknown object kind {_short(kind)}")
            est = cls._from_gpvi_file(meta, arrays)
            _check_estimator(est)
            return est, extra
        except KeyError as err:
            raise ValueError(f"{path} is a damaged gpvi model file: missing {err}") from None
        except Exception as err:  # noqa: BLE001 - whatever a crafted file makes fail is damage
            raise ValueError(f"{path} is a damaged gpvi model file: {_why(err)}") from None


_ESTIMATORS: dict[str, type] = {}


def register_estimator(cls):
    """Let :func:`load` rebuild estimators of class ``cls`` (used by gpvi.estimators)."""
    _ESTIMATORS[cls.__name__] = cls
    return cls
