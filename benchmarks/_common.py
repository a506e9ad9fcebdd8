"""Helpers shared by the benchmark scripts: timing, tables, JSON output, peak memory, plots.

The benchmarks run JAX on the CPU unless ``JAX_PLATFORMS`` says otherwise (set before gpvi
or JAX is imported, i.e. import this module first).
"""
from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

RESULTS_DIR = Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS_DIR", "results_dir", "median_seconds", "median", "peak_rss_mb", "current_rss_mb", "print_table",
           "write_json", "verdict", "environment", "pyplot", "fmt", "smooth_latent", "load_average",
           "warn_if_busy", "OtherLoad"]


def source_tree(revision: str, into: Path) -> Path:
    """The ``src`` tree of git ``revision`` of this repository, extracted under ``into`` (``git
    archive | tar -x``); returns ``into / "src"``, the directory to put on a child's PYTHONPATH."""
    root = Path(__file__).resolve().parents[1]
    arch = subprocess.run(["git", "-C", str(root), "archive", revision, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=arch.stdout, check=True)
    return Path(into) / "src"


def results_dir(path=None) -> Path:
    """``path`` or else ``benchmarks/results/`` (created if missing)."""
    d = RESULTS_DIR if path is None else Path(path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def median(values):
    """Median of the finite values (NaN when there are none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else float("nan")


def median_seconds(fn, repeats: int = 20, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``getrusage(RUSAGE_SELF)``)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return kb / 1024.0 if sys.platform != "darwin" else kb / 2**20


def current_rss_mb() -> float:
    """Current resident set size in MiB (psutil when available, else /proc; NaN otherwise)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except OSError:
            return float("nan")


def fmt(x, digits: int = 4) -> str:
    """Compact formatting for table cells (numbers, None, bools, strings)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if x == 0:
            return "0"
        if abs(x) >= 1e9 or abs(x) < 1e-3:
            return f"{x:.2e}"
        if abs(x) >= 1000:
            return f"{x:.1f}"
        return f"{x:.{digits}g}"
    return str(x)


def print_table(headers, rows, title: str | None = None, file=None):
    """Print a plain-text table with right-aligned columns."""
    file = file or sys.stdout
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h))
              for i, h in enumerate(headers)]
    if title:
        print(f"\n{title}", file=file)
    line = "  ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    print(line, file=file)
    print("-" * len(line), file=file)
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)), file=file)
    file.flush()


def _jsonable(x):
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None  # strict JSON has no NaN/inf
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item") and callable(x.item):  # 0-d JAX arrays
        return _jsonable(x.item())
    return x


def write_json(path, data) -> Path:
    """Write ``data`` (numpy/JAX scalars and arrays allowed; NaN → null) as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    return path


def verdict(ok) -> str:
    return "PASS" if ok else "FAIL"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Where the numbers were taken (for the JSON).  Ratios against a NumPy product depend on
    the CPU and on the kernel OpenBLAS picks for it, so both are recorded."""
    import jax
    import numpy as np
    from threadpoolctl import threadpool_info

    blas = sorted(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
            for i in threadpool_info() if i.get("user_api") == "blas")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "blas": blas,
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---- synthetic data -----------------------------------------------------------------------
def smooth_latent(X, seed: int, lengthscale: float = 1.5, features: int = 100, scale: float = 1.0,
                  block: int = 65536):
    """A smooth random function of the rows of ``X`` (random Fourier features of an RBF GP
    with the given lengthscale), standardised to unit variance over the features and scaled
    by ``scale``.  Evaluated ``block`` rows at a time so the working memory stays
    O(block · features) whatever N is."""
    import numpy as np

    rng = np.random.default_rng([seed, 7])
    D = X.shape[1]
    W = rng.standard_normal((features, D)) / lengthscale
    b = rng.uniform(0.0, 2.0 * np.pi, features)
    a = rng.standard_normal(features) * np.sqrt(2.0 / features) * scale
    f = np.empty(X.shape[0])
    for s in range(0, X.shape[0], block):
        f[s:s + block] = np.cos(X[s:s + block] @ W.T + b) @ a
    return f


def progress_logger(t0: float):
    """``log(msg)``: print ``msg`` to stderr with the seconds since ``t0`` (a perf_counter)."""
    def log(msg):
        print(f"{time.perf_counter() - t0:7.1f}s {msg}", file=sys.stderr, flush=True)
    return log


def load_average() -> list[float]:
    """1-, 5- and 15-minute load averages (empty where unavailable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return []


def warn_if_busy(threshold: float = 1.0, file=None):
    """Say on stderr when the machine is already loaded (timings will be inflated)."""
    la = load_average()
    if la and la[0] > threshold:
        print(f"warning: load average {la[0]:.2f} before the benchmark (cores: {os.cpu_count()}); "
              "timings may be inflated", file=file or sys.stderr, flush=True)
    return la


class OtherLoad:
    """CPU time used by *other* processes over an interval (Linux ``/proc/stat``), to tell
    whether the timings were taken on a quiet machine.

    ``with OtherLoad() as o: ...`` then ``o.result`` = dict(wall_s, own_cpu_s, other_cpu_s,
    other_cores): ``other_cores`` is the average number of cores busy with other work
    (children of this process count as own).  All NaN where ``/proc`` is unavailable.
    """

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal ...: busy = all − idle − iowait
            return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return float("nan")

    @staticmethod
    def _own():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), self._busy(), self._own()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        own = self._own() - self.own
        other = max(self._busy() - self.busy - own, 0.0)
        self.result = dict(wall_s=wall, own_cpu_s=own, other_cpu_s=other,
                           other_cores=other / wall if wall > 0 else float("nan"))
        return False
