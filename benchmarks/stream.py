"""Streaming at scale (issue 16, "Beyond the paper"): sfp reading a Parquet file in row groups
against batch fpi on a subsample of the same problem.

For a Poisson and a logistic sparse GP (D = 3, M = 300 inducing inputs, fixed RBF
hyperparameters), N rows of synthetic data from a smooth latent function (random Fourier
features of an RBF GP, seeded) are written to a Parquet file one row group at a time (the
generator never holds more than a row group).  Then, in this order:

1. ``gpvi.fit_stream(engine="sfp")`` reads the file in row groups (row-group order shuffled per
   epoch, rows shuffled within a 65 536-row buffer), minibatches of B = 4096 rows, the paper's
   γ_t = 1/(1+√t), 2 epochs; the test NLPD is taken after each epoch (off the clock), and the
   peak RSS right after the stream (each likelihood runs in its own process, so the peak is
   its own; nothing of size N is ever in memory before the fpi part);
2. batch ``fpi`` on the first ``n_sub`` = min(N, 10⁶) rows (the rows are i.i.d., so that is a
   random subsample), to convergence; its time per iteration, scaled by N / n_sub (a data pass
   is linear in N), estimates one full-data fpi iteration at N.

Both use the same inducing inputs (k-means on the first 100 000 rows) and hyperparameters.
Claims (verdicts in the table): test NLPD of sfp after ≤ 2 epochs within 0.5 % of batch fpi's;
peak memory < 1.5 GiB; one sfp epoch ≤ 1.5 × one full-data fpi iteration.

Also kin40k (fgp split) with Student-t noise through sfp against fpi at the same hyperparameters
(``--no-kin40k`` to skip; skipped when the shared data are absent).

Writes ``results/stream[_quick].{json,png,md}``.  ``--quick``: N = 40 000, M = 50, B = 1000
(a smoke run: the claims are judged but not expected to hold at that size); kin40k on 2000 training
and 1000 test rows, M = 30, 2 sfp epochs.
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

import numpy as np  # noqa: E402

LIKELIHOODS = ("poisson", "logistic")
NLPD_TOL = 0.005
MARK = "STREAM-RESULT "
MEMORY_GIB = 1.5
EPOCH_RATIO = 1.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 40000, M = 50, B = 1000")
    p.add_argument("--n", type=int, default=None, help="rows in the Parquet file (default 10^7)")
    p.add_argument("--n-sub", type=int, default=None, help="rows of the batch fpi subsample (default min(N, 10^6))")
    p.add_argument("--m", type=int, default=None, help="inducing inputs (default 300)")
    p.add_argument("--batch-size", type=int, default=None, help="sfp minibatch rows (default 4096)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--row-group", type=int, default=None, help="Parquet row-group rows (default 65536)")
    p.add_argument("--n-test", type=int, default=20_000)
    p.add_argument("--likelihoods", nargs="+", default=list(LIKELIHOODS), choices=LIKELIHOODS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-kin40k", action="store_true", help="skip the kin40k Student-t part")
    p.add_argument("--out", default=None, help="output stem (default stream, or stream_quick)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help="where the Parquet files go (default: a temporary folder)")
    p.add_argument("--outdir", default=None, help="where to write JSON/PNG/MD (default benchmarks/results)")
    a = p.parse_args(argv)
    a.n = a.n or (40_000 if a.quick else 10_000_000)
    a.n_sub = min(a.n, a.n_sub or (a.n if a.quick else 1_000_000))
    a.m = a.m or (50 if a.quick else 300)
    a.batch_size = a.batch_size or (1000 if a.quick else 4096)
    a.row_group = a.row_group or (5000 if a.quick else 65536)
    a.n_test = min(a.n_test, 5000) if a.quick else a.n_test
    a.stem = a.out or ("stream_quick" if a.quick else "stream")
    return a


def _rows(lik, n, seed, block_seed):
    """``n`` rows of the problem: X (n, 3) standard normal, y from the latent f."""
    rng = np.random.default_rng([seed, block_seed])
    X = rng.standard_normal((n, 3))
    f = C.smooth_latent(X, seed, lengthscale=1.5, scale=1.0)
    if lik == "poisson":
        y = rng.poisson(np.exp(f + 0.5)).astype(np.float64)
    else:
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-2.0 * f))).astype(np.float64)
    return X, y


def write_parquet(path, lik, N, row_group, seed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("x0", pa.float64()), ("x1", pa.float64()), ("x2", pa.float64()), ("y", pa.float64())])
    with pq.ParquetWriter(path, schema) as w:
        for k, s in enumerate(range(0, N, row_group)):
            X, y = _rows(lik, min(row_group, N - s), seed, k + 1)
            w.write_table(pa.table({"x0": X[:, 0], "x1": X[:, 1], "x2": X[:, 2], "y": y}, schema=schema),
                          row_group_size=row_group)


def nlpd(fit, X, y):
    return float(-np.mean(fit.log_predictive_density(X, y)))


def run_one(lik, a, workdir, log):
    import gpvi
    from gpvi import likelihoods as L

    path = os.path.join(workdir, f"stream_{lik}_{a.n}.parquet")
    t = time.perf_counter()
    if not os.path.exists(path):
        write_parquet(path, lik, a.n, a.row_group, a.seed)
    gen_s = time.perf_counter() - t
    log(f"{lik}: wrote {a.n} rows to {path} in {gen_s:.1f} s")
    Xte, yte = _rows(lik, a.n_test, a.seed, 0)  # block 0 is never in the file
    src = gpvi.data.stream.from_parquet(path, "y")
    Xh, yh, _ = src.head(min(100_000, a.n))
    likelihood = L.Poisson() if lik == "poisson" else L.Bernoulli()
    kernel = gpvi.kernels.RBF(variance=1.0, lengthscale=1.5)
    model = gpvi.SparseGP(kernel, likelihood, inducing=a.m).initialise(Xh, seed=a.seed)
    model = model.replace(mean=0.5 if lik == "poisson" else 0.0)
    del Xh, yh

    # 1. sfp from the file
    per_epoch = []

    def on_epoch(epoch, mdl, state):
        fr = gpvi.FitResult(model=mdl, state=state, vlb=float("nan"), iterations=0, converged=False, message="",
                            trace=np.zeros((0, 2)), engine="sfp", prior=mdl.prior_cache(None), input_dim=3)
        per_epoch.append({"epoch": epoch + 1, "test_nlpd": nlpd(fr, Xte, yte), "rss_mb": C.current_rss_mb()})
        log(f"{lik}: sfp epoch {epoch + 1}: test NLPD {per_epoch[-1]['test_nlpd']:.5f}")

    with C.OtherLoad() as load_sfp:  # (a stream: the hook sees the state after every epoch)
        res = gpvi.fit_stream(model, src, engine="sfp", batch_size=a.batch_size, epochs=a.epochs, seed=a.seed,
                              on_state=lambda mdl, state, p: on_epoch(len(per_epoch), mdl, state))
    peak_after_stream = C.peak_rss_mb()
    log(f"{lik}: sfp: {res.message}")
    if len(per_epoch) < a.epochs:  # stopped early: judge the state it stopped at
        on_epoch(len(per_epoch), res.model, res.state)
    epoch_s = np.diff(np.concatenate([[0.0], res.trace[:, 0]]))[:a.epochs]
    log(f"{lik}: sfp {a.epochs} epochs in {res.trace[-1, 0]:.1f} s of stepping "
        f"({res.extras['rows_per_second']:.3g} rows/s), peak RSS {peak_after_stream:.0f} MiB")

    # 2. batch fpi on the subsample (the first n_sub rows of the file)
    Xs, ys, _ = src.head(a.n_sub)
    if lik == "logistic":
        ys = likelihood.validate(ys)
    with C.OtherLoad() as load_fpi:
        ref = gpvi.fit(model, Xs, ys, engine="fpi")
    del Xs, ys
    it_s = np.diff(ref.trace[:, 0])
    fpi_iter_s = C.median(it_s[1:]) if it_s.size > 1 else float(it_s[0])  # the first includes compilation
    fpi_iter_at_N = fpi_iter_s * a.n / a.n_sub
    nl_fpi = nlpd(ref, Xte, yte)
    log(f"{lik}: fpi on {a.n_sub} rows: {ref.iterations} iterations, {fpi_iter_s:.3g} s each, "
        f"test NLPD {nl_fpi:.5f}")
    best = min(per_epoch, key=lambda r: r["test_nlpd"])
    rel = [abs(r["test_nlpd"] - nl_fpi) / abs(nl_fpi) for r in per_epoch]
    return {
        "likelihood": lik, "N": a.n, "n_sub": a.n_sub, "M": a.m, "B": a.batch_size, "row_group": a.row_group,
        "generate_s": gen_s, "sfp_epochs": per_epoch, "sfp_epoch_seconds": epoch_s.tolist(),
        "sfp_rows_per_second": res.extras["rows_per_second"], "sfp_steps": res.extras["steps"],
        "sfp_message": res.message, "sfp_backtracks": res.backtracks,
        "sfp_trace": res.trace, "peak_rss_after_stream_mb": peak_after_stream,
        "fpi_iterations": ref.iterations, "fpi_converged": ref.converged, "fpi_seconds": ref.seconds,
        "fpi_iteration_seconds": fpi_iter_s, "fpi_iteration_at_N_seconds": fpi_iter_at_N,
        "fpi_test_nlpd": nl_fpi, "sfp_best_test_nlpd": best["test_nlpd"], "nlpd_rel_diff_per_epoch": rel,
        "claim_nlpd": bool(min(rel) <= NLPD_TOL), "claim_memory": bool(peak_after_stream / 1024 < MEMORY_GIB),
        # the last epoch: the first one includes compiling the step
        "epoch_over_fpi_iteration": float(epoch_s[-1]) / fpi_iter_at_N,
        "claim_epoch_time": bool(float(epoch_s[-1]) <= EPOCH_RATIO * fpi_iter_at_N),
        "other_cores_sfp": load_sfp.result.get("other_cores"), "other_cores_fpi": load_fpi.result.get("other_cores"),
    }


def run_kin40k(a, log):
    """kin40k (fgp split: 10 000 train / 30 000 test) with Student-t noise, sfp against fpi at the
    same hyperparameters (learned by fpi on the first 2048 training rows, as Cheng & Boots
    initialise theirs).  Student-t is not log-concave: both engines clip γ_i at 0 where I − S is
    not positive definite."""
    import datasets as D

    import gpvi
    from gpvi import likelihoods as L

    def load(part):
        X = np.loadtxt(D.data_path("kin40k", "fgp_split", f"kin40k_{part}_data.asc"))
        y = np.loadtxt(D.data_path("kin40k", "fgp_split", f"kin40k_{part}_labels.asc"))
        return X, y

    Xtr, ytr = load("train")
    Xte, yte = load("test")
    if a.quick:
        Xtr, ytr, Xte, yte = Xtr[:2000], ytr[:2000], Xte[:1000], yte[:1000]
    Xtr, Xte = D.zscore(Xtr, Xte)
    mu, sd = ytr.mean(), ytr.std()
    ytr, yte = (ytr - mu) / sd, (yte - mu) / sd
    M = 30 if a.quick else 256
    model = gpvi.SparseGP(gpvi.kernels.RBF(variance=1.0, lengthscale=np.ones(Xtr.shape[1])),
                          L.StudentT(scale=0.3, df=4.0), inducing=M).initialise(Xtr, seed=a.seed)
    t = time.perf_counter()
    init = gpvi.fit(model, Xtr[:2048], ytr[:2048], learn_hyperparameters=True, max_rounds=10 if a.quick else 40)
    model = init.model
    log(f"kin40k: hyperparameters from 2048 rows in {time.perf_counter() - t:.1f} s")
    ref = gpvi.fit(model, Xtr, ytr)

    def metrics(fr):
        m, _ = fr.predict_y(Xte)
        return {"test_nlpd": float(-np.mean(fr.log_predictive_density(Xte, yte))),
                "test_nmse": float(np.mean((m - yte) ** 2) / np.var(yte))}

    per_epoch = []

    def on_state(mdl, state, progress):  # at the start and after every epoch
        if progress.iteration == 0:
            return
        fr = gpvi.FitResult(model=mdl, state=state, vlb=float("nan"), iterations=0, converged=False, message="",
                            trace=np.zeros((0, 2)), engine="sfp", prior=mdl.prior_cache(None), input_dim=8)
        per_epoch.append({"epoch": len(per_epoch) + 1, **metrics(fr)})

    B = 256 if a.quick else 1024
    res = gpvi.fit(model, Xtr, ytr, engine="sfp", on_state=on_state,
                   engine_options={"batch_size": B, "epochs": 2 if a.quick else 5, "seed": a.seed})
    out = {"N_train": len(ytr), "N_test": len(yte), "M": M, "B": B, "fpi": {**metrics(ref), "vlb": ref.vlb,
           "iterations": ref.iterations, "converged": ref.converged, "clipped": ref.clipped},
           "sfp_epochs": per_epoch, "sfp_vlb": res.vlb, "sfp_clipped": res.clipped, "sfp_backtracks": res.backtracks,
           "hyperparameters": {k: np.asarray(v).tolist() for k, v in model.parameters().items() if k != "inducing"}}
    rel = [abs(e["test_nlpd"] - out["fpi"]["test_nlpd"]) / abs(out["fpi"]["test_nlpd"]) for e in per_epoch]
    out["nlpd_rel_diff_per_epoch"] = rel
    out["claim_nlpd_2_epochs"] = bool(min(rel[:2]) <= NLPD_TOL)
    log(f"kin40k: fpi NLPD {out['fpi']['test_nlpd']:.4f} nMSE {out['fpi']['test_nmse']:.4f}; sfp per epoch "
        + ", ".join(f"{e['test_nlpd']:.4f}/{e['test_nmse']:.4f}" for e in per_epoch))
    return out


def main(argv=None):
    a = parse_args(argv)
    import tempfile

    C.warn_if_busy()
    log = C.progress_logger(time.perf_counter())
    if a.child or a.workdir:
        return _main(a, log, a.workdir)
    import shutil

    workdir = tempfile.mkdtemp(prefix="gpvi-stream-")  # the Parquet files of every child: removed at the end
    try:
        return _main(a, log, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _main(a, log, workdir):
    if a.child:
        # one likelihood in its own process, so its peak RSS is its own (ru_maxrss never drops)
        print(MARK + json.dumps(C._jsonable(run_one(a.child, a, workdir, log))), flush=True)
        return None
    results = []
    for lik in a.likelihoods:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", lik, "--workdir", workdir]
        for k in ("n", "n_sub", "m", "batch_size", "epochs", "row_group", "n_test", "seed"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
        cmd += ["--quick"] if a.quick else []
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith(MARK))[len(MARK):]))
    kin = None
    if not a.no_kin40k:
        try:
            kin = run_kin40k(a, log)
        except FileNotFoundError as err:  # datasets.DataUnavailable
            log(f"kin40k skipped: {err}")
    rows = []
    for r in results:
        rows.append([r["likelihood"], r["N"], r["n_sub"], r["fpi_test_nlpd"],
                     " / ".join(f"{e['test_nlpd']:.5f}" for e in r["sfp_epochs"]),
                     f"{100 * min(r['nlpd_rel_diff_per_epoch']):.3f} %", C.verdict(r["claim_nlpd"]),
                     r["peak_rss_after_stream_mb"], C.verdict(r["claim_memory"]),
                     r["sfp_epoch_seconds"][-1], r["fpi_iteration_at_N_seconds"], r["epoch_over_fpi_iteration"],
                     C.verdict(r["claim_epoch_time"])])
    headers = ["likelihood", "N", "fpi rows", "fpi NLPD", "sfp NLPD per epoch", "best diff", "≤0.5 %",
               "peak MiB", "<1.5 GiB", "last epoch s", "fpi it. s @N", "ratio", "≤1.5×"]
    C.print_table(headers, rows, title=f"sfp from Parquet row groups vs batch fpi (M = {a.m}, B = {a.batch_size})")
    out = C.results_dir(a.outdir)
    C.write_json(out / f"{a.stem}.json", {"args": vars(a), "environment": C.environment(),
                                           "load_average": C.load_average(), "results": results,
                                           "kin40k_studentt": kin})
    if kin is not None:
        C.print_table(["engine", "epoch", "test NLPD", "test nMSE"],
                      [["fpi", "-", kin["fpi"]["test_nlpd"], kin["fpi"]["test_nmse"]]]
                      + [["sfp", e["epoch"], e["test_nlpd"], e["test_nmse"]] for e in kin["sfp_epochs"]],
                      title=f"kin40k, Student-t noise (M = {kin['M']}, B = {kin['B']}, {kin['N_train']} train rows)")
    md = [f"# Streaming at scale ({'quick smoke run' if a.quick else 'full run'})", "",
          f"N = {a.n} rows in Parquet row groups of {a.row_group}; batch fpi on the first {a.n_sub} rows; "
          f"M = {a.m}, minibatches of {a.batch_size}, {a.epochs} epochs, γ_t = 1/(1+√t). 2 cores, load "
          f"average at the end {C.load_average()} (the run itself keeps about 2); ratios are from one run.", "",
          "| claim | " + " | ".join(r["likelihood"] for r in results) + " |", "|---|" + "---|" * len(results)]
    md.append("| test NLPD within 0.5 % of batch fpi after ≤ 2 epochs | " + " | ".join(
        f"{'holds' if r['claim_nlpd'] else 'does not hold'} ({100 * min(r['nlpd_rel_diff_per_epoch']):.3f} %)"
        for r in results) + " |")
    md.append("| peak memory < 1.5 GiB, flat in N | " + " | ".join(
        f"{'holds' if r['claim_memory'] else 'does not hold'} ({r['peak_rss_after_stream_mb']:.0f} MiB)"
        for r in results) + " |")
    md.append("| one epoch ≤ 1.5 × one full-data fpi iteration | " + " | ".join(
        f"{'holds' if r['claim_epoch_time'] else 'does not hold'} ({r['epoch_over_fpi_iteration']:.2f}×)"
        for r in results) + " |")
    if kin is not None:
        md.append(f"| kin40k Student-t (M = {kin['M']}): test NLPD within 0.5 % of fpi's after ≤ 2 epochs | "
                  f"{'holds' if kin['claim_nlpd_2_epochs'] else 'does not hold'} "
                  f"({100 * min(kin['nlpd_rel_diff_per_epoch'][:2]):.3f} %; fpi {kin['fpi']['test_nlpd']:.4f}, "
                  f"sfp {' / '.join(format(e['test_nlpd'], '.4f') for e in kin['sfp_epochs'])}) |"
                  + " |" * (len(results) - 1))
    (out / f"{a.stem}.md").write_text("\n".join(md) + "\n")
    plt = C.pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        ep = [e["epoch"] for e in r["sfp_epochs"]]
        ax.plot(ep, [e["test_nlpd"] for e in r["sfp_epochs"]], "o-", label="sfp (stream)")
        ax.axhline(r["fpi_test_nlpd"], color="k", ls="--", label=f"fpi on {r['n_sub']} rows")
        ax.axhspan(r["fpi_test_nlpd"] * (1 - NLPD_TOL), r["fpi_test_nlpd"] * (1 + NLPD_TOL), color="0.9")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test NLPD")
        ax.set_title(f"{r['likelihood']}, N = {r['N']}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{a.stem}.png", dpi=110)
    return results


if __name__ == "__main__":
    main()
