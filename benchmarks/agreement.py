"""Cross-engine agreement and closed-form checks (issue #2 items 1–2, issue #4 item 1).

Prints, for every problem, the VLB each engine reaches, the largest relative gap to the best
engine, iterations and seconds, and for Gaussian likelihoods the closed-form reference
(Titsias' collapsed bound for the sparse GP, the exact log marginal likelihood for the full
GP).  Problems: sparse GP (N = 2000, M = 50, k-means) with logistic, probit, Poisson, ordinal,
Laplace and Student-t likelihoods; full GP (N = 500) and GLM with logistic and Poisson.  Every
problem runs twice: at tight tolerances, and at ``fit``'s default settings, where each engine
stops on its certified rule (issue 14 §1) — the default-settings table adds a sparse Poisson GP
(N = 3000, M = 60) and a Student-t GP with outliers, and the run checks that no engine reports
``converged=True`` with an estimated gap above its threshold (the Laplace engine, which does not
maximise the VLB, reports no gap).

Engines: fpi, fpb and gradient everywhere; ``dual`` where the likelihood has a Fenchel
conjugate (Gaussian, Poisson, Bernoulli) — elsewhere it refuses with a ValueError, shown as
"n/a"; ``laplace`` only for Gaussian likelihoods, where its Gaussian is the exact optimum (for
other likelihoods it is not a VLB maximiser, so it is not compared).  An engine that ends with
``converged=False`` is listed as "failed" with its message and left out of the gap (the dual
engine on logistic/probit models, where strong duality does not hold).
Writes ``results/agreement.json`` and ``results/agreement.png``.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import gpvi  # noqa: E402
from gpvi import likelihoods as L  # noqa: E402
from problems import jittered as _jittered, problem as _problem, regression_data as _regression_data, titsias_bound as _titsias_bound  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINES = ("fpi", "fpb", "gradient", "dual", "laplace")


def run(model, X, y, default=False):
    """Every engine on one problem: tight tolerances, or (``default``) fit's default settings,
    where each engine stops on its certified rule (estimated gap ≤ 0.1·tol·max(1, |VLB|))."""
    model = model.initialise(X)
    gaussian = isinstance(model.likelihood, L.Gaussian)
    out = {}
    for e in ENGINES:
        if e == "laplace" and not gaussian:
            out[e] = dict(status="n/a", message="not a VLB maximiser for non-Gaussian likelihoods")
            continue
        try:
            gpvi.fit(model, X, y, engine=e, max_iter=2)  # compile
        except ValueError as err:
            out[e] = dict(status="n/a", message=str(err))
            continue
        t = time.perf_counter()
        # The dual's logistic/probit conjugate is numerical (≈ 0.1–0.3 s per evaluation here) and
        # its duality gap never closes there, so it gets fewer iterations than the others.
        slow_dual = e == "dual" and isinstance(model.likelihood, L.Bernoulli)
        kw = {} if default else dict(tol=1e-10 if e == "dual" else 1e-11)
        r = gpvi.fit(model, X, y, engine=e, max_iter=300 if slow_dual else 500 if default else 5000, **kw)
        out[e] = dict(vlb=r.vlb, iterations=r.iterations, seconds=time.perf_counter() - t,
                      converged=r.converged, backtracks=r.backtracks, message=r.message, gap_estimate=r.gap,
                      threshold=0.1 * (1e-6 if default else kw["tol"]) * max(1.0, abs(r.vlb)),
                      status="ok" if r.converged else "failed", extras=r.extras)
    ok = [v for v in out.values() if v["status"] == "ok"]
    best = max(v["vlb"] for v in ok)
    gap = max(abs(v["vlb"] - best) / abs(best) for v in ok)
    return out, gap


def problems(rng):
    """``(name, likelihood, model, X, y, closed form or None)`` of every agreement problem."""
    rows = []
    # 1. closed forms
    X, f = _regression_data(rng, 2000)
    y = f + 0.3 * rng.standard_normal(2000)
    Z = X[rng.choice(2000, 50, replace=False)]
    k = gpvi.kernels.RBF(variance=1.3, lengthscale=0.9)
    ref = _titsias_bound(k, X, y, Z, 0.09, 0.2)
    rows.append(("sparse N=2000 M=50", "gaussian",
                 gpvi.SparseGP(kernel=k, likelihood=L.Gaussian(variance=0.09), inducing=Z, mean=0.2), X, y, ref))
    X5, f5 = _regression_data(rng, 500)
    y5 = f5 + 0.2 * rng.standard_normal(500)
    Kj = _jittered(np.asarray(k(X5, X5))) + 0.04 * np.eye(500)
    _, logdet = np.linalg.slogdet(Kj)
    ref = -0.5 * (500 * np.log(2 * np.pi) + logdet + y5 @ np.linalg.solve(Kj, y5))
    rows.append(("full GP N=500", "gaussian", gpvi.GP(kernel=k, likelihood=L.Gaussian(variance=0.04)), X5, y5, ref))
    # 2. cross-engine
    for kind in ["logit", "probit", "poisson", "ordinal", "laplace", "studentt"]:
        lik, X, y = _problem(kind, rng, 2000)
        rows.append(("sparse N=2000 M=50", kind,
                     gpvi.SparseGP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=lik, inducing=50), X, y, None))
    for kind in ["logit", "poisson"]:
        lik, X, y = _problem(kind, rng, 500)
        rows.append(("full GP N=500", kind, gpvi.GP(kernel=gpvi.kernels.RBF(lengthscale=1.0), likelihood=lik), X, y,
                     None))
        H = np.column_stack([np.ones(500), X, X**2])
        rows.append(("GLM N=500 d=5", kind, gpvi.GLM(likelihood=lik, prior_variance=1.0), H, y, None))
    return rows


def extra_problems(rng):
    """The two cases where engines stopped apart at default settings before the certified rule
    (issue 14 §1): the gradient engine 0.036 nats short on sparse Poisson, 0.005 on Student-t."""
    X = rng.uniform(-3, 3, (3000, 2))
    y = rng.poisson(np.exp(np.sin(X[:, 0]) + 0.5 * X[:, 1]))
    rows = [("sparse N=3000 M=60", "poisson",
             gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), L.Poisson(), inducing=60), X, y, None)]
    X = rng.uniform(-3, 3, (500, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(500)
    y[::25] += 8 * rng.standard_normal(20)  # outliers
    rows.append(("sparse N=500 M=30", "studentt+out",
                 gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=1.0), L.StudentT(df=3.0, scale=0.1), inducing=30), X, y,
                 None))
    return rows


def _cell(v):
    if v["status"] == "ok":
        return f"{v['vlb']:17.6f}"
    if v["status"] == "failed":
        return f"{'failed ' + format(v['vlb'], '.2f'):>17}"
    return f"{'n/a':>17}"


def main():
    rng = np.random.default_rng(2)
    probs = problems(rng) + extra_problems(np.random.default_rng(0))
    rows, rows_default = [], []
    for name, kind, model, X, y, ref in probs:
        if kind not in ("poisson", "studentt+out") or "3000" not in name and "M=30" not in name:
            res, gap = run(model, X, y)
            rows.append((name, kind, res, gap, ref))
        res, gap = run(model, X, y, default=True)
        rows_default.append((name, kind, res, gap, ref))
    table(rows, "tight tolerances (tol = 1e-11, dual 1e-10)")
    table(rows_default, "default settings (tol = 1e-6: each engine stops at estimated gap ≤ 1e-7·|VLB|)")
    worst = max(r[3] for r in rows)
    worst_default = max(r[3] for r in rows_default)
    uncertified = [(r[0], r[1], e) for r in rows + rows_default for e, v in r[2].items()
                   if v.get("converged") and not np.isnan(v["gap_estimate"]) and not v["gap_estimate"] <= v["threshold"]]
    print(f"\nworst cross-engine relative gap, tight: {worst:.1e} (target 1e-6): {'PASS' if worst <= 1e-6 else 'FAIL'}")
    print(f"worst cross-engine relative gap, default settings: {worst_default:.1e} (target 1e-6): "
          f"{'PASS' if worst_default <= 1e-6 else 'FAIL'}")
    print(f"converged=True with an estimated gap above the threshold: {len(uncertified)} "
          f"{uncertified if uncertified else ''}: {'PASS' if not uncertified else 'FAIL'}")
    for name, kind, res, _, _ in rows + rows_default:
        for e in ENGINES:
            if res[e]["status"] == "failed":
                gap_nats = res[e]["extras"].get("duality_gap")
                print(f"reported failure: {e} on {name} {kind}: {res[e]['message']}"
                      + (f" (duality gap {gap_nats:.3g} nats)" if gap_nats is not None else ""))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    js = [dict(model=n, likelihood=k, engines=r, max_relative_gap=g, closed_form=ref) for n, k, r, g, ref in rows]
    js_default = [dict(model=n, likelihood=k, engines=r, max_relative_gap=g) for n, k, r, g, _ in rows_default]
    with open(os.path.join(HERE, "results", "agreement.json"), "w") as fh:
        json.dump(dict(rows=js, worst_gap=worst, default_rows=js_default, worst_gap_default=worst_default,
                       uncertified_converged=uncertified), fh, indent=1, default=float)
    plot(rows)


def table(rows, title):
    print(f"\n== {title}")
    head = (f"{'model':<20}{'likelihood':<11}" + "".join(f"{e + ' VLB':>17}" for e in ENGINES)
            + f"{'max rel gap':>13}{'closed form':>17}{'rel err':>10}  iterations (fpi/fpb/grad/dual/lap)  seconds")
    print(head)
    for name, kind, res, gap, ref in rows:
        ok = [e for e in ENGINES if res[e]["status"] == "ok"]
        rel = "" if ref is None else f"{max(abs(res[e]['vlb'] - ref) / abs(ref) for e in ok):10.1e}"
        print(f"{name:<20}{kind:<11}" + "".join(_cell(res[e]) for e in ENGINES)
              + f"{gap:13.1e}" + (f"{ref:17.6f}" if ref is not None else " " * 17) + rel
              + "  " + "/".join(str(res[e].get("iterations", "-")) for e in ENGINES).ljust(26)
              + "/".join(f"{res[e]['seconds']:.2f}" if "seconds" in res[e] else "-" for e in ENGINES))


def plot(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r[0]}\n{r[1]}" for r in rows]
    best = [max(v["vlb"] for v in r[2].values() if v["status"] == "ok") for r in rows]
    for i, e in enumerate(ENGINES):
        idx = [j for j, r in enumerate(rows) if r[2][e]["status"] != "n/a"]
        gaps = [max(abs(rows[j][2][e]["vlb"] - best[j]) / abs(best[j]), 1e-17) for j in idx]
        failed = [rows[j][2][e]["status"] == "failed" for j in idx]
        ax.scatter(np.array(idx) + 0.12 * (i - 2), gaps, label=e, marker="o",
                   facecolors=["none" if f else f"C{i}" for f in failed], edgecolors=f"C{i}")
    ax.axhline(1e-6, color="k", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), labels, rotation=60, fontsize=7)
    ax.set_ylabel("relative gap to best VLB\n(hollow: engine reported failure)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "results", "agreement.png"), dpi=120)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    main()
