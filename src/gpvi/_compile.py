"""Fewer XLA compilations: size buckets and the persistent compilation cache.

Every compiled program is specialised to its array shapes, so every new training-set size
used to cost 5–8 s of compilation before the first fit (and cross-validation paid it on every
fold of a different size).  Two remedies:

- :func:`bucket`: row counts are padded up a geometric ladder (ratio 2^(1/4), at most 20 %
  padding beyond 128 rows) with masked rows, so sizes that fall in one bucket share their compiled programs.
  The chunked data sums already ignore masked rows (:func:`gpvi.objective.make_chunks`).
- :func:`enable_persistent_cache`: compiled programs are also kept on disk, so a new process
  (a script run again, a worker of a parallel search) loads instead of compiling.  gpvi turns
  it on at import, in ``$XDG_CACHE_HOME/gpvi/jax`` (``~/.cache/gpvi/jax`` by default), unless
  the environment variable ``GPVI_COMPILATION_CACHE`` is ``0`` (off) or a directory (used
  instead), or JAX's own cache directory is already configured (``JAX_COMPILATION_CACHE_DIR``
  or ``jax.config.jax_compilation_cache_dir``), which is then left as it is.  Entries are keyed
  on the program text, the compiler options and the jaxlib version, so a stale entry is never
  used for another program.
"""
from __future__ import annotations

import math
import os

import jax

__all__ = ["bucket", "default_cache_dir", "enable_persistent_cache"]

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
    are strongly typed: the same programs were compiled twice per shape, once for each."""
    import numpy as np

    params = model.parameters()
    return model.with_parameters({k: np.asarray(v, np.float64) for k, v in params.items()}, check=False)


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/gpvi/jax``, or ``~/.cache/gpvi/jax`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpvi", "jax")


def enable_persistent_cache() -> str | None:
    """Point JAX's persistent compilation cache at gpvi's directory (see the module docstring);
    returns the directory used, or None when it was left off or to the user's configuration."""
    choice = os.environ.get("GPVI_COMPILATION_CACHE", "1").strip()
    if choice.lower() in ("0", "false", "no", "off", ""):
        return None
    if jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None  # the user's (or a test harness's) own choice
    path = default_cache_dir() if choice.lower() in ("1", "true", "yes", "on") else os.path.expanduser(choice)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None  # a read-only home: compile as before
    jax.config.update("jax_compilation_cache_dir", path)
    # JAX's default stores only programs that took ≥ 1 s to compile; a fit compiles tens of
    # programs of 0.1–1 s each, which together are most of a first fit's latency.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    return path
