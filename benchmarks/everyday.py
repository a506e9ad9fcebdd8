"""Everyday speed: the estimators with default settings beside scikit-learn's GP estimators.

Issue 19: what a new user waits for on small and medium data sets.  For every data set a fresh
Python process (so the first split pays all compilation, as a user's first fit does) fits, on
each of 3 random 80/20 splits,

- gpvi's ``GPClassifier()`` / ``GPRegressor()`` with default settings, and
- scikit-learn's ``GaussianProcessClassifier`` / ``GaussianProcessRegressor`` with the same
  kernel family: ``ConstantKernel · RBF`` with one lengthscale per feature (ARD), plus a
  ``WhiteKernel`` for regression, on standardised inputs (``normalize_y=True`` for
  regression), ``random_state=0``, no optimiser restarts,

and records the wall time of each fit (compilation included), the test error and NLPD
(classification) or RMSE and NLPD (regression, in the target's units).  The later splits of a
process stand for the later folds of a cross-validation.

Targets (issue 19): median wall ≤ scikit-learn's and ≤ 30 s for N ≤ 2000; accuracy and NLPD no
worse than scikit-learn's beyond split noise; later folds ≤ 20 % of the first; regression
within 1.5× scikit-learn's time.

    python benchmarks/everyday.py [--quick] [--sets breast_cancer,diabetes] [--splits 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, print_table, pyplot, results_dir, warn_if_busy, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# name: (task, loader description); loaders run in the child process (see _load)
SETS = {
    "breast_cancer": "classification",  # scikit-learn, 569 × 30
    "digits_3v5": "classification",  # scikit-learn digits 3 against 5, 365 × 64
    "german_numer": "classification",  # ../shared/data, 1000 × 24
    "banana_1000": "classification",  # ../shared/data (PMLB banana), 1000-row subsample × 2
    "diabetes": "regression",  # scikit-learn, 442 × 10
    "boston": "regression",  # ../shared/data (yaringal), 506 × 13
    "abalone_1000": "regression",  # ../shared/data (UCI abalone, rings as a real target), 1000-row subsample × 10
}
# scikit-learn's California housing would need a download, which this machine cannot make.
QUICK_SETS = ["breast_cancer", "diabetes"]


def _load(name, quick):
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer
        X, y = load_breast_cancer(return_X_y=True)
    elif name == "digits_3v5":
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        keep = (y == 3) | (y == 5)
        X, y = X[keep], (y[keep] == 3).astype(int)
    elif name == "diabetes":
        from sklearn.datasets import load_diabetes
        X, y = load_diabetes(return_X_y=True)
    else:
        import datasets as ds
        if name == "german_numer":
            X, y = ds.load_german_numer()
        elif name == "banana_1000":
            import pandas as pd
            df = pd.read_csv(ds.data_path("banana", "pmlb", "banana.tsv.gz"), sep="\t")
            X, y = df.iloc[:, :-1].to_numpy(float), (df.iloc[:, -1].to_numpy() > 0).astype(int)
            idx = rng.choice(len(y), 1000, replace=False)
            X, y = X[idx], y[idx]
        elif name == "boston":
            X, y = _boston(ds)
        elif name == "abalone_1000":
            X, y = ds.load_abalone_counts()
            idx = rng.choice(len(y), 1000, replace=False)
            X, y = X[idx], y[idx]
        else:
            raise KeyError(name)
    X, y = np.asarray(X, float), np.asarray(y)
    if quick:
        idx = rng.choice(len(y), min(len(y), 150), replace=False)
        X, y = X[idx], y[idx]
    return X, y


def _boston(ds):
    import numpy as np
    data = np.loadtxt(ds.data_path("boston_housing", "yaringal", "data.txt"))
    return data[:, :-1], data[:, -1]


def _lbfgs_capped(obj_func, initial_theta, bounds, maxiter=10):
    """scikit-learn's default optimiser (L-BFGS-B on the log marginal likelihood) stopped after
    ``maxiter`` iterations: the --quick runs' smoke version of the scikit-learn fits (on 30 ARD
    lengthscales a full GaussianProcessClassifier fit takes half a minute)."""
    from scipy.optimize import minimize

    r = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": maxiter})
    return r.x, r.fun


def _sklearn(task, D, quick=False):
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessClassifier, GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    k = ConstantKernel(1.0) * RBF(np.ones(D) if D > 1 else 1.0)
    opt = {"optimizer": _lbfgs_capped} if quick else {}
    if task == "classification":
        return make_pipeline(StandardScaler(), GaussianProcessClassifier(k, random_state=0, **opt))
    return make_pipeline(StandardScaler(), GaussianProcessRegressor(k + WhiteKernel(0.1), normalize_y=True,
                                                                    random_state=0, **opt))


def _metrics(task, model, X, y, gpvi_model):
    import numpy as np

    if task == "classification":
        p = np.clip(model.predict_proba(X)[:, 1], 1e-12, 1 - 1e-12)
        yb = y == model.classes_[1] if gpvi_model else y == model[-1].classes_[1]
        return {"error": float(np.mean((p > 0.5) != yb)),
                "nlpd": float(-np.mean(np.where(yb, np.log(p), np.log1p(-p))))}
    mean, sd = model.predict(X, return_std=True)
    return {"rmse": float(np.sqrt(np.mean((mean - y) ** 2))),
            "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + 0.5 * ((y - mean) / sd) ** 2))}


def child(name, splits, quick, sklearn_budget):
    """One data set in this (fresh) process; prints a JSON line per split (``SPLIT {...}``, so a
    set cut off by the timeout keeps its finished splits) and one for the set.  Once a
    scikit-learn fit has taken more than ``sklearn_budget`` seconds, the later splits fit gpvi
    only (the median is then over scikit-learn's finished fits)."""
    import time
    import warnings

    import numpy as np

    t0 = time.perf_counter()
    import gpvi
    t_import = time.perf_counter() - t0
    task = SETS[name]
    X, y = _load(name, quick)
    out = {"name": name, "task": task, "N": int(len(y)), "D": int(X.shape[1]), "import_s": t_import, "splits": []}
    for s in range(splits):
        idx = np.random.default_rng(100 + s).permutation(len(y))
        n = int(round(0.8 * len(y)))
        tr, te = idx[:n], idx[n:]
        row = {"n_train": int(n)}
        est = gpvi.GPClassifier() if task == "classification" else gpvi.GPRegressor()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t = time.perf_counter()
            est.fit(X[tr], y[tr])
            row["gpvi_s"] = time.perf_counter() - t
        row["gpvi"] = _metrics(task, est, X[te], y[te], True)
        row["gpvi_warnings"] = sorted({type(x.message).__name__ for x in w})
        row["gpvi_kind"] = est.model_kind_
        row["gpvi_damped"] = int(est.n_damped_steps_)
        if any(r.get("sklearn_s", 0.0) > sklearn_budget for r in out["splits"]):
            row["sklearn_s"], row["sklearn"] = None, None
        else:
            sk = _sklearn(task, X.shape[1], quick)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = time.perf_counter()
                sk.fit(X[tr], y[tr])
                row["sklearn_s"] = time.perf_counter() - t
            row["sklearn"] = _metrics(task, sk, X[te], y[te], False)
        out["splits"].append(row)
        print("SPLIT " + json.dumps(row), flush=True)
        sk_s = "skipped" if row["sklearn_s"] is None else f"{row['sklearn_s']:.1f}s"
        print(f"# {name} split {s}: gpvi {row['gpvi_s']:.1f}s sklearn {sk_s}", file=sys.stderr, flush=True)
    print(json.dumps(out))


def run_set(name, splits, quick, timeout, sklearn_budget):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    try:
        out = subprocess.run([sys.executable, __file__, "--child", name, "--splits", str(splits),
                              "--sklearn-budget", str(sklearn_budget)]
                             + (["--quick"] if quick else []), env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        done = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("SPLIT ")]
        res = {"name": name, "task": SETS[name], "error": f"timed out after {timeout} s with {len(done)} split(s) done"}
        if done:
            X, y = _load(name, quick)
            res.update(N=int(len(y)), D=int(X.shape[1]), splits=done, partial=True)
        return res
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"name": name, "task": SETS[name], "error": last}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(v):
    import statistics
    return statistics.median(v) if len(v) else float("nan")


def summarise(res):
    """One table row per data set (medians over splits) and the target checks."""
    if "splits" not in res:
        return None
    sp = res["splits"]
    g, k = [r["gpvi_s"] for r in sp], [r["sklearn_s"] for r in sp if r["sklearn_s"] is not None]
    ks = [r for r in sp if r["sklearn"] is not None]
    metric = "error" if res["task"] == "classification" else "rmse"
    row = {
        "name": res["name"], "task": res["task"], "N": res["N"], "D": res["D"], "kind": sp[0]["gpvi_kind"],
        "gpvi_median_s": _median(g), "sklearn_median_s": _median(k), "sklearn_fits": len(k), "first_s": g[0],
        "later_over_first": (max(g[1:]) / g[0]) if len(g) > 1 else float("nan"),
        "metric": metric,
        "gpvi_metric": _median([r["gpvi"][metric] for r in sp]),
        "sklearn_metric": _median([r["sklearn"][metric] for r in ks]),
        "gpvi_nlpd": _median([r["gpvi"]["nlpd"] for r in sp]),
        "sklearn_nlpd": _median([r["sklearn"]["nlpd"] for r in ks]),
        "damped": sum(r["gpvi_damped"] for r in sp),
        "warnings": sorted({x for r in sp for x in r["gpvi_warnings"]}),
    }
    short = []
    if row["N"] <= 2500:
        if row["gpvi_median_s"] > row["sklearn_median_s"]:
            short.append("slower than sklearn")
        if row["gpvi_median_s"] > 30:
            short.append("> 30 s")
    if len(g) > 1 and row["later_over_first"] > 0.2:
        short.append("later folds > 20 % of first")
    if res["task"] == "regression" and row["gpvi_median_s"] > 1.5 * row["sklearn_median_s"]:
        short.append("> 1.5x sklearn")
    if res.get("error"):
        short.append(res["error"])
    row["short_of_targets"] = short
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="two small sets (150 rows), 2 splits, scikit-learn's optimiser capped at 10 iterations: "
                        "a smoke run")
    p.add_argument("--sets", default=None, help="comma-separated subset of " + ",".join(SETS))
    p.add_argument("--splits", type=int, default=None)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per data set (one process)")
    p.add_argument("--sklearn-budget", type=float, default=300.0,
                   help="after a scikit-learn fit longer than this (s), later splits fit gpvi only")
    p.add_argument("--outdir", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    splits = args.splits or (2 if args.quick else 3)
    if args.child:
        return child(args.child, splits, args.quick, args.sklearn_budget)
    names = args.sets.split(",") if args.sets else (QUICK_SETS if args.quick else list(SETS))
    unknown = set(names) - set(SETS)
    if unknown:
        raise SystemExit(f"unknown sets {sorted(unknown)}; known: {sorted(SETS)}")
    warn_if_busy()
    results, rows = [], []
    for name in names:
        res = run_set(name, splits, args.quick, args.timeout, args.sklearn_budget)
        results.append(res)
        row = summarise(res)
        if row is None:
            print(f"{name}: {res['error']}", file=sys.stderr)
            continue
        print(f"{name}: gpvi median {row['gpvi_median_s']:.1f}s, scikit-learn {row['sklearn_median_s']:.1f}s "
              f"({row['sklearn_fits']} fits)", file=sys.stderr, flush=True)
        rows.append(row)
    table = [[r["name"], r["N"], r["D"], r["kind"], f"{r['gpvi_median_s']:.1f}",
              f"{r['sklearn_median_s']:.1f}" + ("" if r["sklearn_fits"] == splits else f" ({r['sklearn_fits']} fits)"),
              f"{r['first_s']:.1f}", f"{r['later_over_first']:.2f}",
              f"{r['gpvi_metric']:.3f} / {r['sklearn_metric']:.3f}", f"{r['gpvi_nlpd']:.3f} / {r['sklearn_nlpd']:.3f}",
              "; ".join(r["short_of_targets"]) or "meets"] for r in rows]
    print_table(["set", "N", "D", "gpvi model", "gpvi med s", "sklearn med s", "gpvi 1st s", "later/1st",
                 "error or RMSE gpvi / sk", "NLPD gpvi / sk", "targets"], table,
                title=f"Default estimators, {splits} splits each, one cold process per set")
    suffix = "_quick" if args.quick else ""
    out = results_dir(args.outdir)
    write_json(out / f"everyday{suffix}.json", {"results": results, "summary": rows, "splits": splits,
                                                 "quick": args.quick, "environment": environment()})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["gpvi_median_s"] for r in rows], width=0.4, label="gpvi (defaults)")
    ax.bar([x + 0.2 for x in xs], [r["sklearn_median_s"] for r in rows], width=0.4, label="scikit-learn")
    ax.set_xticks(list(xs), [r["name"] for r in rows], rotation=20, fontsize=7)
    ax.set_ylabel("median wall s per fit")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"everyday{suffix}.png", dpi=120)
    return rows


if __name__ == "__main__":
    main()
