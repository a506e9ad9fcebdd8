"""The ``gpvi`` command's parser and entry point: sub-commands, one-line errors and exit codes,
Ctrl-C handling, and ``gpvi cache``."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import signal
import sys
import threading
import time

import numpy as np
from gpvi import kernels as _kernels
from gpvi.fitting import defaults as _defaults
from gpvi.cli.common import (AUTO_INTEGER_CLASSES, LIKELIHOODS, MAX_CLASSES, MODELS, OUTPUTS,
                             UsageError, one_line, remove_stray_temporaries)
from gpvi.cli.demo import cmd_demo
from gpvi.cli.fit import cmd_fit
from gpvi.cli.predict import cmd_predict


#: exit code of a command given bad input (a missing file or column, a bad value, a wrong option)
EXIT_BAD_INPUT = 2
#: exit code of a command whose fit failed (e.g. a bound that is not finite at the start)
EXIT_FIT_FAILED = 1
#: exit code of a command stopped by Ctrl-C: 128 + SIGINT, what shells report
EXIT_INTERRUPTED = 130

# ---------------------------------------------------------------------------------------------
# gpvi cache
# ---------------------------------------------------------------------------------------------
CACHE_ACTIONS = ("info", "clear")


def _megabytes(n: int) -> str:
    """A size in bytes as ``1.5 MB`` (MiB), ``12.3 kB`` (KiB) or ``0 bytes``."""
    if n >= 2**20:
        return f"{n / 2**20:.1f} MB"
    return f"{n / 2**10:.1f} kB" if n >= 2**10 else f"{n} bytes"


def cmd_cache(args) -> int:
    from gpvi import _compile

    if args.action == "clear":
        count, size = _compile.clear_cache()
        if not args.quiet:
            print(f"gpvi cache: removed {count} compiled program(s), {_megabytes(size)}, from {_compile.cache_dir()}")
        return 0
    info = _compile.cache_info()
    if not args.quiet:
        print(f"gpvi cache: {info['directory']}")
        print(f"  size          {info['entries']} compiled program(s), {_megabytes(info['bytes'])} "
              f"(limit {_megabytes(info['limit_bytes'])}, set by {_compile.MAX_MB_ENV})")
        print(f"  state         {'on' if info['active'] else info['note']}")
    return 0


def _check_configuration():
    """The cache's environment variables, read at import (gpvi._compile): a bad value is the
    command's one error line."""
    from gpvi import _compile

    problem = _compile.config_error()
    if problem:
        raise UsageError(problem)


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one line on stderr and exit code 2 (no usage dump:
    it runs to many lines; ``gpvi COMMAND -h`` shows it)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"gpvi: error: {one_line(message)} (see `{self.prog} -h`)\n")


def _choice(what: str, choices):
    """An argparse ``type`` that accepts one of ``choices`` (case-insensitively) and otherwise
    says, in one line, what was given, the nearest choice and all of them."""
    def parse(value: str) -> str:
        v = value.strip().lower()
        if v in choices:
            return v
        hint = difflib.get_close_matches(v, choices, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise argparse.ArgumentTypeError(f"unknown {what} {value!r}{extra}; choose from {', '.join(choices)}")

    parse.__name__ = what
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``gpvi`` argument parser (sub-commands fit, predict, demo and cache)."""
    from gpvi import __version__

    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true",
                        help="no progress display and no summary (errors are still reported)")
    parser = _Parser(
        prog="gpvi", description="Variational inference for GPs and latent Gaussian models with any likelihood.",
        epilog="Run `gpvi COMMAND -h` for the options of a command.")
    parser.add_argument("--version", action="version", version=f"gpvi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    f = sub.add_parser("fit", parents=[common], help="fit a model to a CSV or Parquet file and write a model file",
                       description="Fit a model to DATA (CSV with a header line, or Parquet). Features are "
                                   "standardised; every column except the target is a feature unless "
                                   "--features/--drop say otherwise. Without --likelihood it is chosen from the "
                                   "target, and a line says which: text labels are classes (2: bernoulli; 3 to "
                                   f"{MAX_CLASSES}: softmax); numbers that are all integers with at most "
                                   f"{AUTO_INTEGER_CLASSES} distinct values are class labels too; other numbers "
                                   "give gaussian regression (--levels implies ordinal, --positive bernoulli; "
                                   "--stream and --exposure need --likelihood).")
    from gpvi import engines

    f.add_argument("data", metavar="DATA", help="CSV (.csv, .tsv, optionally .gz) or Parquet (.parquet) file")
    f.add_argument("-t", "--target", required=True, metavar="COL", help="the column to predict")
    f.add_argument("-l", "--likelihood", type=_choice("likelihood", LIKELIHOODS), default=None, metavar="NAME",
                   help="one of: " + ", ".join(LIKELIHOODS) + " (softmax: multiclass, one latent GP per class, "
                        f"at most {MAX_CLASSES} classes, engines {' or '.join(engines.names(latents=True))}; "
                        "default: chosen from the target, see above)")
    f.add_argument("-m", "--model", type=_choice("model", MODELS), default=None, metavar="KIND",
                   help="auto (default; sparse when --inducing is given): a full GP when N <= 1000 for gaussian, "
                        "laplace and studentt and N <= 500 for the other likelihoods, else sparse; or sparse GP, "
                        "full GP, Bayesian GLM")
    f.add_argument("-e", "--engine", type=_choice("engine", engines.names() + [engines.auto.AUTO]), default=None,
                   metavar="ENGINE",
                   help="inference engine: " + ", ".join(engines.names()) + ", or auto (the certified engine "
                        "measured fastest for the model) (default fpi; sfp with --stream, "
                        "which takes " + ", ".join(engines.names(streams=True)) + ")")
    f.add_argument("-M", "--inducing", type=int, metavar="M",
                   help="inducing inputs of the sparse GP (default min(200, distinct rows)), placed by k-means; "
                        "implies --model sparse unless --model says otherwise")
    f.add_argument("-o", "--out", metavar="MODEL", help="model file to write (default: DATA with suffix .gpvi)")
    f.add_argument("--features", metavar="COLS", help="comma-separated feature columns (default: all but the target)")
    f.add_argument("--drop", metavar="COLS", help="comma-separated columns to leave out of the features")
    f.add_argument("--exposure", metavar="COL", help="exposure column for poisson/exponential (offset log COL)")
    f.add_argument("--levels", metavar="L1,L2,...", help="order of the ordinal levels, lowest first "
                   "(default: the integers from the smallest to the largest label)")
    f.add_argument("--positive", metavar="LABEL", help="the positive class for bernoulli/probit "
                   "(default: the larger number, or the later label in sorted order)")
    f.add_argument("--kernel", metavar="SPEC",
                   help="kernel of the GP: " + ", ".join(_kernels.SPEC_NAMES) + " (rq: rational quadratic; "
                        "polynomial: degree 2) joined by + and * (* binds tighter), e.g. rbf+periodic or "
                        "matern52*linear; lengthscales (and periods) start at the median distance between "
                        "standardised rows (default: rbf, with the isotropic-then-ARD search)")
    f.add_argument("--ard", action=argparse.BooleanOptionalAction, default=None,
                   help="one lengthscale per feature for the stationary kernels of --kernel (default: --ard; "
                        "--no-ard: one shared lengthscale, and without --kernel an isotropic rbf)")
    f.add_argument("--learn", action=argparse.BooleanOptionalAction, default=True,
                   help="learn kernel and likelihood hyperparameters (default: --learn)")
    f.add_argument("--hyperprior", choices=["weak", "none"], default=_defaults.HYPERPRIOR,
                   help="priors on the learned hyperparameters: 'weak' (default) log-normal priors on the kernel "
                        "variance (median 1), lengthscales (median sqrt(D)) and regression noise (median 0.1), for "
                        "the standardised data (gpvi.priors.weak; engines fpi, fpb, gradient, dual, laplace); "
                        "'none': the bound alone")
    f.add_argument("--tol", type=float, default=1e-6, help="relative VLB tolerance (default 1e-6)")
    f.add_argument("--max-iter", type=int, default=None,
                   help="iteration limit of each engine run: steps, or minibatch steps of sfp/svi/ivsgpr "
                        "(default: the engine's own, 500 steps; sfp and svi end after their epochs)")
    f.add_argument("--max-rounds", type=int, default=100,
                   help="iteration limit of the hyperparameter optimiser (default 100)")
    f.add_argument("--seed", type=int, default=0, help="seed of the k-means placement of inducing inputs")
    f.add_argument("--stream", action="store_true",
                   help="read DATA in row groups/blocks and fit by a stochastic engine (sfp, svi): for files "
                        "larger than memory")
    f.add_argument("--batch-size", type=int, metavar="B", help="--stream: rows per minibatch (default min(N, 1024))")
    f.add_argument("--epochs", type=int, default=2, help="--stream: passes over the data (default 2)")
    f.add_argument("--init-rows", type=int, default=100_000,
                   help="--stream: rows at the head of DATA used for scalings and k-means (default 100000)")
    f.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", parents=[common], help="predict with a model file; writes CSV",
                       description="Predict at the rows of DATA with a model written by `gpvi fit`. Writes "
                                   "columns mean, variance (of y), latent_mean, latent_variance, and for "
                                   "bernoulli/probit/ordinal a probability column p_<label> per class and the "
                                   "most probable label; for softmax the p_<label> columns and label only. When "
                                   "DATA has the target column, test metrics (error rate and NLPD for classes) "
                                   "are printed to stderr.")
    p.add_argument("model", metavar="MODEL", help="model file written by gpvi fit")
    p.add_argument("data", metavar="DATA", help="CSV or Parquet file with the model's feature columns")
    p.add_argument("-o", "--out", metavar="FILE", help="output file, CSV (or .parquet); default: stdout")
    p.add_argument("--keep", metavar="COLS", help="comma-separated input columns to copy to the output (e.g. an id)")
    p.set_defaults(func=cmd_predict)

    d = sub.add_parser("demo", parents=[common], help="fit the bundled coal-mining data with fpi and gradient",
                       description="Fit a Poisson sparse GP to the yearly coal-mining disaster counts that ship "
                                   "with gpvi, with the fpi and gradient engines; print a table and write "
                                   "gpvi-demo.png.")
    d.add_argument("--out-dir", default=".", metavar="DIR", help="folder for gpvi-demo.png (default: current)")
    d.add_argument("-M", "--inducing", type=int, default=25, metavar="M", help="inducing inputs (default 25)")
    d.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib needed)")
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("cache", parents=[common], help="show or clear the on-disk cache of compiled programs",
                       description="gpvi keeps compiled programs on disk so that a new run loads instead of "
                                   "compiling: in $XDG_CACHE_HOME/gpvi/jax (~/.cache/gpvi/jax), or the folder "
                                   "GPVI_COMPILATION_CACHE names (0 turns it off); least recently used programs "
                                   "are removed beyond GPVI_COMPILATION_CACHE_MAX_MB megabytes (default 256).")
    c.add_argument("action", nargs="?", default="info", type=_choice("cache action", CACHE_ACTIONS),
                   metavar="ACTION", help="info (default): print the folder, its size and limit; clear: remove "
                                          "every compiled program from it")
    c.set_defaults(func=cmd_cache)
    return parser


def _run(argv) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, usage errors (exit 2)
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    try:
        _check_configuration()
        return args.func(args)
    except UsageError as err:
        print(f"gpvi: error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except np.linalg.LinAlgError as err:
        print(f"gpvi: error: the fit failed: {one_line(err)}", file=sys.stderr)
        return EXIT_FIT_FAILED
    except ValueError as err:  # gpvi's own input checks (model files, data, settings)
        print(f"gpvi: error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        print(f"gpvi: error: {where}{one_line(err.strerror or err)}", file=sys.stderr)
        return EXIT_BAD_INPUT


class _InterruptGuard:
    """How the ``gpvi`` command ends on SIGINT (Ctrl-C): exit code 130 after the one line
    ``gpvi: interrupted``, whatever it was doing, and without a crash.

    * The first SIGINT raises KeyboardInterrupt in the main thread as usual, so that ``finally``
      blocks run (an atomic write removes its temporary file); :func:`main` catches it and calls
      :meth:`exit`, which flushes stdout and stderr and ends the process with :func:`os._exit`.
      A normal interpreter exit is what crashed (SIGSEGV after the message): the
      interrupt can arrive while XLA compiles a program on a thread of its own (the main thread
      waits for it interruptibly), and the exit then destroyed the XLA client under that thread.
    * Python swallows an exception raised in a garbage-collector callback (JAX registers one) or
      in ``__del__``, printing "Exception ignored in …"; the command would then run on.  Such a
      swallowed KeyboardInterrupt is caught by a ``sys.unraisablehook`` and delivered again.
    * Further SIGINTs are ignored while the first unwinds, so they cannot cut its clean-up short.
    * A watchdog thread ends the process itself when the main thread has not reported the
      interrupt :attr:`GRACE` seconds after it, e.g. because it is inside one long compiled call.
    """

    GRACE = 2.0

    def __init__(self):
        self.interrupted = threading.Event()
        self.reported = threading.Event()  # the interrupt is being reported, or the command is done
        self.redeliver = threading.Event()
        self.exiting = threading.Lock()  # held by whichever thread prints the line and exits
        self.pending = False  # a KeyboardInterrupt is on its way up the main thread
        self.watchdog = None
        self.previous_hook = sys.unraisablehook

    def install(self) -> bool:
        """Take over SIGINT, unless it is ignored (a background job of a shell script: it stays
        ignored) or handled by someone else, or this is not the main thread."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False
        if not _set_sigint(self.on_signal):
            return False
        sys.unraisablehook = self.on_unraisable
        # Started now, not in the handler: the main thread may be interrupted while it holds
        # threading's own locks, which starting a thread takes.
        self.watchdog = threading.Thread(target=self.watch, name="gpvi-interrupt", daemon=True)
        self.watchdog.start()
        return True

    def on_signal(self, signum, frame):
        """SIGINT handler: raise KeyboardInterrupt, unless one is already on its way."""
        if self.pending or self.reported.is_set():
            return
        self.pending = True
        self.interrupted.set()
        raise KeyboardInterrupt

    def on_unraisable(self, unraisable):
        """A KeyboardInterrupt swallowed by Python (in a gc callback or ``__del__``) is delivered
        again, silently; anything else goes to the previous hook."""
        if issubclass(unraisable.exc_type, KeyboardInterrupt) and not self.reported.is_set():
            self.pending = False
            self.redeliver.set()
            return
        self.previous_hook(unraisable)

    def watch(self):
        """From the first interrupt on: deliver swallowed interrupts again (from outside the
        callback that swallowed them), and exit after GRACE seconds if the main thread has not
        reported the interrupt by then."""
        self.interrupted.wait()
        deadline = time.monotonic() + self.GRACE
        while not self.reported.wait(0.01):
            if self.redeliver.is_set():
                self.redeliver.clear()
                os.kill(os.getpid(), signal.SIGINT)
            if time.monotonic() > deadline:
                self.exit()

    def finish(self):
        """The command is done: a late SIGINT no longer changes its outcome (nor turns into a
        traceback while the interpreter exits)."""
        self.reported.set()
        _set_sigint(signal.SIG_IGN)

    def exit(self):
        """Print ``gpvi: interrupted``, flush stdout and stderr, and end the process (exit 130)
        without the interpreter's teardown.  Called by one thread; another one blocks here."""
        self.reported.set()
        _set_sigint(signal.SIG_IGN)  # a no-op outside the main thread
        self.exiting.acquire()
        with contextlib.suppress(Exception):
            remove_stray_temporaries()
            print("gpvi: interrupted", file=sys.stderr)
        _flush_std()
        os._exit(EXIT_INTERRUPTED)


def _set_sigint(handler) -> bool:
    """Install ``handler`` for SIGINT; False where that is not allowed (outside the main thread)."""
    try:
        signal.signal(signal.SIGINT, handler)
        return True
    except (ValueError, OSError):  # not the main thread
        return False


def _flush_std():
    """Flush stdout and stderr before :func:`os._exit` (which skips it), ignoring a closed pipe."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def main(argv=None, *, exit_on_interrupt: bool | None = None) -> int:
    """Run the ``gpvi`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    An interrupt (SIGINT, Ctrl-C) prints ``gpvi: interrupted`` and gives exit code 130.  With
    ``exit_on_interrupt`` (the default when ``argv`` is None, i.e. when run as the ``gpvi``
    command) the process then ends at once with :func:`os._exit`, after flushing stdout and
    stderr, and interrupts that Python would swallow are honoured: see :class:`_InterruptGuard`.
    Nothing is lost by skipping the interpreter's teardown: output files are
    written atomically, so an interrupted write leaves the previous file.
    """
    if exit_on_interrupt is None:
        exit_on_interrupt = argv is None
    guard = _InterruptGuard() if exit_on_interrupt else None
    OUTPUTS.clear()
    try:
        if guard is not None:
            guard.install()
        code = _run(argv)
    except KeyboardInterrupt:
        if guard is not None:
            guard.exit()  # does not return
        remove_stray_temporaries()
        print("gpvi: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if guard is not None:
        guard.finish()
    return code
