"""Fits in several threads of one process (issue 14, B8).

``fit`` runs with one BLAS thread (OpenBLAS's spinning threads otherwise fight XLA for the
cores).  That limit is process-wide, so concurrent fits must share it: set by the first fit
that starts, kept while any fit runs, restored by the last one to finish — from whichever
thread each of them runs in (threadpoolctl >= 3.8 silently ignores a thread that is not its
"controlling thread").  Timing is left to the benchmarks; these tests check the limit itself
and that concurrent fits give the sequential results.
"""
import sys
import threading

import numpy as np
import pytest
import threadpoolctl
from scipy.special import expit

import gpvi
from userenv import user_environment

_fit_module = sys.modules["gpvi.fitting.runner"]
_WAIT = 120.0  # seconds; a wait that times out fails the test instead of hanging it


def _blas_threads():
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"})


def _let_go():
    clear = getattr(getattr(threadpoolctl, "OpenBLASController", None), "clear_controlling_thread", None)
    if clear is not None:
        clear()


@pytest.fixture
def two_blas_threads():
    """Start from a BLAS limit of 2 (so that 1 is visibly the fit's), restore what was there."""
    if not _blas_threads():
        pytest.skip("no BLAS library found by threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(limits=2, user_api="blas")
    _let_go()
    if _blas_threads() != [2]:
        limiter.restore_original_limits()
        _let_go()
        pytest.skip("cannot set the BLAS thread limit from this thread")
    yield
    limiter.restore_original_limits()
    _let_go()


def _problem(seed, N=40):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (N, 1))
    y = (rng.uniform(size=N) < expit(2 * np.sin(2 * X[:, 0]))).astype(int)
    return gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Bernoulli()), X, y


def _fit(problem, callback=None):
    model, X, y = problem
    return gpvi.fit(model, X, y, learn_hyperparameters=True, max_rounds=3, callback=callback)


def _same(a, b):
    np.testing.assert_allclose(np.asarray(a.state.mean), np.asarray(b.state.mean), rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(a.state.chol), np.asarray(b.state.chol), rtol=0, atol=1e-10)
    np.testing.assert_allclose(a.vlb, b.vlb, rtol=1e-12, atol=0)
    for name in ("variance", "lengthscale"):
        np.testing.assert_allclose(float(getattr(a.model.kernel, name)), float(getattr(b.model.kernel, name)),
                                   rtol=1e-10)
    assert (a.converged, a.iterations, a.hyperparameter_rounds) == (b.converged, b.iterations,
                                                                   b.hyperparameter_rounds)


def test_two_threads_give_the_sequential_results_with_one_blas_thread_throughout(two_blas_threads):
    problems = [_problem(1), _problem(2)]
    # In the main thread first: before the fix, this made the main thread threadpoolctl's
    # controlling thread for good, and the fits in the worker threads below ran unlimited.
    sequential = [_fit(p) for p in problems]
    assert _blas_threads() == [2]

    # Schedule: A starts; B starts while A runs; A finishes while B runs; then B finishes.
    # The first fit to start finishes first: with a per-call save/restore, A's restore would
    # put BLAS back on 2 threads under B's feet.
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    seen = {"A": [], "B": []}
    results, errors = {}, []

    def callback_a(iteration, vlb, seconds):
        seen["A"].append(_blas_threads())
        if not a_in.is_set():
            a_in.set()
            assert b_in.wait(_WAIT), "fit B did not start"

    def callback_b(iteration, vlb, seconds):
        if not b_in.is_set():
            b_in.set()
            assert a_done.wait(_WAIT), "fit A did not finish"
        seen["B"].append(_blas_threads())  # after A has finished and released its hold

    def worker(name):
        try:
            if name == "A":
                results["A"] = _fit(problems[0], callback_a)
                a_done.set()
            else:
                assert a_in.wait(_WAIT), "fit A did not start"
                results["B"] = _fit(problems[1], callback_b)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            a_in.set()
            b_in.set()
            a_done.set()

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * _WAIT)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert seen["A"] and seen["B"]
    assert all(s == [1] for s in seen["A"]), seen["A"]
    assert all(s == [1] for s in seen["B"]), seen["B"]
    assert _blas_threads() == [2]  # the original limit, restored by the last fit to finish
    _same(results["A"], sequential[0])
    _same(results["B"], sequential[1])


def test_the_shared_limit_counts_holders_across_threads(two_blas_threads):
    shared = _fit_module.SharedBlasLimit()
    holds = {}

    def acquire(name):
        holds[name] = shared.acquire()

    def release(name):
        holds.pop(name)()

    def in_thread(fn, name):
        t = threading.Thread(target=fn, args=(name,))
        t.start()
        t.join(_WAIT)

    in_thread(acquire, "A")  # set in one thread...
    assert _blas_threads() == [1]
    in_thread(acquire, "B")
    in_thread(release, "A")  # ... the first holder leaves: the limit stays
    assert _blas_threads() == [1]
    acquire("main")
    release("main")
    assert _blas_threads() == [1]
    in_thread(release, "B")  # ... restored by the last one, from yet another thread
    assert _blas_threads() == [2]
    release_again = shared.acquire()
    assert _blas_threads() == [1]
    release_again()
    release_again()  # a second call is a no-op, not a second release
    assert _blas_threads() == [2] and shared._active == 0


def test_a_failing_fit_releases_its_hold(two_blas_threads):
    model, X, y = _problem(3)
    with pytest.raises(ValueError):
        gpvi.fit(model, X, y[:-1])  # lengths differ
    with pytest.raises(ValueError):
        gpvi.fit(model, X, y, learn_hyperparameters=["no.such.parameter"])
    assert _fit_module.BLAS_LIMIT._active == 0
    assert _blas_threads() == [2]



_CARRY_LOOP = """
import faulthandler
import jax, jax.numpy as jnp, numpy as np
import gpvi
from gpvi.fitting import warmstart as warmstart
from gpvi._batching import map_latents

n = 400
A = np.random.default_rng(0).standard_normal((n, n))
L = jnp.asarray(np.linalg.cholesky(A @ A.T / n + np.eye(n)))
Ls = jnp.stack([L] * 3)
state = gpvi.State(jnp.zeros((3, n)), jnp.stack([jnp.eye(n)] * 3))
carry = jax.jit(lambda *a: map_latents(warmstart._carry, *a))
faulthandler.dump_traceback_later(60, exit=True)  # a hang exits with code 1
for i in range(300):  # as warmstart.carry maps the state of three latents
    out = carry(Ls, Ls * (1.0 + 0.01 * i), jnp.zeros(3), jnp.zeros(3), state)
    assert bool(jnp.all(jnp.isfinite(out.chol)))
print("finished")
"""


@pytest.mark.slow
def test_warm_start_of_several_latents_does_not_hang(tmp_path):
    """``warmstart._carry`` over three latents as gpvi maps it (one unbatched solve per latent,
    :mod:`gpvi._batching`): batched over the latents by ``jax.vmap``, this loop made XLA:CPU stop
    for good with every thread idle (jax 0.10.2, 2 cores) within 10 s in 4 of 4 runs."""
    import subprocess

    script = tmp_path / "carry.py"
    script.write_text(_CARRY_LOOP)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=user_environment())  # XLA's thread pool as a user's process has it
    assert out.returncode == 0 and "finished" in out.stdout, out.stderr[-2000:]
