"""The evidence behind ``engine="auto"``: every certified engine, and ``auto`` itself, on each model
kind and likelihood, timed to its certificate at the default tolerance.

Cells: a GLM (10 000 rows, 31 weights), a full GP (500 rows) and a sparse GP (10 000 rows, M = 100
k-means inducing inputs), all on 5 standardised synthetic inputs, with Gaussian, Bernoulli, Poisson,
Laplace and Student-t (ν = 3) likelihoods; and a full GP with three softmax latents (300 rows).
Fixed hyperparameters.  Each engine (``fpi``, ``fpb``, ``gradient`` — the certified engines of
:data:`gpvi.engines.auto.PREFERENCE`; ``fpb`` takes one latent function only) and ``auto`` is
fitted once to compile, then ``--repeats`` times, interleaved; the table gives the fastest time
of each (wall seconds of ``gpvi.fit``), whether it certified its optimum, and its VLB against the
best.

Verdicts, per cell: ``auto``'s engine is the fastest certified engine or within ×1.25 of it (the
timing noise of a shared 2-core machine); and ``auto`` is not slower than the default (``fpi``)
beyond that noise.

    python benchmarks/auto.py [--quick] [--repeats 3] [--outdir DIR]

Writes ``results/auto[_quick].{json,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets JAX_PLATFORMS before JAX is imported)

import numpy as np  # noqa: E402

import gpvi  # noqa: E402
from gpvi import kernels as K, likelihoods as L  # noqa: E402
from gpvi.engines import auto  # noqa: E402

KINDS = ("glm", "gp", "sparse")
LIKELIHOODS = ("gaussian", "bernoulli", "poisson", "laplace", "studentt")
NOISE = 1.25  # within this factor of the fastest counts as a tie


def make_y(lik, f, rng):
    n = f.shape[0]
    if lik == "gaussian":
        return f + 0.3 * rng.standard_normal(n)
    if lik == "bernoulli":
        return np.where(rng.random(n) < 1 / (1 + np.exp(-2 * f)), 1.0, -1.0)
    if lik == "poisson":
        return rng.poisson(np.exp(f)).astype(float)
    if lik == "laplace":
        return f + rng.laplace(0, 0.3, n)
    return f + 0.3 * rng.standard_t(3, n)


LIK = {"gaussian": lambda: L.Gaussian(variance=0.09), "bernoulli": L.Bernoulli, "poisson": L.Poisson,
       "laplace": lambda: L.Laplace(scale=0.3), "studentt": lambda: L.StudentT(df=3.0, scale=0.3)}


def cells(quick, seed):
    rng = np.random.default_rng(seed)
    n = {"glm": 2000, "gp": 150, "sparse": 2000} if quick else {"glm": 10000, "gp": 500, "sparse": 10000}
    out = []
    for kind in KINDS:
        for lik in (("bernoulli", "studentt") if quick else LIKELIHOODS):
            d = 30 if kind == "glm" else 5
            X = rng.standard_normal((n[kind], d))
            f = np.sin(2 * X @ rng.standard_normal(d) / np.sqrt(d)) + 0.5 * X[:, 0]
            y = make_y(lik, f, rng)
            if kind == "glm":
                X = np.c_[X, np.ones(len(X))]
                model = gpvi.GLM(LIK[lik]())
            elif kind == "gp":
                model = gpvi.GP(K.RBF(lengthscale=np.sqrt(d)), LIK[lik]())
            else:
                model = gpvi.SparseGP(K.RBF(lengthscale=np.sqrt(d)), LIK[lik](), inducing=100 if not quick else 30)
                model = model.initialise(X)
            out.append((f"{kind}/{lik}", model, X, y))
    X = rng.standard_normal((100 if quick else 300, 2))
    labels = (X[:, 0] > -0.5).astype(int) + (X[:, 1] > 0.5)
    out.append(("gp/softmax-3", gpvi.MultiLatent.full([K.RBF(lengthscale=1.5)] * 3, gpvi.Softmax(num_classes=3)),
                X, labels.astype(float)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small smoke run (a few cells, small data, 1 repeat)")
    p.add_argument("--repeats", type=int, default=None, help="timed fits per engine (default 3; quick 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outdir", default=None)
    a = p.parse_args(argv)
    repeats = a.repeats or (1 if a.quick else 3)
    C.warn_if_busy()
    t_all = time.perf_counter()
    rows, records = [], []
    with C.OtherLoad() as load:
        for name, model, X, y in cells(a.quick, a.seed):
            engines = [e for e in auto.PREFERENCE
                       if getattr(model, "num_latents", None) is None or gpvi.engines.get(e).latents]
            runs = engines + ["auto"]
            times = {e: [] for e in runs}
            res = {}
            for e in runs:  # compile
                gpvi.fit(model, X, y, engine=e, max_iter=3)
            for _ in range(repeats):
                for e in runs:
                    t = time.perf_counter()
                    res[e] = gpvi.fit(model, X, y, engine=e)
                    times[e].append(time.perf_counter() - t)
            best_vlb = max(r.vlb for r in res.values() if r.converged)
            t_of = {e: min(times[e]) for e in runs}
            certified = [e for e in engines if res[e].converged]
            fastest = min(certified, key=t_of.get)
            picked = res["auto"].engine
            ok_pick = t_of[picked] <= NOISE * t_of[fastest]
            ok_default = t_of["auto"] <= NOISE * t_of["fpi"]
            rec = {"cell": name, "auto_engine": picked, "fastest": fastest, "reason": res["auto"].extras["engine_choice"],
                   "seconds": t_of, "all_seconds": times, "converged": {e: res[e].converged for e in runs},
                   "best_vlb": best_vlb, "vlb_below_best": {e: best_vlb - res[e].vlb for e in runs},
                   "iterations": {e: res[e].iterations for e in runs}, "evaluations": {e: res[e].evaluations for e in runs},
                   "auto_within_noise_of_fastest": ok_pick, "auto_not_slower_than_default": ok_default}
            records.append(rec)
            rows.append([name] + [f"{t_of[e]:.3g}{'' if res[e].converged else ' (not certified)'}" if e in t_of else "-"
                                  for e in ("fpi", "fpb", "gradient", "auto")]
                        + [picked, fastest, C.verdict(ok_pick), C.verdict(ok_default)])
            print(f"{name}: " + ", ".join(f"{e} {t_of[e]:.3g} s" for e in runs), flush=True)
    headers = ["cell", "fpi s", "fpb s", "gradient s", "auto s", "auto ran", "fastest certified",
               f"auto ≤ {NOISE}× fastest", f"auto ≤ {NOISE}× fpi"]
    C.print_table(headers, rows, title="Time to a certified optimum (default tol), fastest of the repeats")
    out = C.results_dir(a.outdir)
    stem = "auto_quick" if a.quick else "auto"
    C.write_json(out / f"{stem}.json", {"environment": C.environment(), "repeats": repeats, "noise": NOISE,
                                       "cells": records, "load": load.result,
                                       "total_seconds": time.perf_counter() - t_all})
    plt = C.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    names = [r["cell"] for r in records]
    xs = np.arange(len(names))
    for j, e in enumerate(("fpi", "fpb", "gradient", "auto")):
        ax.bar(xs + (j - 1.5) * 0.2, [r["seconds"].get(e, np.nan) for r in records], 0.2, label=e)
    ax.set_xticks(xs, names, rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("seconds to a certified optimum")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)
    bad = [r["cell"] for r in records if not (r["auto_within_noise_of_fastest"] and r["auto_not_slower_than_default"])]
    print(f"\nauto within ×{NOISE} of the fastest certified engine and of fpi: "
          f"{len(records) - len(bad)}/{len(records)} cells" + (f"; not in {bad}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
