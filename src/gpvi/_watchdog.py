"""A watchdog that turns a hung fit into an error.

A deadlock in XLA's CPU runtime leaves the process waiting for ever with every thread idle
(see :mod:`gpvi._batching` for the one gpvi met and avoids).  While a fit runs in the main
thread, a background thread samples the process's CPU time; when the process has used less
than 1 % of one core for ``seconds`` (default 120) the main thread cannot be computing, so the
watchdog interrupts it and the fit raises :class:`HangError` naming the gpvi function that was
waiting, instead of hanging.

- The limit comes from the environment variable ``GPVI_WATCHDOG_SECONDS`` (``0`` turns the
  watchdog off) or :func:`set_watchdog`, which overrides it.
- Only fits in the main thread are watched: a signal is the one way to stop a thread that waits
  inside a compiled call, and Python delivers signals to the main thread only.
- User code that gpvi calls during a fit (callbacks, monitors) runs with the watchdog paused
  (:func:`paused`), so a debugger session or a slow ``input()`` there is not taken for a hang;
  so does a wait for a Dask cluster, whose work is done in other processes.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time

__all__ = ["HangError", "set_watchdog", "watchdog_seconds", "watch", "watched", "paused"]

DEFAULT_SECONDS = 120.0
# Below this share of one core over the whole window the process counts as idle: the sampling
# thread itself, Python's and XLA's housekeeping threads use far less.
_IDLE_SHARE = 0.01
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_override: float | None = None


class HangError(RuntimeError):
    """A compiled call made by gpvi waited for ``seconds`` with no thread of the process busy."""


def set_watchdog(seconds: float | None) -> None:
    """Set the watchdog's limit in seconds for this process (``0`` turns it off; ``None`` goes
    back to ``GPVI_WATCHDOG_SECONDS`` or the default of 120 s)."""
    global _override
    if seconds is not None:
        try:
            seconds = float(seconds)
        except (TypeError, ValueError):
            raise ValueError(f"set_watchdog: seconds must be a number of seconds ≥ 0 or None, got {seconds!r}") from None
        if not seconds >= 0.0 or seconds == float("inf"):
            raise ValueError(f"set_watchdog: seconds must be a finite number ≥ 0 (0 turns it off), got {seconds!r}")
    _override = seconds


def watchdog_seconds() -> float:
    """The limit in force: :func:`set_watchdog`'s, else ``GPVI_WATCHDOG_SECONDS``, else 120."""
    if _override is not None:
        return _override
    raw = os.environ.get("GPVI_WATCHDOG_SECONDS", "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"GPVI_WATCHDOG_SECONDS must be a number of seconds (0 turns the watchdog off), "
                         f"got {raw!r}") from None
    if not value >= 0.0 or value == float("inf"):
        raise ValueError(f"GPVI_WATCHDOG_SECONDS must be a finite number ≥ 0 (0 turns it off), got {raw!r}")
    return value


class _Monitor:
    """The sampling thread and the state it shares with the main thread (under ``lock``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.depth = 0  # nesting of watch() in the main thread
        self.pause = 0  # nesting of paused() inside it
        self.seconds = DEFAULT_SECONDS
        self.generation = 0  # changes at every arm, pause and resume: the idle clock restarts
        self.fired: str | None = None  # the message of a detected hang, until watch() raises it
        self.thread: threading.Thread | None = None

    def ensure_thread(self):
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="gpvi-watchdog", daemon=True)
            self.thread.start()

    def _active(self):
        return self.depth > 0 and self.pause == 0 and self.fired is None

    def _run(self):
        while True:
            with self.lock:
                while not self._active():
                    self.wake.wait()
                generation, seconds = self.generation, self.seconds
            interval = min(1.0, max(0.01, seconds / 20.0))
            w0, c0 = time.monotonic(), time.process_time()
            while True:
                time.sleep(interval)
                with self.lock:
                    if not self._active() or self.generation != generation:
                        break
                w, c = time.monotonic(), time.process_time()
                if c - c0 > _IDLE_SHARE * (w - w0) + 0.005:
                    w0, c0 = w, c  # busy since the reference: restart the idle clock
                    continue
                if w - w0 >= seconds:
                    self._fire(w - w0, generation)
                    break

    def _fire(self, waited, generation):
        where = _waiting_in(threading.main_thread().ident)
        message = (
            f"gpvi: a compiled call in {where} has waited {waited:.0f} s with no thread of this process "
            f"busy (less than {_IDLE_SHARE:.0%} of one core): XLA's CPU runtime has most likely "
            "deadlocked. This Python process may not be able to run JAX programs any more: restart it. "
            "Please report this message with your jax and jaxlib versions; GPVI_WATCHDOG_SECONDS "
            f"(now {self.seconds:g} s) sets the limit, 0 turns the watchdog off.")
        with self.lock:
            if not self._active() or self.generation != generation:
                return
            self.fired = message
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _waiting_in(ident) -> str:
    """The innermost gpvi function on thread ``ident``'s stack, as ``module.function (file:line)``."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE_DIR + os.sep) and not path.endswith("_watchdog.py"):
            rel = os.path.relpath(path, os.path.dirname(_PACKAGE_DIR))
            module = rel[:-3].replace(os.sep, ".") if rel.endswith(".py") else rel
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            return f"{module}.{name} ({rel}:{frame.f_lineno})"
        frame = frame.f_back
    return "gpvi"


_MONITOR = _Monitor()


def _after_fork_in_child():
    # A forked child has no sampling thread, and the lock may have been held by it at the fork.
    global _MONITOR
    _MONITOR = _Monitor()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def watch():
    """Watch the enclosed gpvi computation (see the module docstring); nested uses share the
    outermost one.  A detected hang leaves the block as :class:`HangError`."""
    seconds = watchdog_seconds()
    if seconds <= 0.0 or not _in_main_thread() or not callable(signal.getsignal(signal.SIGINT)):
        # off, another thread, or SIGINT not handled by Python (ignored: a background job; the
        # default action: it would kill the process instead of raising)
        yield
        return
    with _MONITOR.lock:
        _MONITOR.depth += 1
        outermost = _MONITOR.depth == 1
        if outermost:
            _MONITOR.seconds = seconds
            _MONITOR.fired = None
            _MONITOR.generation += 1
            _MONITOR.wake.notify_all()
    if outermost:
        _MONITOR.ensure_thread()
    try:
        yield
    except BaseException as error:
        with _MONITOR.lock:
            fired, _MONITOR.fired = _MONITOR.fired, None
        if fired is not None and outermost:
            raise HangError(fired) from error
        if fired is not None:
            with _MONITOR.lock:
                _MONITOR.fired = fired  # let the outermost watch() raise it
        raise
    finally:
        with _MONITOR.lock:
            _MONITOR.depth = max(0, _MONITOR.depth - 1)
            _MONITOR.generation += 1


def watched(fn):
    """``fn`` run inside :func:`watch` (a decorator for gpvi's entry points)."""
    @functools.wraps(fn)
    def run_watched(*args, **kwargs):
        with watch():
            return fn(*args, **kwargs)

    return run_watched


@contextlib.contextmanager
def paused():
    """Run the enclosed code (a user callback, a wait for other processes) unwatched."""
    if not _in_main_thread():
        yield
        return
    with _MONITOR.lock:
        _MONITOR.pause += 1
        _MONITOR.generation += 1
    try:
        yield
    finally:
        with _MONITOR.lock:
            _MONITOR.pause = max(0, _MONITOR.pause - 1)
            _MONITOR.generation += 1
            _MONITOR.wake.notify_all()
