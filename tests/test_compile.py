"""Size buckets share compiled programs; the persistent compilation cache's location and opt-out."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import gpvi
import importlib

from gpvi import collapsed, objective
from gpvi import likelihoods as L
from gpvi._compile import bucket, default_cache_dir, enable_persistent_cache

fit_module = importlib.import_module("gpvi.fit")  # the module (gpvi.fit is the function)


def test_ladder():
    sizes = [bucket(n) for n in range(1, 5000)]
    assert all(s >= n for n, s in zip(range(1, 5000), sizes))
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    assert all(s % 8 == 0 for s in sizes)
    # beyond 128 rows no more than 20 % padding (ratio 2^(1/4) between rungs, rounded to 8)
    assert max(s / n for n, s in zip(range(128, 5000), sizes[127:])) < 1.21
    assert max(s / n for n, s in zip(range(16, 5000), sizes[15:])) < 1.5
    assert len(set(sizes)) < 40  # few shapes: 5 000 sizes in under 40 buckets


def _classification(rng, N):
    X = rng.normal(size=(N, 2))
    return X, (X[:, 0] + 0.5 * rng.normal(size=N) > 0).astype(float)


def test_sizes_in_one_bucket_compile_the_data_pass_once(rng):
    """Two training-set sizes in one bucket: the second fit (with hyperparameter learning)
    compiles neither the set-up, the data pass nor the bound's gradient again; a size in another
    bucket does."""
    assert bucket(310) == bucket(330) != bucket(370)
    Z = rng.normal(size=(12, 2))
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=[1.0, 1.0]), L.Bernoulli(), inducing=Z)
    programs = (objective._setup, objective._sums, fit_module._neg_vlb_and_grad)

    def fit_and_count(N):
        before = [f._cache_size() for f in programs]
        X, y = _classification(rng, N)
        # a Python-float start (weakly typed) and the learned arrays share programs as well
        gpvi.fit(model, X, y, learn_hyperparameters=["kernel.variance", "kernel.lengthscale"], max_rounds=2)
        return [f._cache_size() - b for f, b in zip(programs, before)]

    fit_and_count(310)
    assert fit_and_count(330) == [0, 0, 0]
    assert all(n >= 1 for n in fit_and_count(370))


def test_collapsed_gp_bound_compiles_once_per_bucket(rng):
    model = gpvi.GP(gpvi.kernels.RBF(), L.Gaussian(variance=0.2))
    before = collapsed._value_and_grad._cache_size()
    vals = []
    for N in (105, 115, 128):  # one bucket (128)
        X = rng.normal(size=(N, 1))
        y = np.sin(X[:, 0])
        res = gpvi.fit(model, X, y, learn_hyperparameters=True, max_rounds=3)
        vals.append(res.vlb)
    assert bucket(105) == bucket(128) == 128
    assert collapsed._value_and_grad._cache_size() - before == 1
    assert all(np.isfinite(vals))


def test_import_enables_the_persistent_cache(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPVI_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    code = "import gpvi, jax; print(jax.config.jax_compilation_cache_dir)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "xdg" / "gpvi" / "jax")
    assert (tmp_path / "xdg" / "gpvi" / "jax").is_dir()


@pytest.fixture
def no_cache_config(monkeypatch):
    """jax's cache directory unset for the test, restored afterwards (the suite's own cache)."""
    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    jax.config.update("jax_compilation_cache_dir", None)
    for k in ("GPVI_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_persistent_cache_location_and_opt_out(tmp_path, monkeypatch, no_cache_config):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPVI_COMPILATION_CACHE", "0")
    assert enable_persistent_cache() is None and jax.config.jax_compilation_cache_dir is None
    monkeypatch.setenv("GPVI_COMPILATION_CACHE", str(tmp_path / "own"))
    assert enable_persistent_cache() == str(tmp_path / "own") == jax.config.jax_compilation_cache_dir
    # a directory configured for JAX already (here the previous call's) is left as it is
    monkeypatch.setenv("GPVI_COMPILATION_CACHE", "1")
    assert enable_persistent_cache() is None and jax.config.jax_compilation_cache_dir == str(tmp_path / "own")
    jax.config.update("jax_compilation_cache_dir", None)
    assert enable_persistent_cache() == str(tmp_path / "xdg" / "gpvi" / "jax")


def test_default_cache_dir_without_xdg(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "gpvi", "jax")
