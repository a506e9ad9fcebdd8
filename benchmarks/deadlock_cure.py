"""What the cure of the XLA:CPU deadlock costs (issue 30, §1).

Multi-latent fits used to hang for good: ``jax.vmap`` over the latents made batched LAPACK calls,
which on XLA:CPU block their pool thread until sub-tasks queued on the same pool finish — with
the concurrency-optimised scheduler running two such calls at once on two cores, no thread was
left to run those sub-tasks.  gpvi now maps over latents block by block
(:mod:`gpvi._batching`).  This script runs the same fits, each in a fresh process, under three
variants of the same source tree:

- ``cure``: gpvi as it is (block-by-block maps as a sequential ``lax.map``, XLA's default
  scheduler);
- ``cure, unrolled``: the same maps unrolled up to 16 latents (one copy of the body per block,
  which XLA may run side by side: the cure before 2026-11-29);
- ``scheduler off``: the latent maps put back to ``jax.vmap`` and XLA's concurrency-optimised
  scheduler turned off (``--xla_cpu_enable_concurrency_optimized_scheduler=false``: the other
  known cure);
- ``before``: the latent maps put back to ``jax.vmap`` with the default scheduler (the code
  before the cure; a run that does not finish within ``--timeout`` counts as hung).

Fits: the default ``GPClassifier`` on iris (105 rows, learned hyperparameters, compile time
included) and USPS 4-7-9 (1233 × 256, three full-GP latents, fpi) with fixed and with learned
hyperparameters shared by the classes (nguyen2014's ``fixed`` and ``learned_tied``); the USPS
times exclude a warm-up fit that compiles.  Writes ``results/deadlock_cure.{json,png}``
(``--out`` another stem).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

VARIANTS = {
    "cure": {},
    "cure, unrolled": {"GPVI_BENCH_UNROLL": "1"},
    "scheduler off": {"GPVI_BENCH_VMAP": "1", "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=false"},
    "before": {"GPVI_BENCH_VMAP": "1"},
}

_WORKER = """
import json, os, sys, time
import numpy as np
import jax
import gpvi, gpvi.objective, gpvi.engines._common, gpvi.fitting.warmstart, gpvi.fitting.predict
if os.environ.get("GPVI_BENCH_UNROLL") == "1":  # the cure with the maps unrolled up to 16 latents
    import gpvi._batching
    gpvi._batching.UNROLL_LIMIT = 16
if os.environ.get("GPVI_BENCH_VMAP") == "1":  # the code before the cure: latents batched by vmap
    for mod in (gpvi.objective, gpvi.engines._common, gpvi.fitting.warmstart, gpvi.fitting.predict):
        mod.map_latents = lambda fn, *args: jax.vmap(fn)(*args)
task, data = sys.argv[1], sys.argv[2]
out = {}
if task == "iris":
    from sklearn.datasets import load_iris
    X, y = load_iris(return_X_y=True)
    keep = np.random.default_rng(0).permutation(150)[:105]
    t = time.perf_counter()
    clf = gpvi.GPClassifier().fit(X[keep], y[keep])
    out = dict(seconds=time.perf_counter() - t, accuracy=float(clf.score(X, y)))
else:
    tr = np.loadtxt(os.path.join(data, "usps479", "train_1.csv.gz"), delimiter=",")
    X, y = tr[:, 3:], tr[:, :3].argmax(1).astype(float)
    k = gpvi.kernels.RBF(variance=1.0, lengthscale=float(np.sqrt(X.shape[1])))
    model = gpvi.MultiLatent.full([k] * 3, gpvi.Softmax(num_classes=3))
    tied = ["latents.*.kernel.variance", "latents.*.kernel.lengthscale"]
    lh = False if task == "usps_fixed" else tied
    gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=lh, max_rounds=1, max_iter=3)  # compiles
    t = time.perf_counter()
    r = gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=lh)
    out = dict(seconds=time.perf_counter() - t, vlb=float(r.vlb), evaluations=int(r.evaluations),
               rounds=int(r.hyperparameter_rounds))
print("RESULT " + json.dumps(out), flush=True)
"""


def run_one(task: str, variant: str, timeout: float, data: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GPVI_WATCHDOG_SECONDS": "0", **VARIANTS[variant]}
    env.setdefault("GPVI_COMPILATION_CACHE", "0")
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(_WORKER), task, data], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "hung", "wall": time.perf_counter() - t}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"status": "failed", "error": p.stderr[-1500:]}
    return {"status": "ok", "wall": time.perf_counter() - t, **json.loads(lines[-1][7:])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="fresh processes per task and variant")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a process counts as hung")
    ap.add_argument("--tasks", nargs="+", default=["iris", "usps_fixed", "usps_tied"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--outdir", default=None)
    ap.add_argument("--out", default="deadlock_cure", help="output stem in the results folder")
    a = ap.parse_args(argv)
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "agp_splits")
    C.warn_if_busy()
    runs = {}
    for rep in range(a.repeats):  # interleaved, so every variant sees the same machine load
        for task in a.tasks:
            for variant in a.variants:
                r = run_one(task, variant, a.timeout, data)
                runs.setdefault(f"{task}|{variant}", []).append(r)
                print(f"  {task:11s} {variant:14s} rep {rep}: {r['status']} "
                      f"{r.get('seconds', float('nan')):.2f} s", flush=True)
    rows, summary = [], {}
    for task in a.tasks:
        base = None
        for variant in a.variants:
            rs = runs[f"{task}|{variant}"]
            ok = [r["seconds"] for r in rs if r["status"] == "ok"]
            med = C.median(ok) if ok else float("nan")
            if variant == "cure":
                base = med
            summary[f"{task}|{variant}"] = dict(median_seconds=med, finished=len(ok), runs=len(rs),
                                                hung=sum(r["status"] == "hung" for r in rs),
                                                vlb=[r.get("vlb") for r in rs if r["status"] == "ok"])
            rows.append([task, variant, f"{len(ok)}/{len(rs)}", C.fmt(med, 3),
                         C.fmt(med / base, 3) if base and ok else "-"])
    C.print_table(["fit", "variant", "finished", "median s", "÷ cure"], rows,
                  title="Cost of the deadlock cure (fresh process per fit; USPS times exclude compilation)")
    out = C.results_dir(a.outdir)
    C.write_json(out / f"{a.out}.json", dict(environment=C.environment(), args=vars(a), runs=runs, summary=summary))
    plt = C.pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(a.variants)
        for j, variant in enumerate(a.variants):
            vals = [summary[f"{t}|{variant}"]["median_seconds"] for t in a.tasks]
            ax.bar([i + j * width for i in range(len(a.tasks))], vals, width, label=variant)
        ax.set_xticks([i + width * (len(a.variants) - 1) / 2 for i in range(len(a.tasks))], a.tasks)
        ax.set_ylabel("seconds (median; missing bar: hung)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{a.out}.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
