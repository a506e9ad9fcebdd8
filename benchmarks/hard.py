"""Hard but valid posteriors: where the fixed-point map does not contract (issue 30 §3).

Twelve small problems across likelihoods and model kinds on which the natural-gradient
(fixed-point) step of fpi is damped, stalls, or cannot start: very large kernel or prior
variances (1e4–1e8), separable classes, counts in the millions, heavy-tailed noise whose
curvature has to be clipped.  Each is fitted from the prior by every engine that maximises the VLB
(fpi — the default —, fpb, gradient) at ``fit``'s default settings (``tol = 1e-6``,
``max_iter = 500``), and by fpi with ``max_iter = 2000`` ("fpi@2000"); the table gives per engine
the iterations, the passes over the data, the seconds (compilation included: each problem is a
new shape) and whether it converged (certified gap).  The best VLB over the engines is the
reference: a converged engine must be within 1e-6 relative of it.

``--label NAME`` names the run in the JSON (``results/hard[_NAME].json``); ``--before FILE`` adds
that run's fpi columns to the table and the figure (the "before" of a change: run the script once
with the old code, e.g. ``PYTHONPATH=/tmp/old/src python benchmarks/hard.py --label before``).
``--quick`` fits three of the cheap problems with fpi (the smoke run of the tests).  Writes ``results/hard*.{json,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets JAX to the CPU before gpvi is imported)
import numpy as np  # noqa: E402

import gpvi  # noqa: E402
from gpvi import kernels as K, likelihoods as L  # noqa: E402

ENGINES = ("fpi", "fpb", "gradient", "fpi@2000")  # fpi@2000: fpi with max_iter = 2000
QUICK = ["sparse-logit-separable-var1e6", "gp-poisson-millions-var1e4", "gp-laplace-var1e6"]


def problems():
    """``{name: (model, X, y, what)}``: the twelve problems (fixed seeds)."""
    P = {}
    r = np.random.default_rng(0)
    X = r.normal(size=(200, 2))
    f = np.sin(2 * X[:, 0]) + X[:, 1]
    y_noisy = (r.uniform(size=200) < 1 / (1 + np.exp(-3 * f))).astype(float)
    y_sep = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(float)
    P["gp-logit-var1e8"] = (gpvi.GP(kernel=K.RBF(1e8, 1.0), likelihood=L.Bernoulli()), X, y_noisy,
                            "full GP, logistic, kernel variance 1e8")
    P["sparse-logit-separable-var1e6"] = (
        gpvi.SparseGP(kernel=K.RBF(1e6, 1.0), likelihood=L.Bernoulli(), inducing=X[:30]), X, y_sep,
        "sparse GP (M = 30), logistic, separable classes, kernel variance 1e6")
    r = np.random.default_rng(1)
    Xc = r.uniform(-2, 2, (300, 1))
    yc = r.poisson(np.exp(12 + 1.5 * np.sin(2 * Xc[:, 0]))).astype(float)
    P["gp-poisson-millions-var1e4"] = (gpvi.GP(kernel=K.RBF(1e4, 1.0), likelihood=L.Poisson()), Xc[:150], yc[:150],
                                       "full GP, Poisson counts ~1e5–1e6, kernel variance 1e4")
    r3 = np.random.default_rng(3)
    Xo = r3.normal(size=(200, 2))
    levels = np.digitize(Xo[:, 0] + Xo[:, 1], [-1, 0, 1]).astype(float)
    P["gp-ordinal-separable-var1e6"] = (gpvi.GP(kernel=K.RBF(1e6, 1.0), likelihood=L.Ordinal(edges=[-1.0, 0.0, 1.0])),
                                        Xo, levels, "full GP, ordinal (4 levels), separable, kernel variance 1e6")
    P["gp-probit-var1e6"] = (gpvi.GP(kernel=K.RBF(1e6, 1.0), likelihood=L.Bernoulli(link="probit")), X, y_noisy,
                             "full GP, probit, kernel variance 1e6")
    P["glm-logit-separable-flat"] = (gpvi.GLM(L.Bernoulli(), prior_variance=1e6), X, y_sep,
                                     "logistic GLM, separable classes, prior variance 1e6")
    P["sparse-poisson-millions"] = (gpvi.SparseGP(kernel=K.RBF(1.0, 1.0), likelihood=L.Poisson(), inducing=Xc[::15]),
                                    Xc, yc, "sparse GP (M = 20), Poisson counts ~1e5–1e6")
    r2 = np.random.default_rng(2)
    Xt = r2.uniform(-3, 3, (200, 1))
    yt = np.sin(Xt[:, 0]) + 0.1 * r2.standard_t(1.0, 200)
    P["gp-studentt-cauchy-outliers"] = (gpvi.GP(kernel=K.RBF(1.0, 1.0), likelihood=L.StudentT(df=3.0, scale=0.1)), Xt, yt,
                                        "full GP, Student-t (ν = 3) on Cauchy noise: curvature clipped")
    P["sparse-studentt-var1e4"] = (
        gpvi.SparseGP(kernel=K.RBF(1e4, 1.0), likelihood=L.StudentT(df=3.0, scale=0.1), inducing=Xt[::10]), Xt, yt,
        "sparse GP (M = 20), Student-t on Cauchy noise, kernel variance 1e4")
    P["gp-laplace-var1e6"] = (gpvi.GP(kernel=K.RBF(1e6, 1.0), likelihood=L.Laplace(scale=0.1)), Xt, yt,
                              "full GP, Laplace noise, kernel variance 1e6")
    P["gp-exponential-var1e6"] = (gpvi.GP(kernel=K.RBF(1e6, 1.0), likelihood=L.Exponential()), Xc[:150],
                                  r3.exponential(np.exp(np.sin(Xc[:150, 0]))), "full GP, exponential, kernel variance 1e6")
    Xs = r3.normal(size=(150, 2))
    ys = np.digitize(Xs[:, 0], [-0.5, 0.5]).astype(float)
    P["gp-softmax-separable-var1e4"] = (
        gpvi.MultiLatent.full([K.RBF(1e4, 1.0)] * 3, gpvi.Softmax(num_classes=3)), Xs, ys,
        "full GP, softmax (3 classes, one latent each), separable, kernel variance 1e4")
    return P


def run_one(model, X, y, engine):
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            name, _, cap = engine.partition("@")
            r = gpvi.fit(model, X, y, engine=name, **({"max_iter": int(cap)} if cap else {}))
        except Exception as err:  # noqa: BLE001 - an engine that refuses is a result too
            return dict(status="error", message=f"{type(err).__name__}: {err}", seconds=time.perf_counter() - t)
    return dict(status="converged" if r.converged else "not converged", iterations=int(r.iterations),
                passes=int(r.evaluations),
                vlb=float(r.vlb), gap=float(r.gap), backtracks=int(r.backtracks), message=r.message,
                extras={k: v for k, v in r.extras.items() if k in ("rescues", "start_scale", "stalled")},
                seconds=time.perf_counter() - t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--label", default=None)
    ap.add_argument("--before", default=None, help="JSON of an earlier run whose fpi columns are shown beside")
    ap.add_argument("--outdir", default=None)
    args = ap.parse_args(argv)
    probs = problems()
    names = QUICK if args.quick else list(probs)
    engines = ("fpi",) if args.quick else ENGINES
    results = {}
    for name in names:
        model, X, y, what = probs[name]
        results[name] = dict(what=what, engines={e: run_one(model, X, y, e) for e in engines})
        best = max((v["vlb"] for v in results[name]["engines"].values() if np.isfinite(v.get("vlb", np.nan))),
                   default=np.nan)
        results[name]["best_vlb"] = best
        for v in results[name]["engines"].values():
            v["below_best"] = (best - v["vlb"]) / max(1.0, abs(best)) if np.isfinite(v.get("vlb", np.nan)) else None
        print(name, {e: (v["status"], v.get("iterations")) for e, v in results[name]["engines"].items()}, flush=True)
    before = None
    if args.before:
        import json
        with open(args.before) as fh:
            before = json.load(fh)["problems"]
    headers = ["problem"] + (["fpi before"] if before else []) + list(engines) + ["best VLB"]
    rows = []
    for name in names:
        row = [name]
        if before:
            b = before.get(name, {}).get("engines", {}).get("fpi", {})
            row.append(_cell(b))
        row += [_cell(results[name]["engines"][e]) for e in engines] + [results[name]["best_vlb"]]
        rows.append(row)
    C.print_table(headers, rows, title="Hard but valid posteriors (fit's defaults: tol 1e-6, max_iter 500; "
                  "each cell: iterations / passes over the data / seconds / outcome)")
    conv = {e: sum(results[n]["engines"][e]["status"] == "converged" for n in names) for e in engines}
    print("converged:", ", ".join(f"{e} {c}/{len(names)}" for e, c in conv.items()))
    wrong = [(n, e) for n in names for e, v in results[n]["engines"].items()
             if v["status"] == "converged" and v["below_best"] is not None and v["below_best"] > 1e-6]
    print("converged but more than 1e-6 relative below the best VLB:", wrong or "none")
    out = C.results_dir(args.outdir)
    stem = "hard" + ("_quick" if args.quick else "") + (f"_{args.label}" if args.label else "")
    C.write_json(out / f"{stem}.json", dict(problems=results, converged=conv, converged_below_best=wrong,
                                            environment=C.environment(), label=args.label))
    _figure(out / f"{stem}.png", names, results, engines, before)
    return results


def _cell(v):
    if not v:
        return "—"
    if v.get("status") == "error":
        return "error"
    tag = {"converged": "conv", "not converged": "stalled" if v.get("extras", {}).get("stalled") else "no"}[v["status"]]
    return f"{v['iterations']} / {v.get('passes', '?')} / {v['seconds']:.1f} s / {tag}"


def _figure(path, names, results, engines, before):
    plt = C.pyplot()
    cols = ([("fpi before", lambda n: before.get(n, {}).get("engines", {}).get("fpi", {}))] if before else [])
    cols += [(e, lambda n, e=e: results[n]["engines"][e]) for e in engines]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(names) + 1.5))
    h = 0.8 / len(cols)
    for j, (label, get) in enumerate(cols):
        its = [get(n).get("iterations", 0) or 0 for n in names]
        ok = [get(n).get("status") == "converged" for n in names]
        ypos = np.arange(len(names)) + j * h
        ax.barh(ypos, its, height=h, label=label, color=f"C{j}", alpha=0.9)
        for yy, it, good in zip(ypos, its, ok):
            ax.text(it, yy, " ✓" if good else " ✗", va="center", fontsize=8)
    ax.set_yticks(np.arange(len(names)) + 0.4 - h / 2)
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("iterations (✓ converged, ✗ not)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
