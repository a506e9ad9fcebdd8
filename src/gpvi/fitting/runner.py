"""Engine runs of a :func:`gpvi.fit`: the :class:`Runner` that builds each run's objective, calls
the engine and adds up what the runs did, the fit's starting state (:func:`start`) and the one
BLAS thread the process keeps while any fit runs (:data:`BLAS_LIMIT`)."""
from __future__ import annotations

import dataclasses
import sys
import threading
import time

import threadpoolctl
from threadpoolctl import threadpool_limits

from gpvi import engines as _engines
from gpvi.data.executors import BlockObjective
from gpvi.engines._common import Progress, call_on_state, check_on_state
from gpvi.models.base import GP
from gpvi.objective import Objective, State, prior_state
from gpvi._watchdog import paused

__all__ = ["Runner", "Counts", "start", "progress_callback", "SharedBlasLimit", "BLAS_LIMIT"]


class SharedBlasLimit:
    """One BLAS thread while any :func:`gpvi.fit` runs, shared by all threads of the process.

    BLAS thread limits are process-wide (``openblas_set_num_threads``), and a per-call
    ``threadpool_limits`` made concurrent fits 5-30x slower than the same fits in a row
    (OpenBLAS's spinning threads then fight XLA for the cores), for two reasons:

    - each call saved and restored the process's limit, so the first fit to finish put
      OpenBLAS back on every core while the other was still running (and a fit that started
      inside another one saved the other's 1 as "the original");
    - threadpoolctl >= 3.8 lets only one thread at a time change the limits of a pthreads
      OpenBLAS (the first that calls it, for as long as it lives unless it lets go) and silently
      ignores the others; a bare ``threadpool_limits`` call never lets go, so after one fit in
      the main thread no fit in any other thread was limited at all.

    Here the first active fit sets the limit and the last one to finish restores the limits
    the first one found; a lock makes the count and the set/restore one step, and each
    set/restore lets go of threadpoolctl's control at once, so the next one can come from any
    thread.  (If another thread holds that control, e.g. inside the user's own
    ``with threadpool_limits(...)``, the limits are that thread's to decide and are left alone.)
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._limiter = None

    @staticmethod
    def _let_go():
        cls = getattr(threadpoolctl, "OpenBLASController", None)
        clear = getattr(cls, "clear_controlling_thread", None)  # threadpoolctl >= 3.8
        if clear is not None:
            clear()  # only if this thread holds the control

    def acquire(self):
        """Hold the limit; returns a zero-argument function that releases it (once)."""
        with self._lock:
            if self._active == 0:
                try:
                    self._limiter = threadpool_limits(limits=1, user_api="blas")
                finally:
                    self._let_go()
            self._active += 1
        released = []

        def release():
            with self._lock:
                if released:
                    return
                released.append(True)
                self._active -= 1
                if self._active == 0:
                    limiter, self._limiter = self._limiter, None
                    try:
                        limiter.restore_original_limits()
                    finally:
                        self._let_go()

        return release


#: The process's one :class:`SharedBlasLimit` (held by every :class:`Runner` and by
#: :func:`gpvi.fit_stream`).
BLAS_LIMIT = SharedBlasLimit()


def progress_callback(progress, engine):
    """A ``callback(iteration, vlb, seconds)`` that drives a tqdm bar on stderr (with a ``close``
    attribute), or None when ``progress`` is false."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    bar = tqdm(desc=f"gpvi {engine}", unit="it", file=sys.stderr, leave=False)

    def cb(iteration, vlb, seconds):
        bar.update(1)
        bar.set_postfix(vlb=f"{vlb:.6g}", seconds=f"{seconds:.2f}")

    cb.close = bar.close
    return cb


@dataclasses.dataclass
class Counts:
    """What the engine runs of a fit did, summed over the runs: damped steps, detected 2-cycles,
    passes over the data, steps with γ clipped, iterations."""

    backtracks: int = 0
    cycles: int = 0
    evaluations: int = 0
    clipped: int = 0
    iterations: int = 0

    def add(self, res) -> None:
        """Add the counts of one ``EngineResult``."""
        self.backtracks += res.backtracks
        self.cycles += res.cycles
        self.evaluations += res.evaluations
        self.clipped += res.clipped
        self.iterations += res.iterations


class Runner:
    """Runs the problem's engine: ``runner(model, start, tol)`` builds the objective of ``model``
    on the problem's data, runs the engine from ``start`` and returns ``(objective, result,
    trace)``, the trace's clock shifted to seconds since ``t0`` (the start of the fit).  Every run
    adds to :attr:`counts`.

    A context manager: inside it the process keeps one BLAS thread (:data:`BLAS_LIMIT`); leaving
    it closes the progress bar and the problem's executor plan.  :meth:`callback` is the fit's
    per-iteration callback (progress bar and the user's ``callback``); :meth:`on_state` shows
    a search round's model and state to the user's ``on_state`` hook, which the engine runs that
    are not ``quiet`` get too.  :attr:`stopped` turns True when the hook asks the fit to stop;
    the strategies then end with what they have.
    """

    def __init__(self, problem, t0: float, progress=False, callback=None, on_state=None):
        self.problem = problem
        self.t0 = t0
        self.counts = Counts()
        self.shift = 0.0  # seconds from t0 to the start of the current engine run
        self._user = callback
        self._on_state = check_on_state(on_state)
        self.stopped = False
        self._progress = None
        self._release = None
        self._show = progress

    def __enter__(self):
        self._progress = progress_callback(self._show, self.problem.engine.name)
        # On the CPU, jaxlib's Cholesky and triangular solves call SciPy's OpenBLAS, whose idle
        # threads keep spinning after each small M×M step and steal the cores XLA needs for the
        # next O(N·M²) data pass (measured: an fpi iteration 76 → 40 ms at N = 20 000, M = 200).
        # One limit for the whole process while any fit runs (see SharedBlasLimit).
        self._release = BLAS_LIMIT.acquire()
        return self

    def __exit__(self, *exc):
        try:
            self._release()
            if self._progress is not None:
                self._progress.close()
        finally:
            if self.problem.plan is not None:
                self.problem.plan.close()
        return False

    def callback(self, iteration, vlb, seconds, shift=True):
        """Forward one iteration to the progress bar and the user's callback, ``seconds`` counted
        from the start of the current run (``shift=True``) or from ``t0`` (``shift=False``)."""
        for f in (self._progress, self._user):
            if f is not None:
                with paused():
                    f(iteration, vlb, seconds + (self.shift if shift else 0.0))

    @property
    def watching(self) -> bool:
        """Whether the user gave an ``on_state`` hook."""
        return self._on_state is not None

    def on_state(self, model, state, progress: Progress, shift=True) -> bool:
        """Show ``(model, state)`` to the user's hook, ``progress.seconds`` counted from the start
        of the current run (``shift=True``; passed on counted from ``t0``) or from ``t0``; True,
        and :attr:`stopped`, when it asks to stop."""
        if self._on_state is not None and not self.stopped:
            if shift:
                progress = dataclasses.replace(progress, seconds=progress.seconds + self.shift)
            self.stopped = call_on_state(self._on_state, model, state, progress)
        return self.stopped

    def objective(self, model):
        """The objective of ``model`` on the problem's data (block-wise for a source)."""
        p = self.problem
        if p.source is not None:
            obj = BlockObjective(model, p.source, plan=p.plan, prior_X=p.X if isinstance(model, GP) else None)
        else:
            obj = Objective(model, p.X, p.y, p.offset, chunk_size=p.chunk_size, cache_bytes=p.cache_bytes)
        return obj

    def start_clock(self) -> None:
        """Mark the start of an engine run: its trace and callback seconds count from here."""
        self.shift = time.perf_counter() - self.t0

    def shifted(self, trace):
        """An engine run's trace with its clock in seconds since ``t0``."""
        trace = trace.copy()
        trace[:, 0] += self.shift
        return trace

    def __call__(self, model, start, tol, quiet=False, obj=None, **extra):
        """Run the engine on ``model`` from ``start`` (a State, or a function of the new objective
        that returns one: a warm start, see :mod:`gpvi.fitting.warmstart`) to relative tolerance
        ``tol`` (``tol_nats`` is scaled by ``tol / problem.tol``); ``quiet`` runs without the
        callback; ``obj`` reuses an objective of ``model``; ``extra`` goes to the engine."""
        p = self.problem
        if obj is None:
            obj = self.objective(model)
        self.start_clock()
        if callable(start):  # a warm start that depends on the new prior (gpvi.fitting.warmstart)
            start = start(obj)
        if p.engine.certifies:
            # inner runs of the hyperparameter search use a smaller tol, and so a smaller tol_nats
            gap_kw = {"tol_nats": None if p.tol_nats is None else p.tol_nats * tol / p.tol}
        else:
            gap_kw = {}
        # (once the hook has stopped a search, the run that fits q at its hyperparameters is unwatched)
        watch = None if quiet or not self.watching or self.stopped else self.on_state
        res = p.engine.run(obj, start, tol=tol, max_iter=p.max_iter, callback=None if quiet else self.callback,
                           on_state=watch, **gap_kw, **p.options, **extra)
        self.counts.add(res)
        return obj, res, self.shifted(res.trace)


def start(problem) -> tuple[State, Objective | None]:
    """``(state, objective)``: the fit's starting state, and for ``init="laplace"`` (the Laplace
    approximation, Sheth et al. 2015, §5) the Objective it was computed on (else None), which
    the first engine run reuses."""
    if problem.init in (None, "prior"):
        return prior_state(problem.d, problem.Q), None
    if not isinstance(problem.init, str):
        return problem.init, None
    if "laplace" not in _engines.ENGINES:
        raise ValueError("init='laplace' needs the laplace engine, which is not available")
    p = problem
    obj = Objective(p.model, p.X, p.y, p.offset, chunk_size=p.chunk_size, cache_bytes=p.cache_bytes)
    return _engines.get("laplace")(obj, prior_state(obj.dim)).state, obj
