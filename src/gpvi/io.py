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
import os
import tempfile
import zipfile
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
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file open()'s usual mode
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
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


def _decode(spec, arrays):
    if "class" in spec:
        cls = _known_classes().get(spec["class"])
        if cls is None:
            raise ValueError(f"model file uses unknown class {spec['class']!r} "
                             "(register it with gpvi.io.register before loading)")
        kw = {k: _decode(v, arrays) for k, v in spec["fields"].items()}
        return cls(**kw)
    if "sequence" in spec:
        return tuple(_decode(v, arrays) for v in spec["sequence"])
    if "array" in spec:
        return jnp.asarray(arrays[spec["array"]])
    return spec["value"]


def fit_result_to_arrays(fit, prefix="fit"):
    """(meta dict, arrays dict) for a :class:`gpvi.FitResult`."""
    arrays: dict[str, np.ndarray] = {}
    meta = {
        "model": _encode(fit.model, arrays, f"{prefix}.model"),
        "scalars": {k: getattr(fit, k) for k in ("vlb", "iterations", "converged", "message", "engine",
                                                  "backtracks", "cycles", "evaluations", "clipped",
                                                  "hyperparameter_rounds", "seconds", "chunk_size",
                                                  "input_dim")},
    }
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
    from .fit import FitResult

    model = _decode(meta["model"], arrays)
    leaves = [jnp.asarray(arrays[f"{prefix}.prior.{i}"]) for i in range(meta["prior_leaves"])]
    # The prior cache's structure depends only on the model type (and, for a full GP, on the
    # training inputs, which are its first leaf).
    X_like = leaves[0] if isinstance(model, models.GP) else jnp.zeros((1, max(1, meta["scalars"]["input_dim"] or 1)))
    treedef = jax.tree_util.tree_structure(jax.eval_shape(model.prior_cache, X_like))
    prior = jax.tree_util.tree_unflatten(treedef, leaves)
    state = State(jnp.asarray(arrays[f"{prefix}.state.mean"]), jnp.asarray(arrays[f"{prefix}.state.chol"]))
    return FitResult(model=model, state=state, trace=np.asarray(arrays[f"{prefix}.trace"]), prior=prior,
                     **meta["scalars"])


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
    not a gpvi model file, is truncated or corrupt, or was written by a newer format version.
    """
    obj, extra = _load(path)
    return (obj, extra) if with_extra else obj


def _load(path):
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if "meta.json" not in z.files:
                raise ValueError("no meta.json")
            meta = json.loads(bytes(z["meta.json"]).decode())
            arrays = {k: z[k] for k in z.files if k != "meta.json"}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, KeyError, UnicodeDecodeError,
            json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable gpvi model file (truncated, corrupt or foreign): {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a gpvi model file (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version", 0) > VERSION:
        raise ValueError(f"{path} was written by a newer gpvi (format version {meta['version']} > {VERSION}); upgrade gpvi")
    extra = meta.get("extra") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{path} is a damaged gpvi model file: malformed extra metadata")
    from . import estimators  # noqa: F401  (registers the estimator kinds and their likelihoods)

    try:
        if meta["kind"] == "FitResult":
            return fit_result_from_arrays(meta, arrays), extra
        cls = _ESTIMATORS.get(meta["kind"])
        if cls is None:
            raise ValueError(f"unknown object kind {meta['kind']!r}")
        return cls._from_gpvi_file(meta, arrays), extra
    except (KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{path} is a damaged gpvi model file: missing or malformed {err}") from None


_ESTIMATORS: dict[str, type] = {}


def register_estimator(cls):
    """Let :func:`load` rebuild estimators of class ``cls`` (used by gpvi.estimators)."""
    _ESTIMATORS[cls.__name__] = cls
    return cls
