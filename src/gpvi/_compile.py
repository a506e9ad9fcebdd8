"""Fewer XLA compilations: size buckets and the persistent compilation cache.

Every compiled program is specialised to its array shapes, so every new training-set size
used to cost 5–8 s of compilation before the first fit (and cross-validation paid it on every
fold of a different size).  Two remedies:

- :func:`bucket`: row counts are padded up a geometric ladder (ratio 2^(1/4), at most 20 %
  padding beyond 128 rows) with masked rows, so sizes that fall in one bucket share their compiled programs.
  The chunked data sums already ignore masked rows (:func:`gpvi.objective.make_chunks`).
- :func:`jit`: gpvi's programs are compiled with XLA:CPU's classic loop emitters
  (:data:`COMPILER_OPTIONS`), which compile its programs in about two thirds of the time at the
  same speed of the compiled code (below).
- :func:`enable_persistent_cache`: compiled programs are also kept on disk, so a new process
  (a script run again, a worker of a parallel search) loads instead of compiling.  gpvi turns
  it on at import, in ``$XDG_CACHE_HOME/gpvi/jax`` (``~/.cache/gpvi/jax`` by default), unless
  the environment variable ``GPVI_COMPILATION_CACHE`` is ``0`` (off) or a directory (used
  instead), or JAX's own cache directory is already configured (``JAX_COMPILATION_CACHE_DIR``
  or ``jax.config.jax_compilation_cache_dir``), which is then left as it is.  Entries are keyed
  on the program text, the compiler options and the jaxlib version, so a stale entry is never
  used for another program.

The persistent cache is bounded and never noisy:

- **Size limit.**  gpvi's directory is kept under ``GPVI_COMPILATION_CACHE_MAX_MB`` megabytes
  (MiB; default 256): before an entry is written, the least recently used entries (oldest
  modification time; a cache hit touches its entry) are removed until the new one fits, so the
  directory stays within the limit (an entry larger than the limit is not stored; processes
  writing at the same time may overshoot it briefly).  A value that is not a positive number
  turns gpvi's cache off for the process and is reported: ``import gpvi`` warns (a
  ``UserWarning`` naming the variable), and the ``gpvi`` command refuses to run with one
  ``gpvi: error:`` line (:func:`config_error`).  JAX's own limit
  (``jax_compilation_cache_max_size``) is not used: it needs the ``filelock`` package, which
  gpvi does not depend on, and without it JAX turns the whole cache off with a warning.
- **Write failures are silent.**  The cache is only a speed-up, so a write that fails (disk
  full, file-size limit, a directory made read-only or removed after start) must not reach the
  user: gpvi wraps JAX's file cache for its directory, swallows the error, removes the partial
  entry it may have left, and stops writing for the rest of the process (entries already there
  are still read; :func:`cache_info` reports the error).  A failed read is a cache miss: the
  program is compiled.  JAX itself would print a ``UserWarning`` ("Error writing persistent
  compilation cache entry ...", from ``jax._src.compiler``) for every failed write and leave an
  empty or truncated entry that every later process fails to read; while gpvi's cache is on,
  those JAX warnings (``Error reading/writing persistent compilation cache entry``) are also
  filtered out, for the case this wrapping cannot cover (a corrupt entry, or a JAX version
  without the hook used here).  Nothing is printed; the command line adds no note either.
- **Clearing.**  :func:`clear_cache` (``gpvi.clear_compilation_cache()``; ``gpvi cache clear`` on
  the command line) removes the cache entries (JAX's ``*-cache`` and ``*-atime`` files) from
  gpvi's directory and nothing else; :func:`cache_info` (``gpvi cache info``) reports the
  directory, its size and the limit.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading
import warnings

import jax

__all__ = ["bucket", "jit", "compiler_options", "COMPILER_OPTIONS", "default_cache_dir", "enable_persistent_cache",
           "cache_dir", "cache_info", "cache_limit_bytes", "clear_cache", "config_error"]

CACHE_ENV = "GPVI_COMPILATION_CACHE"
MAX_MB_ENV = "GPVI_COMPILATION_CACHE_MAX_MB"
DEFAULT_MAX_MB = 256
_MB = 2**20
_OFF = ("0", "false", "no", "off", "")
_ON = ("1", "true", "yes", "on")
# JAX's file cache (jax._src.lru_cache.LRUCache) keeps entry KEY as KEY-cache (and, with its own
# eviction on, KEY-atime): clearing and trimming touch these files only.
_ENTRY_SUFFIX = "-cache"
_ATIME_SUFFIX = "-atime"
_PARTIAL_SUFFIX = ".partial"  # an entry being written (see _write_entry)
# JAX's warnings for a failed read or write of a persistent-cache entry (jax._src.compiler).
_JAX_CACHE_WARNING = r"Error (reading|writing) persistent compilation cache entry"

# XLA:CPU's loop fusions are emitted by its older LLVM IR emitters instead of the MLIR "fusion
# emitters" (jax 0.10.2).  gpvi's programs spend their run time in matrix products and LAPACK
# calls, which the option leaves alone; their compilation spends much of its time in the
# fusion emitters.  Measured on the 2-core AMD EPYC, USPS 4-7-9 with three softmax latents
# learned (benchmarks/README.md, "Compiling gpvi's programs faster"): compilation 8.5 -> 5.7 s,
# the fit at a warm cache 32.3 -> 32.5 s; sfp on kin40k 0.17 s a step with either.  The test
# suite has compiled everything this way since issue 32 (tests/conftest.py).
_FUSION_EMITTERS_FLAG = "xla_cpu_use_fusion_emitters"
COMPILER_OPTIONS = {_FUSION_EMITTERS_FLAG: False}


try:  # whether JAX is tracing a function (jax 0.10; private, hence the fallback)
    from jax._src.core import trace_state_clean as _top_level
except ImportError:  # pragma: no cover - another JAX: gpvi's programs compile with XLA's defaults
    _top_level = None


def compiler_options() -> dict:
    """The XLA options :func:`jit` compiles with: :data:`COMPILER_OPTIONS`, less any option the
    user has set in the ``XLA_FLAGS`` environment variable (their setting is kept)."""
    if _top_level is None:
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in COMPILER_OPTIONS.items() if f"--{k}" not in flags}


class _Jitted:
    """A function compiled by :func:`jit` with compiler options.  JAX refuses options on a jitted
    function called while it traces another one (the inner function is inlined into the outer
    program, which has the options), so such calls go to the same function jitted without
    them.  Attributes (``lower``, ``_cache_size``, ...) are those of the top-level version."""

    def __init__(self, fun, top, nested):
        self._top, self._nested = top, nested
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        return (self._top if _top_level() else self._nested)(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._top, name)


def jit(fun=None, **kwargs):
    """:func:`jax.jit` with gpvi's compiler options (:func:`compiler_options`).

    Use it as ``jax.jit`` is used: ``@jit``, ``@partial(jit, static_argnames=...)`` or
    ``jit(f)``.  Options given in ``compiler_options`` are added to gpvi's.  Only the outermost
    compiled function's options matter: called inside another traced function, the function is
    the plain ``jax.jit`` one (:class:`_Jitted`)."""
    if fun is None:
        return lambda f: jit(f, **kwargs)
    options = {**compiler_options(), **(kwargs.pop("compiler_options", None) or {})}
    if not options:
        return jax.jit(fun, **kwargs)
    return _Jitted(fun, jax.jit(fun, compiler_options=options, **kwargs), jax.jit(fun, **kwargs))


# The ladder: 16 · 2^(k/4) rows rounded up to a multiple of 8.
_LADDER_BASE = 16
_LADDER_STEPS_PER_DOUBLING = 4


def bucket(n: int) -> int:
    """The smallest ladder size ≥ ``n``: 16, 24, 32, 40, 48, 56, 64, 80, 88, 104, 128, 152, 184, …
    (``16 · 2^(k/4)`` rounded to a multiple of 8; at most 20 % padding beyond 128 rows)."""
    n = int(n)
    k = 0
    while True:
        size = 8 * round(_LADDER_BASE * 2.0 ** (k / _LADDER_STEPS_PER_DOUBLING) / 8)
        if size >= n:
            return size
        k += 1


def strong_parameters(model):
    """``model`` with every parameter a strongly typed float64 array.

    A Python float given by the user becomes a *weakly* typed JAX scalar, and the learned values
    are strongly typed: the same programs were compiled twice per shape, once for each.

    A value that several parameters hold (one kernel given for all latents of a
    :class:`~gpvi.models.MultiLatent`) becomes one array for all of them, so that those latents
    still share their prior factorisation (:meth:`~gpvi.models.MultiLatent._same_prior` groups by
    identity)."""
    import numpy as np

    def raw(path):  # the field's own value (parameters() gives a new array per path); the walk of
        obj = model  # gpvi._module.parameter_value, which this lower layer may not import
        for part in path.split("."):
            obj = obj[int(part)] if isinstance(obj, (tuple, list)) else getattr(obj, part)
        return obj

    converted = {}  # id of a field's value → (that value, its float64 array)
    out = {}
    for path, v in model.parameters().items():
        r = raw(path)
        if id(r) not in converted:
            converted[id(r)] = (r, np.asarray(v, np.float64))  # r kept alive: its id stays unique
        out[path] = converted[id(r)][1]
    return model.with_parameters(out, check=False)


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/gpvi/jax``, or ``~/.cache/gpvi/jax`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpvi", "jax")


class _State:
    """What gpvi manages in this process: its cache directory and limit (None when gpvi's cache
    is not on), a configuration error, the first failed write, and the live cache wrapper."""

    path: str | None = None
    limit: int | None = None
    error: str | None = None
    write_error: str | None = None
    guard = None


_state = _State()


def cache_limit_bytes() -> int:
    """The size limit of gpvi's cache directory in bytes: ``GPVI_COMPILATION_CACHE_MAX_MB``
    megabytes (MiB), 256 when unset; a ValueError naming the variable when it is not a positive
    number."""
    raw = os.environ.get(MAX_MB_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_MB * _MB
    try:
        mb = float(raw)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ValueError(f"{MAX_MB_ENV} must be a positive number of megabytes (MiB), got {raw!r} "
                         f"(unset it for the default {DEFAULT_MAX_MB}; {CACHE_ENV}=0 turns the cache off)")
    return max(int(mb * _MB), 1)


def config_error() -> str | None:
    """The problem with the cache's environment variables found at import (the cache is then
    off), or None.  The ``gpvi`` command reports it as its error."""
    return _state.error


def _choice() -> str:
    return os.environ.get(CACHE_ENV, "1").strip()


def cache_dir() -> str:
    """gpvi's cache directory: the one ``GPVI_COMPILATION_CACHE`` names, else
    :func:`default_cache_dir` (also while the cache is off, so that clearing it removes what
    earlier processes left)."""
    choice = _choice()
    if choice.lower() in _OFF + _ON:
        return default_cache_dir()
    return os.path.expanduser(choice)


def _entries(path: str):
    """[(mtime, bytes, name)] of the cache entries (``*-cache`` files) in ``path``."""
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.name.endswith(_ENTRY_SUFFIX) and e.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):  # removed meanwhile by another process
                        st = e.stat(follow_symlinks=False)
                        out.append((st.st_mtime, st.st_size, e.name))
    except FileNotFoundError:
        pass
    return out


def _remove_entry(path: str, name: str) -> None:
    key = name[: -len(_ENTRY_SUFFIX)]
    for f in (name, key + _ATIME_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, f))


def trim_cache(path: str, max_bytes: int) -> int:
    """Remove the least recently used entries of the cache in ``path`` (oldest modification
    time first) until their total size is at most ``max_bytes``; returns the total left."""
    entries = sorted(_entries(path))
    total = sum(size for _, size, _ in entries)
    for _, size, name in entries:
        if total <= max_bytes:
            break
        _remove_entry(path, name)
        total -= size
    return total


def clear_cache(path: str | None = None) -> tuple[int, int]:
    """Remove every compiled program from gpvi's cache directory (:func:`cache_dir`, or
    ``path``): JAX's ``*-cache`` and ``*-atime`` files and the ``*.partial`` files of writes that
    were cut short, nothing else.  Returns the number of
    programs removed and the bytes they took.  Programs already loaded in this process stay
    loaded; later processes compile again.  Exposed as ``gpvi.clear_compilation_cache``."""
    path = cache_dir() if path is None else os.fspath(path)
    count = size = 0
    for _, nbytes, name in _entries(path):
        _remove_entry(path, name)
        count += 1
        size += nbytes
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(path):
            # an -atime file without its entry, or an entry whose writer was killed mid-write
            if name.endswith((_ATIME_SUFFIX, _PARTIAL_SUFFIX)) and os.path.isfile(os.path.join(path, name)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(path, name))
    if _state.guard is not None:
        _state.guard.forget_size()
    return count, size


def cache_info() -> dict:
    """gpvi's compilation cache: ``directory``, ``entries`` (compiled programs), ``bytes``,
    ``limit_bytes``, ``active`` (whether this process uses it), ``note`` (why not, or None) and
    ``write_error`` (the first failed write of this process, or None).  A ValueError when
    ``GPVI_COMPILATION_CACHE_MAX_MB`` is not a positive number."""
    path = cache_dir()
    limit = cache_limit_bytes()
    entries = _entries(path)
    active = _state.path is not None and jax.config.jax_compilation_cache_dir == _state.path
    note = None
    if not active:
        if _choice().lower() in _OFF:
            note = f"off ({CACHE_ENV}={_choice()})"
        elif jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
            own = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
            note = f"not used: JAX's own cache directory {own} is configured"
        else:
            note = "not used: the directory could not be created"
    return {"directory": path, "entries": len(entries), "bytes": sum(e[1] for e in entries),
            "limit_bytes": limit, "active": active, "note": note, "write_error": _state.write_error}


def _write_entry(entry: str, value: bytes) -> None:
    """Write the cache entry ``entry`` so that no reader ever sees it partly written.

    JAX's file cache writes an entry in place.  A second process that loads the same program
    meanwhile (two pytest-xdist workers, parallel cross-validation jobs) reads a truncated
    stream, warns ("Error reading persistent compilation cache entry ... truncated stream") and
    compiles again.  Here the bytes go to a temporary file in the same directory, which is then
    renamed onto the entry (an atomic replacement on POSIX and Windows); on failure the
    temporary file is removed and the error raised."""
    tmp = f"{entry}.{os.getpid()}-{threading.get_ident()}{_PARTIAL_SUFFIX}"
    try:
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, entry)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _guarded_cache_class():
    from jax._src.compilation_cache_interface import CacheInterface

    class _GuardedCache(CacheInterface):
        """JAX's file cache for gpvi's directory, kept within the size limit and never raising:
        a failed read is a miss; an entry appears whole or not at all (:func:`_write_entry`);
        the first failed write is recorded, its partial entry removed, and nothing more is
        written in this process."""

        def __init__(self, inner, path: str, limit: int):
            self._inner = inner
            self._path = inner._path
            self.directory = path
            self.limit = limit
            self._lock = threading.Lock()
            self._size = None  # bytes of entries in the directory, as far as this process knows

        def forget_size(self):
            self._size = None

        def get(self, key):
            try:
                value = self._inner.get(key)
            except Exception:  # unreadable: compile instead
                return None
            if value is not None:  # used now: the last to be trimmed
                with contextlib.suppress(OSError):
                    os.utime(os.path.join(self.directory, key + _ENTRY_SUFFIX))
            return value

        def put(self, key, value):
            if _state.write_error is not None or len(value) > self.limit:
                return
            entry = os.path.join(self.directory, key + _ENTRY_SUFFIX)
            with self._lock:
                if os.path.exists(entry):  # JAX never replaces an entry
                    return
                try:
                    if self._size is None or self._size + len(value) > self.limit:
                        self._size = trim_cache(self.directory, self.limit - len(value))
                    if getattr(self._inner, "eviction_enabled", False):
                        self._inner.put(key, value)  # JAX's own eviction: its put, under its lock
                    else:
                        _write_entry(entry, value)
                    self._size += len(value)
                except Exception as err:  # disk full, file-size limit, read-only, removed
                    _state.write_error = f"{type(err).__name__}: {err}"
                    with contextlib.suppress(OSError):
                        os.unlink(entry)  # an empty or truncated entry would fail every later read

    return _GuardedCache


def _install_guard() -> bool:
    """Wrap the file cache JAX builds for gpvi's directory (``jax._src.compilation_cache.
    get_file_cache``, which JAX calls once, at the first compilation); other directories are
    left to JAX.  False when this JAX has no such hook."""
    try:
        from jax._src import compilation_cache as cc

        guarded = _guarded_cache_class()
    except Exception:
        return False
    original = getattr(cc, "get_file_cache", None)
    if not callable(original):
        return False
    if getattr(original, "_gpvi_guard", False):
        return True

    def get_file_cache(path, *args, **kwargs):
        mine = _state.path
        if mine is None or os.path.abspath(os.fspath(path)) != os.path.abspath(mine):
            return original(path, *args, **kwargs)
        try:
            made = original(path, *args, **kwargs)
        except Exception as err:  # e.g. the directory was replaced by a file: no cache
            _state.write_error = f"{type(err).__name__}: {err}"
            return None
        if made is None:
            return None
        cache, where = made
        _state.guard = guarded(cache, mine, _state.limit)
        return _state.guard, where

    get_file_cache._gpvi_guard = True
    cc.get_file_cache = get_file_cache
    return True


def enable_persistent_cache() -> str | None:
    """Point JAX's persistent compilation cache at gpvi's directory (see the module docstring);
    returns the directory used, or None when it was left off or to the user's configuration."""
    _state.path = _state.limit = _state.error = None
    choice = _choice()
    if choice.lower() in _OFF:
        return None
    if jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None  # the user's (or a test harness's) own choice
    try:
        limit = cache_limit_bytes()
    except ValueError as err:
        _state.error = str(err)
        if "_gpvi_cli" not in sys.modules:  # the gpvi command reports it as its one error line
            warnings.warn(f"{err}; gpvi's compilation cache is off", UserWarning, stacklevel=3)
        return None
    path = cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None  # a read-only home: compile as before
    _state.path, _state.limit = path, limit
    if not _install_guard():  # bound it at least between processes
        with contextlib.suppress(OSError):
            trim_cache(path, limit)
    warnings.filterwarnings("ignore", message=_JAX_CACHE_WARNING, category=UserWarning)
    jax.config.update("jax_compilation_cache_dir", path)
    # JAX's default stores only programs that took ≥ 1 s to compile; a fit compiles tens of
    # programs of 0.01–1 s each, which together are most of a first fit's latency.  All are
    # stored: with a threshold of 0.1 s, 27 of the 42 programs of a default iris fit were
    # compiled again in every new process (1.2 s); stored, all 42 load in 0.3–0.5 s and the
    # first fit of a new process took 3.0–4.1 s instead of 4.7 s (616 KB of cache).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
