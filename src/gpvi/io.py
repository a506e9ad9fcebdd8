"""Save and load fitted gpvi objects without pickle.

A model file is a zip archive (``numpy.savez`` layout) holding ``meta.json`` — the format
name and version, the object's kind, and every component (kernel, likelihood, model) as
class name + static settings — and one ``.npy`` array per parameter and per piece of
fitted state.  Only gpvi's own classes (and classes registered with :func:`register`) can be
rebuilt, so loading a file never imports or runs code named by the file.

``save(obj, path)`` accepts a :class:`gpvi.FitResult` (of a Gaussian posterior, or the mixture
posterior's :class:`~gpvi.fitting.mog.MoGResult`) or any object with ``_to_gpvi_file`` (the
scikit-learn estimators); ``load(path)`` returns the same kind of object.
"""
from __future__ import annotations

import contextlib
import io as _io
import json
import math
import os
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from gpvi import likelihoods
from gpvi.fitting.codec import (UnknownClassError, decode, encode, fit_result_from_arrays, fit_result_to_arrays, mog_result_from_arrays,
                                mog_result_to_arrays, real_array, register, short, why)
from gpvi.fitting.mog import MoGResult
from gpvi.models.base import check_X

__all__ = ["save", "load", "register", "encode", "decode", "atomic_write", "FORMAT", "VERSION"]

#: The ``"format"`` tag in every model file gpvi writes; :func:`load` refuses a file without it.
FORMAT = "gpvi-model"
#: The model-file format version written by :func:`save`; :func:`load` refuses a newer one.
VERSION = 1


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


def save(obj, path, extra: dict | None = None) -> Path:
    """Write a fitted object to ``path`` (one file; the ``.gpvi`` suffix is conventional).

    ``extra`` is an optional JSON-serialisable dict stored alongside (e.g. the column names
    and preprocessing that ``gpvi fit`` used); read it back with ``load(path, with_extra=True)``.
    """
    from gpvi.fitting.fit import FitResult

    if extra is not None:
        if not isinstance(extra, dict):
            raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
        try:
            extra = json.loads(json.dumps(extra, allow_nan=False))
        except (TypeError, ValueError) as err:
            raise ValueError(f"extra must be JSON-serialisable (finite numbers, strings, lists, dicts): {err}") from None

    if isinstance(obj, MoGResult):
        kind, (meta, arrays) = "MoGResult", mog_result_to_arrays(obj)
    elif isinstance(obj, FitResult):
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


def _check_estimator(est) -> None:
    """The fitted attributes of a rebuilt estimator agree with its (checked) ``fit_result_``:
    finite input (and target) scalings of the right shapes, an input centre that is itself a
    valid input, feature names, and for a classifier one label per level of its likelihood."""
    from sklearn.base import is_classifier

    D = est.fit_result_.input_dim
    if type(est.n_features_in_) is not int or est.n_features_in_ != D:
        raise ValueError(f"n_features_in_ = {short(est.n_features_in_)} but the fit has input_dim {D}")
    for name in ("x_mean_", "x_scale_") + type(est)._fitted_arrays:
        arr = real_array(getattr(est, name), name)
        if arr.shape != ((D,) if name.startswith("x_") else ()) or name.endswith("scale_") and np.any(arr <= 0):
            raise ValueError(f"{name} of shape {arr.shape} does not fit a model of {D} inputs")
    check_X(est.x_mean_[None, :], "x_mean_")  # the training inputs' centre is a valid input
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
                             f"{why(err)}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not a gpvi model file "
                             f"(format {short(meta.get('format')) if isinstance(meta, dict) else None})")
        version = meta.get("version")
        if type(version) is int and version > VERSION:
            raise ValueError(f"{path} was written by a newer gpvi (format version {version} > {VERSION}); "
                             "upgrade gpvi")
        if type(version) is not int or version != VERSION:
            raise ValueError(f"{path} is a damaged gpvi model file: unknown format version {short(version)} "
                             f"(this gpvi reads version {VERSION})")
        extra = meta.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"{path} is a damaged gpvi model file: malformed extra metadata")
        from gpvi.sklearn import estimators  # the estimator kinds (imports scikit-learn: only when loading)

        try:
            kind = meta["kind"]
            if kind == "FitResult":
                return fit_result_from_arrays(meta, arrays), extra
            if kind == "MoGResult":
                return mog_result_from_arrays(meta, arrays), extra
            cls = getattr(estimators, kind) if isinstance(kind, str) and kind in estimators.__all__ else None
            if cls is None:
                raise ValueError(f"unknown object kind {short(kind)}")
            est = cls._from_gpvi_file(meta, arrays)
            _check_estimator(est)
            return est, extra
        except KeyError as err:
            raise ValueError(f"{path} is a damaged gpvi model file: missing {err}") from None
        except UnknownClassError as err:
            raise ValueError(f"cannot load {path}: {err}") from None
        except Exception as err:  # noqa: BLE001 - whatever a crafted file makes fail is damage
            raise ValueError(f"{path} is a damaged gpvi model file: {why(err)}") from None
