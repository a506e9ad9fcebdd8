"""Issue 21: `gpvi fit` interrupted by SIGINT exits 130 with the one line `gpvi: interrupted`, in
every phase (loading the data, k-means, compiling, iterating, writing the model), and never
harms a model already at the output path.

The crash this guards against: an interrupt that arrived while XLA compiled a program on one of
its own threads ended the main thread's wait for it; the normal interpreter exit that followed
destroyed the XLA client under that thread, which then crashed (SIGSEGV, exit -11: 5 of 8 tries
on a 200 000-row file with the progress bar on, every try when the interrupt is sent during a
long compilation).  The command now leaves with ``os._exit(130)`` once the message is printed,
and re-delivers an interrupt that Python swallowed in a garbage-collector callback (see
:class:`gpvi.cli.app._InterruptGuard`).

The command runs in a child process exactly as the ``gpvi`` script runs it (``from gpvi.cli
import main; sys.exit(main())``), with one line ``gpvi-ready`` on stderr once ``gpvi.cli`` is
imported: the interrupts are timed from there.  An interrupt during the import itself (about a
second, importing JAX, before any code of gpvi.cli runs) is caught by the command's entry point,
``_gpvi_cli``, which needs only the standard library (tested on the installed script).
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

READY = "gpvi-ready"
# Every child first takes SIGINT as a command started from a terminal does: a background job of a
# non-interactive shell (this test suite run with `&`, say) inherits SIGINT ignored, and then
# gpvi, like Python, leaves it ignored.
FOREGROUND = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
DRIVER = (FOREGROUND + "import sys\nfrom gpvi.cli import main\nprint(%r, file=sys.stderr, flush=True)\n"
          "sys.exit(main())\n" % READY)
# The command under test: a sparse Poisson GP with defaults but for fewer inducing inputs and no
# hyperparameter learning, so that one run (compilation included) lasts a few seconds here.
OPTIONS = ["-t", "count", "-l", "poisson", "-M", "30", "--no-learn"]


@pytest.fixture(scope="module")
def counts_csv(tmp_path_factory):
    """20 000 rows of Poisson counts with three features (reused by every run): each run still
    passes through loading, k-means, compiling, iterating and writing, in about 2 s."""
    rng = np.random.default_rng(21)
    X = rng.uniform(-2, 2, (20_000, 3))
    y = rng.poisson(np.exp(0.5 + np.sin(1.5 * X[:, 0]) + 0.4 * X[:, 1] - 0.3 * X[:, 2] ** 2))
    path = tmp_path_factory.mktemp("interrupt") / "counts.csv"
    np.savetxt(path, np.column_stack([X, y]), fmt=["%.6f", "%.6f", "%.6f", "%d"], delimiter=",",
               header="x1,x2,x3,count", comments="")
    return path


def start(csv, out, options=OPTIONS):
    """Start `gpvi fit csv OPTIONS -o out` and wait until gpvi.cli is imported; returns the process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile for real: compiling is a phase under test
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "fit", str(csv), *options, "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    assert line == READY + "\n", line + proc.stderr.read()
    return proc


def finish(proc, timeout=120):
    """(exit code, stdout, stderr after the ready line) of a started process."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def spawn_driver(driver, tmp_path, *options, out=None):
    """Start ``gpvi fit`` on a 40-row count CSV through ``driver`` (code run with ``python -c``);
    returns the process, its stdout and stderr piped."""
    csv = tmp_path / "d.csv"
    csv.write_text("x,count\n" + "".join(f"{i / 10},{i % 4}\n" for i in range(40)))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", driver, "fit", str(csv), "-t", "count", "-l", "poisson", *options,
                             "-o", str(out or tmp_path / "m.gpvi")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def leftovers(folder):
    """Temporary files of an atomic write left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.slow
def test_interrupt_during_the_fit_exits_130(counts_csv, tmp_path):
    """The command of issue 21 with its defaults (hyperparameters learned, 200 inducing inputs:
    it runs for a while) given one SIGINT 1.5 s in (loading the data, placing the inducing
    inputs or compiling) ends with exit code 130, the one line, and the previous model intact."""
    out = tmp_path / "m.gpvi"
    out.write_bytes(b"previous model")
    proc = start(counts_csv, out, options=["-t", "count", "-l", "poisson"])
    time.sleep(1.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    rc, stdout, stderr = finish(proc, timeout=60)
    assert (rc, stderr, stdout) == (130, "gpvi: interrupted\n", "")
    assert out.read_bytes() == b"previous model"
    assert leftovers(tmp_path) == []


LONG_COMPILE_DRIVER = FOREGROUND + """
import sys
import gpvi, jax, jax.numpy as jnp
from gpvi.cli import main

def fit(*args, **kwargs):  # a fit that spends seconds compiling one XLA program
    def f(x):
        for i in range(250):
            x = jnp.tanh(x @ x.T + i) * jnp.cos(x)
        return x
    print("compiling", file=sys.stderr, flush=True)
    jax.jit(f).lower(jnp.ones((8, 8))).compile()
    print("the interrupt came after the compilation", file=sys.stderr)
    sys.exit(3)

gpvi.fit = fit
sys.exit(main())
"""


@pytest.mark.slow  # a child process compiling without the tests' cache: kept out of the quick subset
def test_interrupt_while_xla_compiles_exits_130_not_sigsegv(tmp_path):
    """The crash of issue 21, made deterministic: SIGINT while XLA compiles a program (on a thread
    of its own; the main thread's wait for it is interruptible).  Leaving through the normal
    interpreter exit destroyed the XLA client under the compiling thread: SIGSEGV (exit -11) after
    `gpvi: interrupted`, 3 times in 3.  It must exit 130 with the one line."""
    proc = spawn_driver(LONG_COMPILE_DRIVER, tmp_path)
    assert proc.stderr.readline() == "compiling\n"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc, _, stderr = finish(proc, timeout=120)
    assert (rc, stderr) == (130, "gpvi: interrupted\n")


SWALLOWING_DRIVER = FOREGROUND + """
import gc, signal, sys, time
import gpvi
from gpvi.cli import main

armed = []

def on_gc(phase, info):
    if phase == "start" and armed:
        armed.clear()
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the SIGINT handler runs here, in a gc callback, which swallows its exception
            pass

gc.callbacks.append(on_gc)

def fit(*args, **kwargs):
    armed.append(True)
    start = time.monotonic()
    while time.monotonic() - start < 10:
        gc.collect()
        time.sleep(0.01)
    print("the interrupt was lost", file=sys.stderr)
    sys.exit(3)

gpvi.fit = fit
sys.exit(main())
"""


@pytest.mark.slow  # a child process compiling without the tests' cache: kept out of the quick subset
def test_an_interrupt_swallowed_by_a_gc_callback_still_ends_the_command(tmp_path):
    """Python swallows an exception raised in a garbage-collector callback (JAX has one) and prints
    "Exception ignored in …": such an interrupt, 2 in 12 tries at 1.0-1.4 s into the command above,
    let it run on to exit 0 with a traceback on stderr.  It must still end it, with exit 130 and
    the one line."""
    rc, _, stderr = finish(spawn_driver(SWALLOWING_DRIVER, tmp_path))
    assert (rc, stderr) == (130, "gpvi: interrupted\n")


STRAY_TEMPORARY_DRIVER = FOREGROUND + """
import os, signal, sys
from gpvi.cli import main

real_open = os.open

def open_(path, flags, *args, **kwargs):  # the interrupt lands just after the temporary file is created
    fd = real_open(path, flags, *args, **kwargs)
    if str(path).endswith(".tmp"):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the SIGINT handler runs here, as the file has just appeared
            pass
    return fd

os.open = open_
sys.exit(main())
"""


@pytest.mark.slow  # a child process compiling without the tests' cache: kept out of the quick subset
def test_interrupt_as_the_model_file_is_created_leaves_no_temporary_file(tmp_path):
    """An interrupt just after the atomic write's temporary file is created (inside
    ``tempfile.mkstemp``, before the write's clean-up covered it, 1 in 60 tries with SIGINT sent
    as the file appeared) left ``.m.gpvi.XXXXXXXX.tmp`` behind.  The previous model stays, and no
    litter."""
    out = tmp_path / "m.gpvi"
    out.write_bytes(b"previous model")
    rc, _, stderr = finish(spawn_driver(STRAY_TEMPORARY_DRIVER, tmp_path, "-m", "glm", "--no-learn", out=out))
    assert (rc, stderr) == (130, "gpvi: interrupted\n")
    assert out.read_bytes() == b"previous model"
    assert leftovers(tmp_path) == []


def _interrupt_when_writing(proc, folder, deadline):
    """Send SIGINT as soon as the model's temporary file appears in ``folder``; True if sent."""
    while time.monotonic() < deadline and proc.poll() is None:
        if leftovers(folder):
            proc.send_signal(signal.SIGINT)
            return True
        time.sleep(0.001)
    return False


@pytest.mark.slow
def test_twenty_interrupts_at_random_moments(counts_csv, tmp_path):
    """20 runs, each sent SIGINT at a random moment (seeded) of the command's run: 17 uniformly
    over most of an uninterrupted run (after the import: loading the data, k-means, compiling,
    iterating), 3 as soon as the model file is being written.  Every interrupted run exits 130
    with exactly the one line and leaves no temporary file; the model at the output path stays
    intact and loads.  A run whose signal arrives after it has finished (summary and model
    complete) counts as finished, not interrupted; at least 14 of the 20 must be interrupted."""
    import gpvi

    out = tmp_path / "m.gpvi"
    t0 = time.monotonic()
    proc = start(counts_csv, out)
    t_ready = time.monotonic()
    rc, stdout, stderr = finish(proc)
    duration = time.monotonic() - t_ready
    assert rc == 0 and stderr == "" and f"wrote model to {out}" in stdout, stderr
    gpvi.io.load(out)

    rng = np.random.default_rng(2121)
    # Each random delay is a fraction (up to 0.8) of the fastest uninterrupted run so far: on a
    # loaded machine (the suite's other worker, the hang test's processes) one run can take twice
    # as long as the next, and delays drawn from a slow first run can arrive after most runs have
    # finished (the likely cause of one failure of this test in a full-suite run, 2026-11-28,
    # whose output was not kept).
    plan = [("random", float(u)) for u in rng.uniform(0.0, 0.8, 17)] + [("writing", None)] * 3
    plan = [plan[i] for i in rng.permutation(len(plan))]
    results = []
    fastest = duration
    for kind, fraction in plan:
        proc = start(counts_csv, out)
        began = time.monotonic()
        delay = None if fraction is None else fraction * fastest
        if kind == "random":
            time.sleep(delay)
            sent = proc.poll() is None
            if sent:
                proc.send_signal(signal.SIGINT)
        else:
            sent = _interrupt_when_writing(proc, tmp_path, began + 4 * duration + 30)
        rc, stdout, stderr = finish(proc, timeout=120)
        at = time.monotonic() - began
        results.append((kind, delay, sent, rc, stderr, round(at, 2)))
        finished = rc == 0 and stderr == "" and f"wrote model to {out}" in stdout
        if finished:
            fastest = min(fastest, at)
        assert rc == 130 or finished, results[-1]
        if rc == 130:
            assert stderr == "gpvi: interrupted\n", results[-1]
        assert leftovers(tmp_path) == [], results[-1]
        # intact: the previous model, or (interrupted after its rename, while printing the summary)
        # the complete new one
        gpvi.io.load(out)
    interrupted = sum(r[3] == 130 for r in results)
    summary = ", ".join(f"{k}:{'-' if d is None else f'{d:.2f}'}s->{rc}" for k, d, _, rc, _, _ in results)
    print(f"\n{interrupted}/20 runs interrupted (exit 130), the rest finished first; uninterrupted run "
          f"{duration:.1f} s after import; total {time.monotonic() - t0:.0f} s; {summary}")
    assert interrupted >= 14, results


@pytest.mark.parametrize("delay", [0.15, 0.3])
def test_interrupt_while_gpvi_is_imported_exits_130(tmp_path, delay):
    """The installed ``gpvi`` command (entry point ``_gpvi_cli``, standard library only) handles
    SIGINT before it imports gpvi and JAX (over a second): it printed Python's traceback and
    died of the signal (exit −2) when interrupted then."""
    import shutil
    from pathlib import Path

    exe = shutil.which("gpvi", path=str(Path(sys.executable).parent)) or shutil.which("gpvi")
    assert exe, "the `gpvi` command is not installed: pip install -e ."
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # The script runs with SIGINT at its default disposition, as from a terminal: a suite started
    # in the background by a non-interactive shell has SIGINT ignored, which the child would
    # inherit (and then, like Python, keep).  A small exec-ing launcher resets it: SIG_DFL
    # survives exec, and unlike preexec_fn it does not fork the multithreaded test process.
    launcher = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", launcher, exe, "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0 and "usage: gpvi" in out:
        pytest.skip(f"the command finished within {delay} s, before the interrupt")
    assert (proc.returncode, err) == (130, "gpvi: interrupted\n")
