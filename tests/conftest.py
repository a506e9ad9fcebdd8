"""Shared test settings: JAX on CPU in float64 (gpvi switches x64 on at import).

Most of the suite's time is XLA compiling the same few programs (data pass, prior
factorisation, fixed-point step) for each test's shapes.  Compiled programs are therefore kept
in a persistent cache under ``.pytest_cache/jax-compile`` (ignored by git): the two xdist
workers share it, and a second run of the suite compiles almost nothing.  The cache is keyed on
the program text, the compiler options and the jaxlib version, so it cannot hand a test code
compiled for another program.  Set ``GPVI_TEST_JAX_CACHE=0`` to run without it, or to another
directory to put it elsewhere.

The suite's cache is gpvi's own (``GPVI_COMPILATION_CACHE`` names the directory, inherited by
the processes the tests start), so every writer goes through gpvi's guard
(:mod:`gpvi._compile`): an entry appears whole or not at all.  Configured for JAX directly, the
workers wrote entries in place, and one worker now and then read another's half-written entry
(JAX's warning "Error reading persistent compilation cache entry ... truncated stream", then a
second compilation), seen in clean-clone CI runs.
"""
import gc
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's LLVM backend at optimisation level 0: the suite's programs are small and each is run a
# few times, so compiling them is most of its time.  Measured cold on the 2-core machine:
# tests/objective + test_warped + test_mog 213 s -> 136 s, test_dual 62 s -> 48 s.  The HLO the
# program runs is the same (XLA's own passes are not affected), only the machine code is less
# optimised.  At that level XLA's older elementwise emitters (--xla_cpu_use_fusion_emitters=false)
# compile in half the time of the new fusion emitters: XLA's compile time for the four default
# estimators' fits 12.3 s -> 5.4 s, and the quick subset from an empty cache 467 s -> 340 s
# (both measured on the 2-core machine, 2026-11-28).  With LLVM's optimisations on, the two
# emitters compile in about the same time, so gpvi leaves the user's flags alone.  GPVI_TEST_XLA_DEFAULT=1 runs the suite with XLA's default flags; the hang tests
# always run their processes with the user's flags (tests/integration/test_hang.py).
#
# Several xdist workers share the cores: each worker's BLAS (NumPy, SciPy, and the LAPACK that
# jaxlib calls) gets cores // workers threads, and with one core each XLA's Eigen kernels run
# single-threaded too, instead of every worker's thread pools spanning all cores and preempting
# each other.  Measured on the 2-core AMD EPYC with 2 workers and a warm cache (tests/engines'
# test_stopping, test_engines and test_hard, test_mog, test_objective; 2026-11-29): 109-120 s
# as before, 96 s with BLAS limited alone, 114 s with Eigen alone, 73-80 s with both.  The
# variables a user set are kept; GPVI_TEST_SET_THREAD_VARS lists those set here, so that the
# hang tests can run their processes with the user's own threading (tests/integration).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_threads = max(1, _cores // _workers)
if _workers > 1:
    _set = [v for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS") if v not in os.environ]
    os.environ.update({v: str(_threads) for v in _set})
    os.environ["GPVI_TEST_SET_THREAD_VARS"] = ",".join(_set)
if os.environ.get("GPVI_TEST_XLA_DEFAULT", "0") != "1" and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["GPVI_TEST_USER_XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                               " --xla_cpu_use_fusion_emitters=false").strip()
if (os.environ.get("GPVI_TEST_XLA_DEFAULT", "0") != "1" and _workers > 1 and _threads == 1
        and "xla_cpu_multi_thread_eigen" not in os.environ["XLA_FLAGS"]):  # (a worker inherits the flags above)
    os.environ["XLA_FLAGS"] += " --xla_cpu_multi_thread_eigen=false"
# The suite's own cache replaces gpvi's per-user one; GPVI_TEST_JAX_CACHE=0 means none.  A full
# run leaves about 160 MB in it; the limit (gpvi's default is 256 MB) leaves room for a few runs
# of changed code before the least recently used entries are trimmed.
_cache = os.environ.get("GPVI_TEST_JAX_CACHE", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax-compile"))
os.environ["GPVI_COMPILATION_CACHE"] = _cache
os.environ.setdefault("GPVI_COMPILATION_CACHE_MAX_MB", "1024")
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # (gpvi leaves a directory configured for JAX alone)

import gpvi  # noqa: E402,F401  (enables float64 before any test builds arrays)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

if _cache != "0":
    # gpvi configured JAX at import (the directory; every program stored however fast it
    # compiled).  Where it could not (the directory cannot be made), JAX gets it directly.
    if jax.config.jax_compilation_cache_dir != _cache:
        jax.config.update("jax_compilation_cache_dir", _cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Every compiled XLA program keeps its code mapped (about 200 memory mappings per fit of a new
# shape), and the jit caches keep every program alive.  Without this guard one xdist worker of
# the full suite reached 53 592 mappings (63 600 with an extra compiled program per fit), near
# Linux's default vm.max_map_count of 65 530, past which XLA crashed (SIGSEGV/SIGABRT) while
# compiling or loading a program; with it the peak is about 21 000.  So the in-memory caches are
# dropped whenever a test leaves the process above this many mappings; the persistent cache
# above makes recompiling cheap.
_MAX_MAPS = 20000
_MAPS = Path("/proc/self/maps")


@pytest.fixture(autouse=True)
def _bounded_jit_caches():
    yield
    if _MAPS.exists():
        with _MAPS.open() as f:
            count = sum(1 for _ in f)
        if count > _MAX_MAPS:
            jax.clear_caches()
            gc.collect()


def pytest_collection_modifyitems(config, items):
    """Run the slow tests first (a stable sort: their order among themselves is kept).

    With two xdist workers, a long test that starts last leaves one core idle until it ends: in
    collection order the hang and interrupt tests (minutes each, under tests/integration) came
    near the end of the suite.  Starting the long ones first, with tests handed out one or two at
    a time (``--maxschedchunk=1`` in pyproject's addopts), lets the short ones fill the gaps."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)
