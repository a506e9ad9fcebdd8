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

``--large`` (issue 18, "Large data"; results in ``results/scale_large[_quick].json``):

- *uncached vs cached*: at N = 10⁶ (quick 5·10⁴), the time of one data pass (the sums of an fpi
  iteration) with all projections kept in memory against none kept, and the relative VLB
  difference between the two paths (target: uncached ≤ 1.5× cached, VLB within 1e-8);
- *Parquet, in process*: N rows (``--large-n``, default 10⁷; quick 10⁵) of Poisson counts
  written to a Parquet file (row groups of 65 536 rows), fitted by fpi to convergence with fixed
  hyperparameters from a ``ParquetSource``: wall time, passes, peak RSS of the fitting process;
- *Parquet, Dask*: the same fit with ``executor=`` a 2-worker ``LocalCluster`` (spawned
  processes): VLB against the in-process one (target 1e-10 relative), time and overhead per pass;
- an estimate for N = 10⁸ on 16 such nodes from the measured per-pass throughput and overhead.
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
    p.add_argument("--large", action="store_true", help="the out-of-core and Dask runs of issue 18 instead")
    p.add_argument("--large-n", type=int, default=None, help="rows of the Parquet runs (default 1e7; quick 1e5)")
    p.add_argument("--uncached-n", type=int, default=None, help="rows of the cached/uncached pass (default 1e6)")
    p.add_argument("--large-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--parquet", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-dask", action="store_true", help="--large without the Dask run")
    p.add_argument("--tmpdir", default=None, help="where --large writes its Parquet file (default: system temp)")
    a = p.parse_args(argv)
    if a.large:
        a.large_n = a.large_n or (100_000 if a.quick else 10_000_000)
        a.uncached_n = a.uncached_n or (50_000 if a.quick else 1_000_000)
        a.m = a.m or (50 if a.quick else 300)
        a.out = a.out or ("scale_large_quick" if a.quick else "scale_large")
        # rows kept between passes: 256 MiB (the library default, 512 MiB, puts the peak RSS of the
        # 10⁷-row fit at 1.3-1.56 GiB, over the 1.5 GiB; with 0 it is 0.8 GiB)
        a.cache_bytes = a.cache_bytes if a.cache_bytes is not None else 256 * 2**20
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


# ---- issue 18: out-of-core and Dask --------------------------------------------------------------
ROW_GROUP = 65_536


def _poisson_rows(N, D, seed, start, stop):
    import numpy as np

    rng = np.random.default_rng([seed, N, start])
    X = rng.standard_normal((stop - start, D))
    f = C.smooth_latent(X, seed, lengthscale=1.5, scale=0.7) + LOG_RATE
    return X, rng.poisson(np.exp(f)).astype(np.float64)


def write_parquet(path, N, D, seed):
    """N rows of Poisson counts in row groups of ROW_GROUP rows, generated group by group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f"x{k}" for k in range(D)] + ["y"]
    with pq.ParquetWriter(path, pa.schema([(n, pa.float64()) for n in names])) as w:
        for a in range(0, N, ROW_GROUP):
            X, y = _poisson_rows(N, D, seed, a, min(N, a + ROW_GROUP))
            w.write_table(pa.table(dict(zip(names, list(X.T) + [y]))), row_group_size=ROW_GROUP)


def _model(M, X_sample, seed):
    import gpvi

    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=0.5, lengthscale=1.0),
                          likelihood=gpvi.likelihoods.Poisson(), inducing=M, mean=LOG_RATE)
    return model.initialise(X_sample, seed=seed)


def large_child(kind, args):
    """One measurement in its own process (so its peak RSS is its own)."""
    import numpy as np

    import gpvi
    from gpvi.objective import Objective, prior_state
    from gpvi.data.sources import ParquetSource

    out = {"kind": kind}
    if kind == "uncached":
        N = args.uncached_n
        X, y = _poisson_rows(N, args.d, args.seed, 0, N)
        model = _model(args.m, X[:100_000], args.seed)
        per, vlbs = {}, {}
        for label, cb in (("cached", 2**40), ("uncached", 0)):
            obj = Objective(model, X, y, cache_bytes=cb)
            st = prior_state(obj.dim)
            st = st._replace(mean=st.mean + 0.01)
            float(obj.sums(st).vlb)  # compile (and, cached, project)
            times = []
            for _ in range(3):
                t = time.perf_counter()
                vlbs[label] = float(obj.sums(st).vlb)
                times.append(time.perf_counter() - t)
            per[label] = float(np.median(times))
            out[f"{label}_projections_kept"] = bool(obj.cached)
            del obj
        # The same VLB through a triangular solve per chunk (the projection of predictions and of
        # releases before the L⁻¹ product): how far the faster path moved the numbers.
        import jax.numpy as jnp

        from gpvi.models import kl_standard_normal
        from gpvi.fitting.predict import latent_moments

        prior = model.prior_cache(None)
        m, v = latent_moments(model, prior, st, X, None, 2048)
        vlbs["triangular_solve"] = float(jnp.sum(model.likelihood.expected_log_prob(jnp.asarray(y), m, v))
                                         - kl_standard_normal(st.mean, st.chol))
        out.update(N=N, M=args.m, seconds_per_pass=per, ratio=per["uncached"] / per["cached"],
                   vlb=vlbs, vlb_rel_diff=abs(vlbs["uncached"] - vlbs["cached"]) / abs(vlbs["cached"]),
                   vlb_rel_diff_vs_solve=abs(vlbs["uncached"] - vlbs["triangular_solve"]) / abs(vlbs["cached"]))
    else:
        src = ParquetSource(args.parquet, target="y")
        N = src.num_rows
        rng = np.random.default_rng(args.seed)
        blocks = sorted(rng.choice(src.num_blocks, min(src.num_blocks, 4), replace=False))
        Xs = np.concatenate([src.read_block(j)[0] for j in blocks])
        model = _model(args.m, Xs, args.seed)
        del Xs
        client = cluster = None
        if kind == "dask":
            from distributed import Client, LocalCluster

            t = time.perf_counter()
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                   silence_logs=40)
            client = Client(cluster)
            out["cluster_start_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        # The rows kept between passes count against cache_bytes: the process's peak is ~0.8 GiB
        # (JAX, compiled programs, blocks in flight) plus that budget.
        kw = {} if args.cache_bytes is None else {"cache_bytes": args.cache_bytes}
        res = gpvi.fit(model, src, executor=client, **kw)
        out["fit_seconds"] = time.perf_counter() - t
        out["cache_bytes"] = args.cache_bytes
        tr = np.asarray(res.trace)
        out.update(N=N, M=args.m, iterations=int(res.iterations), passes=int(res.evaluations),
                   converged=bool(res.converged), vlb=float(res.vlb), message=res.message,
                   seconds_per_pass=float(np.median(np.diff(tr[:, 0]))) if len(tr) > 1 else None,
                   first_pass_seconds=float(tr[0, 0]), peak_rss_mb=C.peak_rss_mb())
        if client is not None:
            def worker_peak():
                import resource
                return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out["worker_peak_rss_mb"] = sorted(client.run(worker_peak).values())
            client.close()
            cluster.close()
    print(MARK + json.dumps(out), flush=True)


def run_large_child(kind, args, log):
    cmd = [sys.executable, os.path.abspath(__file__), "--large", "--large-child", kind, "--m", str(args.m),
           "--d", str(args.d), "--seed", str(args.seed), "--uncached-n", str(args.uncached_n),
           "--large-n", str(args.large_n), "--parquet", str(args.parquet)]
    if args.cache_bytes is not None:
        cmd += ["--cache-bytes", str(args.cache_bytes)]
    t = time.perf_counter()
    with C.OtherLoad() as other:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-5000:])
        raise RuntimeError(f"{kind} run failed (exit {proc.returncode})")
    r = json.loads(lines[-1][len(MARK):])
    r["process_seconds"] = time.perf_counter() - t
    r["other_load"] = other.result
    log(f"{kind}: done in {r['process_seconds']:.1f}s")
    return r


def large(args):
    import tempfile

    load_start = C.warn_if_busy()
    t0 = time.perf_counter()
    log = C.progress_logger(t0)
    runs = {}
    runs["uncached"] = run_large_child("uncached", args, log)
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        args.parquet = os.path.join(tmp, "poisson.parquet")
        t = time.perf_counter()
        write_parquet(args.parquet, args.large_n, args.d, args.seed)
        write_seconds = time.perf_counter() - t
        log(f"wrote {args.large_n:,} rows to Parquet in {write_seconds:.1f}s")
        runs["local"] = run_large_child("local", args, log)
        if not args.no_dask:
            runs["dask"] = run_large_child("dask", args, log)
    u, lo, da = runs["uncached"], runs["local"], runs.get("dask")
    print()
    C.print_table(["rows", "cached s/pass", "uncached s/pass", "ratio", "VLB rel. diff", "vs triangular solve"],
                  [[u["N"], u["seconds_per_pass"]["cached"], u["seconds_per_pass"]["uncached"], u["ratio"],
                    u["vlb_rel_diff"], u["vlb_rel_diff_vs_solve"]]],
                  title=f"one data pass, M={args.m}: projections kept vs recomputed")
    rows = [[k, r["N"], r["fit_seconds"], r["passes"], r["seconds_per_pass"], r["converged"], r["vlb"], r["peak_rss_mb"],
             ", ".join(f"{x:.0f}" for x in r.get("worker_peak_rss_mb", []))] for k, r in runs.items() if k != "uncached"]
    C.print_table(["executor", "rows", "fit s", "passes", "s/pass", "conv", "VLB", "peak RSS MiB", "workers' peak MiB"],
                  rows, title=f"Poisson sparse GP from Parquet, M={args.m}, D={args.d}, fpi, fixed hyperparameters")
    checks = {"uncached_within_1.5x": u["ratio"] <= 1.5,
              "vlb_within_1e-8_of_triangular_solve": max(u["vlb_rel_diff"], u["vlb_rel_diff_vs_solve"]) <= 1e-8,
              "local_peak_rss_below_1.5GiB": lo["peak_rss_mb"] < 1.5 * 1024}
    estimate = None
    if da is not None:
        rel = abs(da["vlb"] - lo["vlb"]) / abs(lo["vlb"])
        overhead = da["seconds_per_pass"] - lo["seconds_per_pass"]
        checks["dask_vlb_within_1e-10"] = rel <= 1e-10
        print(f"\n  Dask vs in-process: VLB relative difference {rel:.2e}; per pass {da['seconds_per_pass']:.2f}s "
              f"against {lo['seconds_per_pass']:.2f}s: overhead {overhead:+.2f}s per pass")
        # 16 nodes like this one, each holding N/16 rows: compute scales with rows per node, the
        # measured Dask overhead is added once per pass, passes as measured here.
        per_row = lo["seconds_per_pass"] / lo["N"]
        n8 = 10**8
        per_pass = n8 / 16 * per_row + max(overhead, 0.0)
        estimate = dict(N=n8, nodes=16, seconds_per_pass=per_pass, passes=lo["passes"],
                        seconds=per_pass * lo["passes"], assumptions="compute per row as measured in process on "
                        "this 2-core node; Dask overhead per pass as measured with 2 local workers; same passes")
        print(f"  estimate, N = 1e8 on 16 such nodes: {per_pass:.1f}s per pass × {lo['passes']} passes "
              f"≈ {per_pass * lo['passes'] / 60:.1f} min")
    for k, v in checks.items():
        print(f"  {k}: {C.verdict(v)}")
    out = C.results_dir(args.outdir)
    C.write_json(out / f"{args.out}.json", dict(
        benchmark="scale --large", config={k: v for k, v in vars(args).items() if k not in ("child", "large_child")},
        environment=C.environment(), parquet_write_seconds=write_seconds, runs=runs, checks=checks,
        estimate_1e8_16_nodes=estimate, total_seconds=time.perf_counter() - t0, load_average_start=load_start,
        load_average_end=C.load_average()))
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = ["cached pass", "uncached pass"] + [f"{k} pass (Parquet)" for k in runs if k != "uncached"]
    vals = [u["seconds_per_pass"]["cached"] / u["N"] * 1e6, u["seconds_per_pass"]["uncached"] / u["N"] * 1e6] + \
        [r["seconds_per_pass"] / r["N"] * 1e6 for k, r in runs.items() if k != "uncached"]
    ax.barh(labels, vals)
    ax.set_xlabel("seconds per 10⁶ rows per pass")
    ax.set_title(f"data pass cost, M={args.m}")
    fig.tight_layout()
    fig.savefig(out / f"{args.out}.png", dpi=120)
    plt.close(fig)
    print(f"\nwrote {out / (args.out + '.json')} and .png  ({time.perf_counter() - t0:.1f}s)")
    return runs


def main(argv=None):
    args = parse_args(argv)
    if args.large_child is not None:
        return large_child(args.large_child, args)
    if args.large:
        return large(args)
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
