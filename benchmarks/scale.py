"""Scaling in N of a Poisson sparse GP fitted by fpi (issue acceptance item 5).

Poisson sparse GP, M = 300 inducing inputs (k-means), D = 3, fixed RBF hyperparameters, engine
fpi with the library defaults (chunked data sums, default ``cache_bytes``), at N = 100 000 and
N = 1 000 000 rows of synthetic counts from a smooth latent function (seeded; generated in
blocks so that no N × features intermediate is formed).

Each N runs in its own child process, so its peak resident memory (``ru_maxrss``) belongs to
that N alone.  The child reports the time of data generation, of k-means placement
(``model.initialise``) and of the fit (which includes compiling the JAX code, since the chunk
count differs per N), the iterations, convergence, VLB, the size of X and its peak RSS after
each stage.  The parent prints the table, compares peak(N_max)/peak(N_min) with N_max/N_min
(PASS when memory grows far less than proportionally: ratio ≤ 0.3 × the N ratio), and writes
``results/scale[_quick].{json,png}``.

``--quick``: N = 5 000 and 50 000, M = 50 (< 30 s).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets JAX_PLATFORMS before JAX is imported)

MEMORY_FRACTION = 0.3  # PASS when peak-memory ratio ≤ this × N ratio
LOG_RATE = 1.0  # log of the typical count rate
MARK = "SCALE-RESULT "


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 5000, 50000 and M = 50")
    p.add_argument("--ns", type=int, nargs="+", default=None, help="sizes (default 100000 1000000)")
    p.add_argument("--m", type=int, default=None, help="inducing inputs (default 300; quick 50)")
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-bytes", type=int, default=None,
                   help="pass cache_bytes to gpvi.fit (default: the library default)")
    p.add_argument("--outdir", default=None, help="where to write the JSON and PNG (default benchmarks/results)")
    p.add_argument("--out", default=None, help="output stem in benchmarks/results (default scale[_quick])")
    p.add_argument("--child", type=int, default=None, metavar="N", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.ns = a.ns or ([5_000, 50_000] if a.quick else [100_000, 1_000_000])
    a.m = a.m or (50 if a.quick else 300)
    a.out = a.out or ("scale_quick" if a.quick else "scale")
    return a


# ---- child: one N ------------------------------------------------------------------------------
def child(N, M, D, seed, cache_bytes=None):
    out = {"N": N, "M": M, "D": D}
    t = time.perf_counter()
    import numpy as np

    import gpvi
    from gpvi.objective import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK

    out["import_seconds"] = time.perf_counter() - t
    out["rss_after_import_mb"] = C.current_rss_mb()
    out["peak_rss_after_import_mb"] = C.peak_rss_mb()

    # data: X directly (N·D floats), the latent in blocks, counts as float64
    t = time.perf_counter()
    rng = np.random.default_rng([seed, N])
    X = rng.standard_normal((N, D))
    f = C.smooth_latent(X, seed, lengthscale=1.5, scale=0.7)
    f += LOG_RATE
    np.exp(f, out=f)
    y = rng.poisson(f).astype(np.float64)
    del f
    out["data_seconds"] = time.perf_counter() - t
    out["X_mb"] = X.nbytes / 2**20
    out["y_mb"] = y.nbytes / 2**20
    out["y_mean"] = float(y.mean())
    out["peak_rss_after_data_mb"] = C.peak_rss_mb()

    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=0.5, lengthscale=1.0),
                          likelihood=gpvi.likelihoods.Poisson(), inducing=M, mean=LOG_RATE)
    t = time.perf_counter()
    model = model.initialise(X, seed=seed)
    out["init_seconds"] = time.perf_counter() - t
    out["peak_rss_after_init_mb"] = C.peak_rss_mb()

    t = time.perf_counter()
    kw = {} if cache_bytes is None else {"cache_bytes": cache_bytes}
    res = gpvi.fit(model, X, y, engine="fpi", **kw)  # library defaults: tol, chunk_size (, cache_bytes)
    out["fit_seconds"] = time.perf_counter() - t
    out["peak_rss_mb"] = C.peak_rss_mb()
    out["rss_end_mb"] = C.current_rss_mb()
    tr = np.asarray(res.trace)
    out.update(iterations=int(res.iterations), converged=bool(res.converged), message=res.message,
               vlb=float(res.vlb), evaluations=int(res.evaluations), backtracks=int(res.backtracks),
               setup_seconds=float(tr[0, 0]),
               seconds_per_iteration=float((tr[-1, 0] - tr[0, 0]) / max(res.iterations, 1)),
               # median step of the trace: leaves out the compilation inside the first iteration
               median_seconds_per_iteration=float(np.median(np.diff(tr[:, 0]))) if len(tr) > 1 else None,
               trace=tr.tolist())
    # Whether the Objective kept all projections in memory (same rule as gpvi.objective.Objective).
    n = min(DEFAULT_CHUNK, N)
    rows = -(-N // n) * n
    out["projection_cache_mb"] = rows * (M + 2) * 8 / 2**20
    limit = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
    out["projections_cached"] = rows * (M + 2) * 8 <= limit
    out["cache_limit_mb"] = limit / 2**20
    print(MARK + json.dumps(out), flush=True)


# ---- parent ------------------------------------------------------------------------------------
def run_child(N, args, log):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(N), "--m", str(args.m),
           "--d", str(args.d), "--seed", str(args.seed)]
    if args.cache_bytes is not None:
        cmd += ["--cache-bytes", str(args.cache_bytes)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"child for N={N} failed (exit {proc.returncode})")
    r = json.loads(lines[-1][len(MARK):])
    r["process_seconds"] = wall
    r["load_average_after"] = C.load_average()
    log(f"N={N}: fit {r['fit_seconds']:.1f}s, {r['iterations']} its, peak RSS {r['peak_rss_mb']:.0f} MiB")
    return r


def figure(rows, path):
    plt = C.pyplot()
    import numpy as np

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"N={r['N']:,}" for r in rows]
    x = np.arange(len(rows))
    w = 0.25
    for i, (key, lab) in enumerate([("data_seconds", "data generation"), ("init_seconds", "k-means (initialise)"),
                                    ("fit_seconds", "fit (fpi)")]):
        a1.bar(x + (i - 1) * w, [r[key] for r in rows], w, label=lab)
    a1.set_xticks(x, labels)
    a1.set_ylabel("seconds")
    a1.set_yscale("log")
    a1.set_title("time")
    a1.legend(fontsize=8)
    for i, (key, lab) in enumerate([("rss_after_import_mb", "after import"), ("peak_rss_mb", "peak RSS"),
                                    ("X_mb", "size of X")]):
        a2.bar(x + (i - 1) * w, [r[key] for r in rows], w, label=lab)
    a2.set_xticks(x, labels)
    a2.set_ylabel("MiB")
    a2.set_title("memory")
    a2.legend(fontsize=8)
    M = rows[0]["M"]
    fig.suptitle(f"Poisson sparse GP, M={M}, D={rows[0]['D']}, fpi, chunked sums, "
                 f"projection cache limit {rows[0]['cache_limit_mb']:.0f} MiB")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.child is not None:
        return child(args.child, args.m, args.d, args.seed, args.cache_bytes)
    load_start = C.warn_if_busy()
    t0 = time.perf_counter()
    log = C.progress_logger(t0)

    rows = []
    for N in args.ns:
        with C.OtherLoad() as other:
            rows.append(run_child(N, args, log))
        rows[-1]["other_load"] = other.result
    C.print_table(
        ["N", "X MiB", "data s", "k-means s", "fit s", "s/iter", "med s/iter", "its", "conv", "VLB", "proj cached",
         "RSS import MiB", "peak RSS MiB"],
        [[r["N"], r["X_mb"], r["data_seconds"], r["init_seconds"], r["fit_seconds"], r["seconds_per_iteration"],
          r["median_seconds_per_iteration"], r["iterations"], r["converged"], r["vlb"], r["projections_cached"], r["rss_after_import_mb"],
          r["peak_rss_mb"]] for r in rows],
        title=f"Poisson sparse GP, M={args.m}, D={args.d}, fpi, fixed hyperparameters (one process per N)")
    lo, hi = rows[0], rows[-1]
    n_ratio = hi["N"] / lo["N"]
    mem_ratio = hi["peak_rss_mb"] / lo["peak_rss_mb"]
    above = [r["peak_rss_mb"] - r["rss_after_import_mb"] for r in (lo, hi)]
    above_ratio = above[1] / above[0] if above[0] > 0 else float("nan")
    time_ratio = hi["fit_seconds"] / lo["fit_seconds"]
    iter_ratio = hi["median_seconds_per_iteration"] / lo["median_seconds_per_iteration"]
    ok = mem_ratio <= MEMORY_FRACTION * n_ratio
    print(f"\n  N ratio {n_ratio:g}: peak-memory ratio {mem_ratio:.2f} "
          f"(above the post-import baseline: {above[0]:.0f} -> {above[1]:.0f} MiB, ratio {above_ratio:.2f}); "
          f"fit-time ratio {time_ratio:.2f}, median per-iteration-time ratio {iter_ratio:.2f}")
    print(f"  target: peak memory grows far less than N (ratio <= {MEMORY_FRACTION:g} x {n_ratio:g} = "
          f"{MEMORY_FRACTION * n_ratio:g}): {mem_ratio:.2f}  {C.verdict(ok)}")
    print("  other processes kept " + ", ".join(f"{r['other_load']['other_cores']:.2f} (N={r['N']})" for r in rows)
          + f" of {os.cpu_count()} cores busy on average (timings are trustworthy only near 0)")
    out = C.results_dir(args.outdir)
    figure(rows, out / f"{args.out}.png")
    C.write_json(out / f"{args.out}.json", dict(
        benchmark="scale", config={k: v for k, v in vars(args).items() if k != "child"},
        environment=C.environment(), n_ratio=n_ratio, peak_memory_ratio=mem_ratio,
        memory_above_import_mb=above, memory_above_import_ratio=above_ratio, fit_time_ratio=time_ratio,
        seconds_per_iteration_ratio=iter_ratio, memory_target=dict(limit=MEMORY_FRACTION * n_ratio, ok=ok),
        total_seconds=time.perf_counter() - t0, load_average_start=load_start,
        load_average_end=C.load_average(), runs=rows))
    print(f"\nwrote {out / (args.out + '.json')} and .png  ({time.perf_counter() - t0:.1f}s)")
    return rows


if __name__ == "__main__":
    main()
