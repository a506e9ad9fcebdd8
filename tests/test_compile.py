"""Size buckets share compiled programs; the persistent compilation cache's location and opt-out."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import gpvi
import importlib

from gpvi.fitting import collapsed as collapsed
from gpvi import objective
from gpvi import likelihoods as L
from gpvi._compile import bucket, default_cache_dir, enable_persistent_cache

fit_module = importlib.import_module("gpvi.fitting.hyper")  # the module of the profile search


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


@pytest.mark.slow
def test_sizes_in_one_bucket_compile_the_data_pass_once(rng):
    """Two training-set sizes in one bucket: the second fit (with hyperparameter learning)
    compiles neither the set-up, the data pass nor the bound's gradient again; a size in another
    bucket does."""
    assert bucket(310) == bucket(330) != bucket(370)
    Z = rng.normal(size=(12, 2))
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=[1.0, 1.0]), L.Bernoulli(), inducing=Z)
    # (a sparse GP's hypergradient holds q fixed over the inducing values: neg_sparse_envelope_and_grad)
    programs = (objective.chunk_setup, objective.data_sums, fit_module.neg_sparse_envelope_and_grad)

    def fit_and_count(N):
        before = [f._cache_size() for f in programs]
        X, y = _classification(rng, N)
        # a Python-float start (weakly typed) and the learned arrays share programs as well
        gpvi.fit(model, X, y, learn_hyperparameters=["kernel.variance", "kernel.lengthscale"], max_rounds=2)
        return [f._cache_size() - b for f, b in zip(programs, before)]

    fit_and_count(310)
    assert fit_and_count(330) == [0, 0, 0]
    assert all(n >= 1 for n in fit_and_count(370))


@pytest.mark.slow
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


@pytest.mark.slow
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
    """jax's cache directory unset for the test, restored afterwards with gpvi's record of it
    (the suite's own cache)."""
    from gpvi import _compile

    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
    for field in ("path", "limit", "error"):
        monkeypatch.setattr(_compile._state, field, getattr(_compile._state, field))
    jax.config.update("jax_compilation_cache_dir", None)
    for k in ("GPVI_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_the_suites_cache_is_written_through_gpvis_guard():
    """conftest.py hands the suite's cache directory to gpvi (GPVI_COMPILATION_CACHE), so that
    both xdist workers write entries whole (see test_a_cache_entry_appears_whole_or_not_at_all)
    instead of in place, as JAX's own writer does."""
    from gpvi import _compile

    if os.environ.get("GPVI_TEST_JAX_CACHE") == "0":
        pytest.skip("the suite runs without a compilation cache (GPVI_TEST_JAX_CACHE=0)")
    jax.jit(lambda x: x * 2.5 - 0.75)(np.ones(3)).block_until_ready()  # the cache is set up at a first compilation
    suite = jax.config.jax_compilation_cache_dir
    assert suite and _compile._state.path == suite
    assert _compile._state.guard is not None and _compile._state.guard.directory == suite


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


# ------------------------------------------------------- issue 30 §2: a bounded, quiet cache
def _run_python(code, cache, tmp_path, **extra_env):
    """Run ``code`` in a fresh process whose gpvi cache is ``cache``, with gpvi's default size
    limit unless ``extra_env`` sets one (not the suite's, conftest.py); programs are written to it
    however fast they compiled."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME", "GPVI_COMPILATION_CACHE_MAX_MB")}
    env.update({"GPVI_COMPILATION_CACHE": str(cache), **extra_env})
    prelude = ("import gpvi, jax, numpy as np\n"
               "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)\n")
    return subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


_SMALL_FIT = ("X = np.linspace(0, 1, 24)[:, None]\n"
              "fit = gpvi.fit(gpvi.GLM(likelihood=gpvi.likelihoods.Poisson()), X, np.arange(24) % 3)\n"
              "print(fit.converged)\n")


@pytest.mark.slow
def test_a_failed_cache_write_is_silent_and_stops_writing(tmp_path):
    """JAX warns (UserWarning "Error writing persistent compilation cache entry ...") on every
    failed write and leaves the empty or truncated entry behind; gpvi's cache swallows the error,
    removes the entry, writes nothing more in the process, and the fit goes on."""
    cache = tmp_path / "cache"
    code = ("import resource, signal\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
            + _SMALL_FIT +
            "from gpvi import _compile\n"
            "print(_compile.cache_info()['write_error'])\n")
    proc = _run_python(code, cache, tmp_path)
    assert "Warning" not in proc.stderr and "Error writing" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    converged, error = proc.stdout.splitlines()
    assert converged == "True" and "File too large" in error
    assert os.listdir(cache) == []  # no partial entries
    # a cache directory replaced by a file after start: no cache, no warning either
    code = ("import shutil\n"
            f"shutil.rmtree({str(cache)!r}); open({str(cache)!r}, 'w').close()\n" + _SMALL_FIT)
    proc = _run_python(code, cache, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "True\n", proc.stderr


def test_a_cache_entry_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """Another process may read an entry while it is being written (two xdist workers, parallel
    cross-validation jobs): JAX then reads a truncated stream, warns and compiles again.  gpvi's
    cache writes under a temporary name and renames, so at no moment does the entry's name hold
    part of the bytes; a write cut short leaves neither the entry nor the temporary file."""
    from gpvi import _compile

    class Inner:  # JAX's file cache as gpvi configures it (no eviction of its own)
        eviction_enabled = False

        def __init__(self, path):
            self._path = path

        def put(self, key, value):
            raise AssertionError("gpvi writes the entry itself")

    monkeypatch.setattr(_compile._state, "write_error", None)
    cache = _compile._guarded_cache_class()(Inner(tmp_path), str(tmp_path), 10**6)
    entry, value = tmp_path / "jit_f-1234-cache", os.urandom(50_000)
    seen = []
    real_replace = os.replace

    def watching_replace(src, dst):  # the moment the entry appears
        seen.append((os.path.exists(dst), open(src, "rb").read() == value))
        real_replace(src, dst)

    monkeypatch.setattr(_compile.os, "replace", watching_replace)
    cache.put("jit_f-1234", value)
    assert seen == [(False, True)]  # the entry did not exist until it was complete
    assert entry.read_bytes() == value and os.listdir(tmp_path) == [entry.name]

    def failing_open(path, mode="r", *args, **kwargs):  # a write cut short by a full disk
        f = open(path, mode, *args, **kwargs)
        if "w" in mode:
            real_write = f.write

            def write(data):
                real_write(data[: len(data) // 2])
                raise OSError(28, "No space left on device")

            f.write = write
        return f

    monkeypatch.setattr(_compile, "open", failing_open, raising=False)
    cache.put("jit_g-5678", os.urandom(50_000))
    assert os.listdir(tmp_path) == [entry.name]  # no partial entry, no temporary file
    assert "No space left" in _compile._state.write_error
    # and a temporary file left by a process killed mid-write goes with the cache
    (tmp_path / "jit_h-9-cache.77-1.partial").write_bytes(b"half")
    assert _compile.clear_cache(str(tmp_path)) == (1, len(value))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_cache_is_kept_under_its_size_limit(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(8):  # 320 kB of older entries, stale0 the least recently used
        entry = cache / f"stale{i}-cache"
        entry.write_bytes(os.urandom(40_000))
        os.utime(entry, (1e9 + i, 1e9 + i))
    (cache / "notes.txt").write_text("not an entry")
    proc = _run_python("print(float(jax.jit(lambda x: x * 3.0 + 1.0)(np.ones(2))[0]))", cache, tmp_path,
                       GPVI_COMPILATION_CACHE_MAX_MB="0.2")
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "4.0\n", proc.stderr
    limit = int(0.2 * 2**20)
    names = set(os.listdir(cache))
    entries = [n for n in names if n.endswith("-cache")]
    assert sum((cache / n).stat().st_size for n in entries) <= limit
    assert "stale0-cache" not in names and "stale7-cache" in names  # least recently used first
    assert any(n.startswith("jit_") for n in entries) and "notes.txt" in names
    # the limit in bytes (default 256 MB), and a bad value: a warning naming the variable, and
    # gpvi's cache off
    code = "print(gpvi._compile.cache_limit_bytes())"
    assert _run_python(code, cache, tmp_path, GPVI_COMPILATION_CACHE_MAX_MB="0.2").stdout == f"{limit}\n"
    proc = _run_python(code, cache, tmp_path)
    assert proc.stdout.strip() == str(256 * 2**20), proc.stderr
    proc = _run_python("print(jax.config.jax_compilation_cache_dir)", cache, tmp_path,
                       GPVI_COMPILATION_CACHE_MAX_MB="lots")
    assert proc.returncode == 0 and proc.stdout.strip() == "None"
    assert "GPVI_COMPILATION_CACHE_MAX_MB must be a positive number" in proc.stderr and "'lots'" in proc.stderr


@pytest.mark.slow
def test_clear_compilation_cache_empties_the_directory(tmp_path):
    cache = tmp_path / "cache"
    code = (_SMALL_FIT +
            "import os\n"
            f"print(sum(n.endswith('-cache') for n in os.listdir({str(cache)!r})))\n"
            "print(*gpvi.clear_compilation_cache())\n"
            f"print(os.listdir({str(cache)!r}))\n"
            + _SMALL_FIT)  # and the process goes on fitting
    proc = _run_python(code, cache, tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    converged, written, removed, left, again = proc.stdout.splitlines()
    assert int(written) > 0 and removed.split()[0] == written and left == "[]" and again == "True"


class _Lowerings:
    """Counts programs lowered to XLA (every jit cache miss, and every eager operation on a new
    shape, lowers one) through JAX's monitoring events, independent of gpvi's own caches."""

    EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

    def __init__(self):
        self.count = 0
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.count += 1


_LOWERINGS = None


def _lowerings():
    global _LOWERINGS
    if _LOWERINGS is None:
        _LOWERINGS = _Lowerings()
    return _LOWERINGS


def _labels(rng, N, classes):
    X = rng.normal(size=(N, 3))
    s = X[:, 0] + 0.3 * rng.normal(size=N)
    cuts = np.quantile(s, np.linspace(0, 1, classes + 1)[1:-1])
    return X, np.digitize(s, cuts)


@pytest.mark.parametrize("options, sizes, classes", [
    ({}, (60, 60), 2),  # the default small-data model, a full GP: same size, same programs
    ({}, (48, 48), 3),  # multiclass (softmax on three latents)
    ({"model": "sparse", "inducing": 20}, (90, 100), 2),  # sparse GP: two sizes in one bucket
    ({"model": "sparse", "inducing": 20}, (90, 100), 3),
])
@pytest.mark.slow
def test_a_second_fit_and_a_new_predict_size_compile_nothing(rng, options, sizes, classes):
    """Issue 32, acceptance 2: after one fit, a second default-estimator fit of a problem in the
    same size bucket (new data, learned hyperparameters) and predictions at new batch sizes
    lower no program at all, counted by JAX's own compile events."""
    counter = _lowerings()
    assert bucket(sizes[0]) == bucket(sizes[1])
    X, y = _labels(rng, sizes[0], classes)
    first = gpvi.GPClassifier(**options).fit(X, y)
    first.predict_proba(X[:5])
    before = counter.count
    X, y = _labels(rng, sizes[1], classes)
    clf = gpvi.GPClassifier(**options).fit(X, y)
    after_fit = counter.count
    p7, p11 = clf.predict_proba(X[:7]), clf.predict_proba(X[:11])
    assert (after_fit - before, counter.count - after_fit) == (0, 0)
    # the programs were shared, not skipped: the second fit learned and predicts sensibly
    assert clf.fit_result_.hyperparameter_rounds > 0
    assert p7.shape == (7, classes) and p11.shape == (11, classes)
    np.testing.assert_allclose(p11[:7], p7, atol=1e-12)
    assert np.mean(clf.predict(X) == y) > 0.6


@pytest.mark.slow
def test_the_counter_sees_a_new_shape(rng):
    """The lowering counter is not blind: a fit at a size in another bucket lowers programs."""
    counter = _lowerings()
    X, y = _labels(rng, 40, 2)
    gpvi.GPClassifier(model="sparse", inducing=20).fit(X, y)
    before = counter.count
    X, y = _labels(rng, 200, 2)
    assert bucket(40) != bucket(200)
    gpvi.GPClassifier(model="sparse", inducing=20).fit(X, y)
    assert counter.count > before


def test_several_latents_pad_rows_only_on_small_training_sets(rng):
    """Padding to a bucket costs up to 20 % more rows per pass; for several latents it is kept
    to the small sizes where a new compiled shape costs more than the padded rows."""
    from gpvi.objective import MULTI_LATENT_BUCKET_MAX, pads_rows

    Z = rng.normal(size=(8, 2))
    multi = gpvi.MultiLatent.sparse(gpvi.kernels.RBF(), gpvi.Softmax(num_classes=3), inducing=Z)
    single = gpvi.SparseGP(gpvi.kernels.RBF(), L.Bernoulli(), inducing=Z)
    assert pads_rows(multi, MULTI_LATENT_BUCKET_MAX) and not pads_rows(multi, MULTI_LATENT_BUCKET_MAX + 1)
    assert pads_rows(single, 20000)
    assert not pads_rows(gpvi.GP(gpvi.kernels.RBF(), L.Bernoulli()), 100)
    assert not pads_rows(gpvi.MultiLatent.full(gpvi.kernels.RBF(), gpvi.Softmax(num_classes=3)), 100)


def test_strong_parameters_keeps_one_array_for_a_value_given_once():
    """A kernel given once for all latents stays one set of arrays (its latents share their prior
    factorisation); separate objects with equal values stay separate; every value becomes a
    strongly typed float64 array with the value given."""
    from gpvi._compile import strong_parameters
    from gpvi.likelihoods import Softmax
    from gpvi.models import MultiLatent

    k = gpvi.kernels.RBF(variance=1.5, lengthscale=0.7)
    once = strong_parameters(MultiLatent.full([k] * 3, Softmax(num_classes=3), mean=[0.1, 0.2, 0.3]))
    assert once._same_prior() == [0, 0, 0]
    assert once.latents[2].kernel.variance is once.latents[0].kernel.variance
    assert once.latents[2].mean is not once.latents[0].mean  # the means were three values
    apart = strong_parameters(MultiLatent.full([gpvi.kernels.RBF(variance=np.array(1.5), lengthscale=np.array(0.7))
                                                for _ in range(3)], Softmax(num_classes=3)))
    assert apart._same_prior() == [0, 1, 2]
    for m in (once, apart):
        for name, v in m.parameters().items():
            assert v.dtype == np.float64 and not v.weak_type, name
    assert float(once.latents[1].kernel.variance) == 1.5 and float(once.latents[2].mean) == 0.3


def test_moving_host_arrays_to_the_device_lowers_no_program():
    """A fresh process's first fit used to lower a small program for each host array it moved to
    the device (``jnp.asarray`` of a NumPy array stages it through a compiled program per shape,
    jax 0.10): 9 of an iris fit's programs.  The chunks, the prior state, a model's parameters and
    a given starting state now go through ``jax.device_put``.  Shapes no other test uses."""
    from gpvi.fitting.problem import check_init
    from gpvi.objective import make_chunks, prior_state

    counter = _lowerings()
    rng = np.random.default_rng(0)
    before = counter.count
    ch = make_chunks(rng.normal(size=(31, 17)), rng.normal(size=31), chunk_size=8)
    s1 = prior_state(29)
    s3 = prior_state(27, num_latents=3)
    params = gpvi.kernels.RBF(lengthscale=np.full(19, 0.5)).parameters()
    C0 = np.tril(np.ones((23, 23))) + 23 * np.eye(23)
    init = check_init(gpvi.objective.State(np.ones(23), C0), 23, None)
    assert counter.count == before
    assert ch.X.shape == (4, 8, 17) and float(ch.mask.sum()) == 31
    assert s1.chol.shape == (29, 29) and s3.chol.shape == (3, 27, 27) and float(s3.chol[2, 5, 5]) == 1.0
    assert params["lengthscale"].shape == (19,) and params["lengthscale"].dtype == np.float64
    np.testing.assert_array_equal(np.asarray(init.chol), C0)
    # the counter sees the staging program that jnp.asarray of a host array lowers
    import jax.numpy as jnp
    jnp.asarray(np.zeros((37, 13)))
    assert counter.count > before


def test_a_mixture_fit_lowers_a_few_programs_and_a_second_one_none():
    """Mixture posteriors (``posterior="mog"``): the prior factors, the final means and the
    predictions are compiled programs, and the bound's program is shared between fits.  Before,
    a three-class MIX2 fit at fixed hyperparameters lowered 126 programs and its predictions 32
    (eager kernels, factorisations and a last eager evaluation of the bound), and every later fit
    of the same shapes 7 and 6 more.  Shapes no other test uses (23 rows, K = 2)."""
    from gpvi.fitting.mog import fit_mog

    counter = _lowerings()
    rng = np.random.default_rng(3)
    X = rng.normal(size=(23, 2))
    y = np.digitize(X[:, 0] + 0.3 * rng.normal(size=23), [-0.5, 0.5])
    model = gpvi.MultiLatent.full(gpvi.kernels.RBF(), gpvi.Softmax(num_classes=3))
    for learn in (False, True):
        counts = []
        for shift in (0.0, 0.1):  # a second data set of the same shapes
            before = counter.count
            r = fit_mog(model, X + shift, y, components=2, max_iter=30, learn_hyperparameters=learn)
            fitted = counter.count
            p = r.predict_proba(X[:7])
            lp = r.log_predictive_density(X[:7], y[:7])
            counts.append((fitted - before, counter.count - fitted))
            assert p.shape == (7, 3) and np.allclose(p.sum(1), 1.0) and np.all(np.isfinite(lp))
            assert np.isfinite(r.vlb) and r.evaluations > 1
        (fit1, pred1), second = counts
        assert fit1 <= 4 and pred1 <= 4, (learn, counts)
        assert second == (0, 0), (learn, counts)


def test_the_collapsed_search_maps_its_numbers_on_the_host():
    """The default regressor's search on the collapsed bound unravels θ and ravels its gradient
    in NumPy and moves the padded data with one ``device_put``: a first fit at a new size lowered
    12 programs (eager reshapes, slices and concatenations of ``ravel_pytree``, a staged copy per
    host array), now only its own.  The learned fit's VLB is checked against the collapsed bound
    evaluated again at the learned hyperparameters."""
    counter = _lowerings()
    rng = np.random.default_rng(5)
    X = rng.normal(size=(57, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=57)
    before = counter.count
    est = gpvi.GPRegressor().fit(X, y)
    assert counter.count - before <= 6, counter.count - before
    fr = est.fit_result_
    assert fr.hyperparameter_rounds > 0 and np.isfinite(fr.vlb)
    # the learned bound is the collapsed bound of the learned model (an independent evaluation)
    from gpvi.fitting.collapsed import collapsed_bound

    Xs, ys = (X - est.x_mean_) / est.x_scale_, (y - est.y_mean_) / est.y_scale_
    assert collapsed_bound(fr.model, Xs, ys) == pytest.approx(fr.vlb, rel=1e-9, abs=1e-9)


def test_a_laplace_fit_lowers_only_its_own_programs():
    """The Laplace engine's states (the Cholesky factor of ``I − S`` and the covariance it gives)
    and Ψ are compiled programs: a fit with learned hyperparameters at a new size lowered 24
    programs, 16 of them eager steps of those states; now at most 12.  The result is checked
    against an independent truth as well: Ψ(ŵ) − ½ log|H| is the log marginal it reports."""
    counter = _lowerings()
    rng = np.random.default_rng(7)
    X = rng.normal(size=(37, 2))
    y = (X[:, 0] + 0.5 * rng.normal(size=37) > 0).astype(int)
    model = gpvi.GP(gpvi.kernels.RBF(), L.Bernoulli())
    before = counter.count
    r = gpvi.fit(model, X, y, engine="laplace", learn_hyperparameters=True)
    assert counter.count - before <= 12, counter.count - before
    assert r.converged and r.hyperparameter_rounds > 0
    R = np.linalg.cholesky(np.linalg.inv(np.asarray(r.state.chol) @ np.asarray(r.state.chol).T))
    assert r.extras["log_marginal"] == pytest.approx(r.extras["psi"] - np.sum(np.log(np.diag(R))), rel=1e-9)


# ---- gpvi's compiler options (gpvi._compile.jit) ----------------------------------------------

def test_gpvi_programs_are_compiled_through_its_jit():
    """Every compiled function in gpvi's source goes through ``gpvi._compile.jit`` (and so gets
    its compiler options); a bare ``jax.jit`` would compile with XLA's defaults."""
    from pathlib import Path
    import re

    src = Path(gpvi.__file__).parent
    bare = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py") if p.name != "_compile.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"(?<!`)\bjax\.jit\b(?!`)", line)]
    assert bare == []


def test_jit_passes_its_options_to_xla(monkeypatch):
    from gpvi import _compile

    calls = []
    real = jax.jit

    def spy(fun, **kwargs):
        calls.append(kwargs)
        return real(fun, **kwargs)

    monkeypatch.setattr(_compile.jax, "jit", spy)
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=1")
    f = _compile.jit(lambda x: x + 1, static_argnames=())
    ours = {"xla_cpu_use_fusion_emitters": False}
    # the top-level version with the options, and one without for calls inside another trace
    assert [c.get("compiler_options") for c in calls] == [ours, None]
    assert all(c["static_argnames"] == () for c in calls)
    assert float(f(1.0)) == 2.0
    # an option of the caller's is added to gpvi's, and the decorator form takes options too
    calls.clear()
    _compile.jit(compiler_options={"xla_llvm_disable_expensive_passes": True})(lambda x: x)
    assert calls[0]["compiler_options"] == {**ours, "xla_llvm_disable_expensive_passes": True}
    # the user's own setting of the option in XLA_FLAGS is left to XLA: a plain jax.jit
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert _compile.compiler_options() == {}
    calls.clear()
    _compile.jit(lambda x: x)
    assert calls == [{}]


def test_a_jitted_function_with_options_works_inside_other_traces(monkeypatch):
    """JAX refuses compiler options on a jit nested in another trace: gpvi's jitted functions
    call one another, under jax.jit, jax.grad and jax.vmap, with the options on."""
    import jax.numpy as jnp
    from gpvi import _compile

    monkeypatch.setenv("XLA_FLAGS", "")
    inner = _compile.jit(lambda x: jnp.sin(x) * x)
    assert isinstance(inner, _compile._Jitted)
    outer = _compile.jit(lambda x: inner(x) + 1.0)
    x = 0.7
    assert float(outer(x)) == pytest.approx(np.sin(x) * x + 1.0, rel=1e-15)
    assert float(jax.grad(inner)(x)) == pytest.approx(np.cos(x) * x + np.sin(x), rel=1e-14)
    assert float(jax.jit(jax.grad(lambda t: outer(t)))(x)) == pytest.approx(np.cos(x) * x + np.sin(x), rel=1e-14)
    np.testing.assert_allclose(jax.vmap(outer)(jnp.arange(3.0)), np.sin(np.arange(3.0)) * np.arange(3.0) + 1.0,
                               rtol=1e-15)
    # under jax.grad the call was traced too: only a call at the top level compiles the version
    # with the options, whose attributes the function has
    assert inner._cache_size() == 0
    inner(x)
    assert inner._cache_size() == 1


_DEFAULT_OPTIONS_FITS = """
import numpy as np, gpvi
from gpvi import _compile
assert _compile.compiler_options() == _compile.COMPILER_OPTIONS, _compile.compiler_options()
rng = np.random.default_rng(0)
X = rng.normal(size=(40, 2)); y = (X[:, 0] > 0).astype(int); y3 = np.digitize(X[:, 0], [-0.5, 0.5])
gp = gpvi.fit(gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Bernoulli()), X, y, learn_hyperparameters=True)
sm = gpvi.GPClassifier(max_rounds=2).fit(X, y3)
sp = gpvi.fit(gpvi.SparseGP(gpvi.kernels.RBF(), gpvi.likelihoods.Poisson(), inducing=8), X, rng.poisson(2.0, 40),
              engine="sfp", learn_hyperparameters=True, engine_options=dict(batch_size=16, max_steps=4))
print("ok", gp.converged, np.isfinite(gp.vlb), sm.score(X, y3) > 0.5, np.isfinite(sp.vlb))
"""


@pytest.mark.slow
def test_fits_run_with_gpvis_compiler_options_on():
    """The suite's XLA flags already set the option (conftest.py), which turns gpvi's own off;
    a child process without that flag fits with the options on (full GP with learned
    hyperparameters, the default multiclass estimator, sfp).  It keeps the suite's other flags
    (LLVM at optimisation level 0: 12 -> 8.5 s), which gpvi's options do not touch."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "fusion_emitters" not in f)
    out = subprocess.run([sys.executable, "-c", _DEFAULT_OPTIONS_FITS], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "True", "True", "True", "True"], out.stdout


def test_jits_options_reach_the_compiler_and_leave_the_numbers_alone():
    """The options are handed to XLA (a misspelt one is refused when the program compiles), and
    a program of elementwise functions and a product gives the numbers of ``jax.jit`` (the
    default emitters) to rounding."""
    import jax.numpy as jnp
    from gpvi._compile import jit

    with pytest.raises(Exception, match="No such compile option"):
        jit(lambda x: x + 1, compiler_options={"xla_no_such_option": True})(jnp.ones(2))

    def f(x):
        y = jnp.exp(-x) * jnp.log1p(x * x) + jnp.tanh(x) / (1.0 + jnp.sqrt(jnp.abs(x)))
        return y @ y.T + jax.scipy.special.erf(x).sum(0)

    x = jnp.asarray(np.random.default_rng(0).normal(size=(40, 40)))
    a = np.asarray(jit(f)(x))
    b = np.asarray(jax.jit(f, compiler_options={"xla_cpu_use_fusion_emitters": True})(x))
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13 * np.abs(b).max())
