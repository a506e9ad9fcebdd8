"""The estimators' default hyperprior against none, on the data sets people try first.

Issue 30 §2: with maximum likelihood-II (no prior), the default classifier's kernel variance ran
to ~1 900 and its lengthscales to 1e10 on scikit-learn's breast cancer set, with hundreds of
damped fixed-point steps.  For each data set and each of ``--splits`` random 70/30 splits, this
fits the default estimator (``GPClassifier()`` / ``GPRegressor()``) twice on the same split, with
``hyperprior="none"`` and with the default ``hyperprior="weak"`` (:func:`gpvi.priors.weak`), in
alternating order, and records the test error and NLPD (classification; log loss over the
classes) or RMSE (regression), the learned kernel variance and largest lengthscale, the damped
steps and the fit's wall time.  One process fits everything, so the first fit of each data set
pays the compilation: the two settings run the same compiled programs (the prior is evaluated
in NumPy), and the order alternates between splits to share that cost fairly.

    python benchmarks/hyperprior.py [--quick] [--sets breast_cancer,iris] [--splits 3]

Writes ``results/hyperprior[_quick].{json,png}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets JAX_PLATFORMS before JAX is imported)

import numpy as np  # noqa: E402

import gpvi  # noqa: E402

SETS = {
    "breast_cancer": "classification",  # scikit-learn, 569 × 30
    "iris": "classification",  # scikit-learn, 150 × 4, 3 classes
    "wine": "classification",  # scikit-learn, 178 × 13, 3 classes
    "digits_3v5": "classification",  # scikit-learn digits 3 against 5, 365 × 64
    "diabetes": "regression",  # scikit-learn, 442 × 10
}
QUICK_SETS = ["iris"]
SETTINGS = ("none", "weak")


def load(name):
    import sklearn.datasets as skd

    if name == "digits_3v5":
        X, y = skd.load_digits(return_X_y=True)
        keep = (y == 3) | (y == 5)
        return X[keep].astype(float), (y[keep] == 3).astype(int)
    X, y = getattr(skd, f"load_{name}")(return_X_y=True)
    return np.asarray(X, float), np.asarray(y)


def kernels_of(model):
    return [lat.kernel for lat in model.latents] if hasattr(model, "latents") else [model.kernel]


def one_fit(task, setting, Xtr, ytr, Xte, yte):
    est = (gpvi.GPClassifier if task == "classification" else gpvi.GPRegressor)(hyperprior=setting)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DampingWarning: counted below
        est.fit(Xtr, ytr)
    seconds = time.perf_counter() - t
    out = {"seconds": seconds, "damped": int(est.n_damped_steps_),
           "rounds": int(est.fit_result_.hyperparameter_rounds)}
    ks = kernels_of(est.fit_result_.model)
    out["variance"] = max(float(np.max(k.variance)) for k in ks)
    out["max_lengthscale"] = max(float(np.max(k.lengthscale)) for k in ks)
    if task == "classification":
        P = np.clip(est.predict_proba(Xte), 1e-12, 1.0)
        idx = np.searchsorted(est.classes_, yte)
        out["error"] = float(np.mean(est.classes_[np.argmax(P, 1)] != yte))
        out["nlpd"] = float(-np.mean(np.log(P[np.arange(len(yte)), idx])))
    else:
        mean, sd = est.predict(Xte, return_std=True)
        out["rmse"] = float(np.sqrt(np.mean((mean - yte) ** 2)))
        out["nlpd"] = float(np.mean(0.5 * np.log(2 * np.pi * sd ** 2) + 0.5 * ((yte - mean) / sd) ** 2))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="iris only, one split (a smoke run)")
    p.add_argument("--sets", default=None, help="comma-separated subset of " + ",".join(SETS))
    p.add_argument("--splits", type=int, default=None, help="random 70/30 splits per set (default 3; quick 1)")
    p.add_argument("--outdir", default=None)
    a = p.parse_args(argv)
    sets = a.sets.split(",") if a.sets else (QUICK_SETS if a.quick else list(SETS))
    for s in sets:
        if s not in SETS:
            p.error(f"unknown set {s!r}; known: {', '.join(SETS)}")
    splits = a.splits or (1 if a.quick else 3)
    C.warn_if_busy()
    from sklearn.model_selection import train_test_split

    results, rows = {}, []
    for name in sets:
        task = SETS[name]
        X, y = load(name)
        results[name] = {s: [] for s in SETTINGS}
        for k in range(splits):
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=k,
                                                  stratify=y if task == "classification" else None)
            order = SETTINGS if k % 2 == 0 else SETTINGS[::-1]
            for setting in order:
                r = one_fit(task, setting, Xtr, ytr, Xte, yte)
                results[name][setting].append(r)
                print(f"{name} split {k} {setting}: " + ", ".join(f"{key}={C.fmt(v)}" for key, v in r.items()),
                      flush=True)
        for setting in SETTINGS:
            rs = results[name][setting]
            rows.append([name, setting, C.fmt(C.median([r.get("error", r.get("rmse")) for r in rs])),
                         C.fmt(C.median([r["nlpd"] for r in rs])), C.fmt(C.median([r["variance"] for r in rs])),
                         C.fmt(C.median([r["max_lengthscale"] for r in rs])), sum(r["damped"] for r in rs),
                         C.fmt(C.median([r["seconds"] for r in rs]))])
    C.print_table(["set", "hyperprior", "error / RMSE", "NLPD", "variance", "max lengthscale", "damped (sum)",
                   "seconds"], rows, title=f"Default estimators, median over {splits} split(s)")
    stem = "hyperprior_quick" if a.quick else "hyperprior"
    outdir = C.results_dir(a.outdir)
    C.write_json(outdir / f"{stem}.json", {"benchmark": "hyperprior", "environment": C.environment(),
                                           "splits": splits, "results": results})
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    xs = np.arange(len(sets))
    for j, setting in enumerate(SETTINGS):
        nl = [C.median([r["nlpd"] for r in results[n][setting]]) for n in sets]
        va = [C.median([r["variance"] for r in results[n][setting]]) for n in sets]
        axes[0].bar(xs + 0.4 * j, nl, 0.4, label=f"hyperprior={setting}")
        axes[1].bar(xs + 0.4 * j, va, 0.4, label=f"hyperprior={setting}")
    for ax, title in zip(axes, ("test NLPD (median)", "learned kernel variance (median)")):
        ax.set_xticks(xs + 0.2, sets, rotation=20)
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(outdir / f"{stem}.png", dpi=120)
    print(f"wrote {outdir / (stem + '.json')}")


if __name__ == "__main__":
    main()
