"""What the minibatch engines (``sfp``, ``svi``) share: option checks, the stream of a fitted
Objective's data, batches as JAX chunks, the epoch loop with its clock (full-data VLBs for the
trace are taken off the clock), and the error that keeps the last complete state when a
stream fails mid-epoch."""
from __future__ import annotations

import numbers
import time

import jax
import numpy as np

from gpvi.objective import Chunks, Objective, State, vlb_in_hyperparameters
from gpvi.data.stream import Stream, StreamObjective, from_arrays
from gpvi._watchdog import paused
from gpvi.engines._common import STOPPED, EngineResult, Progress, call_on_state, check_on_state
from gpvi._compile import jit

DEFAULT_BATCH = 1024


def step_limit(max_steps, max_iter):
    """The most minibatch steps of a run: the smaller of the engine's ``max_steps`` option and
    :func:`gpvi.fit`'s ``max_iter`` (an iteration of a stochastic engine is one step); None
    where neither is set."""
    limits = [int(v) for v in (max_steps, max_iter) if v is not None]
    return min(limits) if limits else None


def paper_step_size(t: int) -> float:
    """The step size named ``"paper"`` in every minibatch engine (``sfp``'s ``schedule``,
    ``ivsgpr``'s ``step_size``): Cheng & Boots (2016)'s γ_t = 1/(1 + √t) for step t = 1, 2, …
    (the first step has γ = 1/2).  Schedules are always called with the step's number counted
    from 1."""
    return 1.0 / (1.0 + np.sqrt(t))


class StreamError(ValueError):
    """A stream failed (bad batch, changed file, exhausted iterator) part-way through a fit.

    ``result`` is the :class:`~gpvi.engines._common.EngineResult` at the last completed step
    (a usable posterior: every step yields a valid state), or None if no step had completed.
    """

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


def check_positive_int(name, v, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {v!r}")
    return int(v)


def check_positive_float(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return float(v)


def check_model(model, engine):
    """The minibatch engines need a prior that does not grow with the data (GLM, SparseGP)."""
    if type(model).__name__ == "GP":
        raise ValueError(f"engine {engine!r} streams minibatches and needs a GLM or SparseGP model; a full GP "
                         "has one weight per training row (use engine='fpi', or a SparseGP)")
    return model


def objective_stream(objective: Objective) -> Stream:
    """The (already validated, internally coded) rows of an :class:`Objective` as a stream."""
    N = objective.num_data
    y = np.asarray(objective.chunks.y).reshape(-1)[:N]  # make_chunks pads at the end
    off = np.asarray(objective.chunks.offset).reshape(-1)[:N]
    s = from_arrays(np.asarray(objective.X), y, off)
    s.validated = True
    return s


def setup(objective, batch_size, engine, default_batch):
    """``(model, stream, data, N, B)`` of a stochastic engine's run: the objective's model checked
    for ``engine``; the stream (a :class:`~gpvi.data.stream.StreamObjective`'s, or an
    in-memory :class:`Objective`'s rows); the in-memory Objective (``data``, for the full-data
    VLB of the trace and the final gap) or None for a stream; the stream's row count and the
    batch size (``default_batch(N)`` when ``batch_size`` is None; ``ValueError`` outside 1..N)."""
    if isinstance(objective, StreamObjective):
        data, stream = None, objective.stream
    elif isinstance(objective, Objective):
        data, stream = objective, objective_stream(objective)
    else:
        raise ValueError(f"engine {engine!r} runs on a gpvi.objective.Objective (data in memory) or a "
                         f"gpvi.data.stream.StreamObjective (a stream), got {type(objective).__name__}")
    model = check_model(objective.model, engine)
    N = stream.count_rows()
    B = default_batch(N) if batch_size is None else check_positive_int("batch_size", batch_size)
    if B > N:
        raise ValueError(f"batch_size {B} is larger than the number of rows N = {N}")
    return model, stream, data, N, B


def to_chunk(batch, likelihood, validate: bool) -> Chunks:
    """A :class:`~gpvi.stream.Batch` as a one-chunk :class:`Chunks` of JAX arrays; ``y``
    checked and coded by the likelihood when ``validate`` (errors name the batch)."""
    y = batch.y
    if validate:
        try:
            y = likelihood.validate(y)
        except ValueError as err:
            raise ValueError(f"batch {batch.index} of epoch {batch.epoch}: {err}") from None
    # device_put: jnp.asarray would stage each host array through a small program per shape
    return Chunks(*jax.device_put((batch.X, y, batch.offset, batch.mask)))


class EpochClock:
    """Seconds spent stepping (full-data evaluations for the trace are excluded), rows/s, and
    the (seconds, VLB) trace."""

    def __init__(self, callback=None):
        self.callback = callback
        self.t0 = time.perf_counter()
        self.paused = 0.0
        self.rows: list[tuple[float, float]] = []
        self.rows_done = 0

    def now(self):
        return time.perf_counter() - self.t0 - self.paused

    def off_clock(self, f, *args):
        t = time.perf_counter()
        try:
            with paused():
                return f(*args)
        finally:
            self.paused += time.perf_counter() - t

    def record(self, vlb, iteration):
        t = self.now()
        self.rows.append((t, float(vlb)))
        if self.callback is not None:
            with paused():
                self.callback(iteration, float(vlb), t)

    @property
    def trace(self):
        return np.asarray(self.rows, dtype=np.float64).reshape(-1, 2)

    def rate(self):
        t = self.now()
        return self.rows_done / t if t > 0 else float("nan")


_full_vlb = jit(vlb_in_hyperparameters, static_argnames=("blocks",))


def full_vlb(objective: Objective | None, model, state: State):
    """The full-data VLB at ``state`` under ``model`` (its hyperparameters may differ from the
    objective's); None without data in memory."""
    if objective is None:
        return None
    if model is objective.model:
        return float(objective.vlb(state))
    return float(_full_vlb(model, objective.X, objective.chunks, state, blocks=objective.blocks))


def finish(objective, model, state, vlb_est, steps, epochs_done, B, clock, tol, tol_nats, extras,
           message, interrupted=False):
    """The :class:`EngineResult` of a stochastic run: the full-data VLB and estimated gap at
    the final state when the data are in memory (off the clock), else the last epoch's mean
    minibatch estimate of the VLB and a NaN gap."""
    from gpvi.engines._common import estimated_gap, gap_threshold

    gap, converged = float("nan"), False
    if objective is not None:
        obj = objective if model is objective.model else Objective(
            model, objective.X, np.asarray(objective.chunks.y).reshape(-1)[:objective.num_data],
            np.asarray(objective.chunks.offset).reshape(-1)[:objective.num_data],
            chunk_size=objective.chunks.mask.shape[1])
        sums = clock.off_clock(obj.sums, state)
        vlb = float(sums.vlb)
        gap = float(estimated_gap(state, sums.grad, sums.S)[0])
        converged = bool(np.isfinite(vlb) and gap <= gap_threshold(vlb, tol, tol_nats))
        extras["evaluations"] = obj.num_evaluations
    else:
        vlb = float(vlb_est)
    extras.update(steps=steps, epochs=epochs_done, batch_size=B, rows_per_second=clock.rate())
    if interrupted:
        extras["interrupted"] = True
    if not clock.rows or clock.rows[-1][1] != vlb:
        clock.rows.append((clock.now(), vlb))
    msg = f"{message}; {steps} minibatch step(s) of {B} rows in {epochs_done:g} epoch(s)"
    if np.isfinite(gap):
        msg += f"; estimated gap {gap:.3g} nats"
    return EngineResult(state, vlb, steps, converged, msg, clock.trace, evaluations=extras.pop("evaluations", 0),
                        extras=extras, gap=gap)


def drive(*, stream: Stream, batch_size, epochs, seed, max_steps, eval_every, objective, clock,
          step, current, likelihood, tol, tol_nats, extras, message, on_batch=None, on_state=None):
    """Run ``step`` over the minibatches of ``epochs`` passes over ``stream`` and return the
    :class:`EngineResult` (see :func:`finish`).

    ``step(chunk, scale, t)`` updates the engine's own state from one batch (``scale`` = N / rows
    of the batch, ``t`` = steps so far) and returns the minibatch VLB estimate at the state it
    started from, or None when the update was refused as not finite (the run then stops, keeping
    the last finite state); ``current()`` returns ``(model, state)``.  The full-data VLB is
    recorded for the trace every ``eval_every`` steps (or at the end of each epoch when None),
    off the clock, when the data are in memory (``objective``); a stream alone records the mean
    minibatch estimate of each epoch.  Ctrl-C stops the run at the last completed step;
    a stream that fails raises :class:`StreamError` carrying the result at that step.
    ``on_batch(epoch, steps, rows_done, seconds)`` is called after every step (progress) and
    ``on_state(model, state, progress)`` (:class:`~gpvi.engines._common.Progress`, ``iteration``
    the steps taken) at every trace row, off the clock (checkpoints, test metrics); the run ends
    there, with the message :data:`~gpvi.engines._common.STOPPED`, when it returns True.
    """
    check_on_state(on_state)
    validate = not getattr(stream, "validated", False)
    N = stream.count_rows()
    B = int(batch_size)
    if B > N:
        raise ValueError(f"batch_size {B} is larger than the number of rows N = {N}")
    steps, epoch_rows, epochs_done, ests = 0, 0, 0.0, []
    stop = message

    def done(msg, interrupted_=False):
        model, state = current()
        est = float(np.mean(ests)) if ests else float("nan")
        return finish(objective, model, state, est, steps, epochs_done, B, clock, tol, tol_nats, dict(extras),
                      msg, interrupted_)

    def record():
        model, state = current()
        v = clock.off_clock(full_vlb, objective, model, state)
        v = float(v if v is not None else (np.mean(ests) if ests else np.nan))
        clock.record(v, steps)
        if on_state is not None and clock.off_clock(call_on_state, on_state, model, state,
                                                    Progress(steps, v, clock.now())):
            raise _Stop(f"{STOPPED} after {steps} step(s)")

    try:
        if objective is not None:
            record()
        for epoch in range(epochs):
            ests, epoch_rows = [], 0
            for batch in stream.minibatches(B, epoch=epoch, seed=seed):
                chunk = to_chunk(batch, likelihood, validate)
                v = step(chunk, N / batch.rows, steps)
                if v is None:
                    stop = f"stopped: a step from batch {batch.index} of epoch {epoch} gave a non-finite state"
                    raise _Stop
                steps += 1
                ests.append(float(v))
                epoch_rows += batch.rows
                clock.rows_done += batch.rows
                epochs_done = epoch + epoch_rows / N
                if on_batch is not None:
                    on_batch(epoch, steps, clock.rows_done, clock.now())
                if eval_every is not None and steps % eval_every == 0:
                    record()
                if max_steps is not None and steps >= max_steps:
                    stop = f"reached {max_steps} step(s)"
                    raise _Stop
            if eval_every is None:
                record()
    except _Stop as why:
        stop = why.args[0] if why.args else stop
    except KeyboardInterrupt:
        return done(f"interrupted in epoch {int(epochs_done)}; the state of the last completed step is kept", True)
    except ValueError as err:
        res = done(f"stream failed: {err}", True) if steps else None
        raise StreamError(f"{err} (the fit stopped after {steps} completed step(s); the state after the last "
                          "one is in this error's .result)", res) from None
    return done(stop)


class _Stop(Exception):
    pass
