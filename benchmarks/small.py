"""Small data at interactive speed: gpvi's default estimators on the data sets people try first.

Issue 32.  scikit-learn's built-in data sets, each split 70/30 with
``train_test_split(random_state=0, stratify=y)`` (no stratification for regression):

- iris (150 × 4, 3 classes), wine (178 × 13, 3 classes), breast_cancer (569 × 30, 2 classes),
  digits01 (digits 0 against 1, 360 × 64), digits10 (all ten digits, 1797 × 64, 10 classes),
  diabetes (442 × 10, regression).

For each set, ``gpvi.GPClassifier()`` / ``gpvi.GPRegressor()`` with default settings, measured
in fresh Python processes:

1. a *cold* process with an empty gpvi compilation cache (``GPVI_COMPILATION_CACHE`` set to a
   new temporary directory): ``import gpvi`` and the first fit (wall seconds), then a 3-fold CV
   (``cv3_cold_cache_s``; it also puts the fold sizes' programs in the cache);
2. a *warm* process reusing that now-filled directory: ``import gpvi`` (``import_s``), the first
   fit (``first_fit_warm_s``), a second fit of the same estimator on the same data
   (``second_fit_s``), the first ``predict_proba`` / ``predict(return_std=True)`` on the test
   rows (``predict_s``), and ``cross_val_score(estimator, X_train, y_train, cv=3)``
   (``cv3_s``, the fold sizes' programs already in the disk cache); the test error and NLPD (mean −log p of the true class, p clipped at 1e-12) or
   RMSE and Gaussian NLPD with the predicted standard deviation; the names of the warning
   classes raised during the fits (``warnings``: no ``DampingWarning`` is wanted); and the
   fit's ``iterations``, ``evaluations``, ``hyperparameter_rounds`` and ``backtracks``.

scikit-learn's ``GaussianProcessClassifier`` / ``GaussianProcessRegressor`` run in their own fresh
process per set, on standardised inputs (a ``StandardScaler`` pipeline), ``random_state=0``:
``ConstantKernel() * RBF()`` isotropic (the baseline a user compares with) and with one lengthscale
per feature (ARD, ``RBF(np.ones(D))``); for regression ``+ WhiteKernel()`` and
``normalize_y=True``.  Columns: ``import sklearn.gaussian_process``, fit, second fit (same
process), predict, 3-fold CV (isotropic only) and the test metrics.  The ARD fit is skipped
when the isotropic fit took more than a tenth of ``--sklearn-budget`` (it is 10–40× slower), and
its second fit when the set's scikit-learn time would then pass the budget; the reason is
recorded.  Each process has a time limit (``--timeout``); a set that runs out keeps what
finished and records the time-out.

Targets (issue 32, N ≤ 1000, D ≤ 64, the 2-core machine), checked per row:

- second fit ≤ max(0.3 s, scikit-learn's isotropic fit);
- first fit in a fresh process ≤ 3 s with a warm disk cache and ≤ 10 s with an empty one,
  ``import gpvi`` included;
- ``import gpvi`` ≤ 1 s;
- 3-fold CV ≤ 3 s on iris and wine (warm disk cache).

Writes ``results/small.json`` (every number, the environment), ``results/small.md`` (the tables
for benchmarks/README.md) and ``results/small.png`` (wall seconds per set, gpvi against
scikit-learn, log scale); ``--quick`` writes ``small_quick.*``: iris and diabetes with at most 60
training rows and scikit-learn's optimiser capped at 10 iterations (a smoke run).

    python benchmarks/small.py [--quick] [--sets iris,wine] [--sklearn-budget 120] [--timeout 900]
                               [--outdir DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (environment, load_average, print_table, pyplot, results_dir,  # noqa: E402
                     warn_if_busy, write_json)

ROOT = Path(__file__).resolve().parents[1]

SETS = {
    "iris": "classification",  # 150 × 4, 3 classes
    "wine": "classification",  # 178 × 13, 3 classes
    "breast_cancer": "classification",  # 569 × 30, 2 classes
    "digits01": "classification",  # digits 0 against 1, 360 × 64
    "digits10": "classification",  # all ten digits, 1797 × 64
    "diabetes": "regression",  # 442 × 10
}
QUICK_SETS = ["iris", "diabetes"]
QUICK_TRAIN = 60  # --quick: at most this many training rows
CV3_TARGET_SETS = ("iris", "wine")


# ---- data and metrics (run in the child processes) -----------------------------------------
def _load(name, quick):
    """(X_train, X_test, y_train, y_test): 70 % training split, seed 0, stratified for
    classification; with ``quick`` the training rows subsampled to ``QUICK_TRAIN``."""
    import numpy as np
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if name == "iris":
        X, y = datasets.load_iris(return_X_y=True)
    elif name == "wine":
        X, y = datasets.load_wine(return_X_y=True)
    elif name == "breast_cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
    elif name in ("digits01", "digits10"):
        X, y = datasets.load_digits(return_X_y=True)
        if name == "digits01":
            keep = y <= 1
            X, y = X[keep], y[keep]
    elif name == "diabetes":
        X, y = datasets.load_diabetes(return_X_y=True)
    else:
        raise KeyError(name)
    X = np.asarray(X, float)
    clf = SETS[name] == "classification"
    Xtr, Xte, ytr, yte = train_test_split(X, y, train_size=0.7, random_state=0, stratify=y if clf else None)
    if quick and len(ytr) > QUICK_TRAIN:
        Xtr, _, ytr, _ = train_test_split(Xtr, ytr, train_size=QUICK_TRAIN, random_state=0,
                                          stratify=ytr if clf else None)
    return Xtr, Xte, ytr, yte


def _metrics(task, classes, pred, y):
    """Test metrics from the timed prediction ``pred``: class probabilities (columns in
    ``classes`` order) or (mean, std)."""
    import numpy as np

    if task == "classification":
        P = np.asarray(pred, float)
        col = np.searchsorted(classes, y)
        p_true = np.clip(P[np.arange(len(y)), col], 1e-12, 1.0)
        return {"error": float(np.mean(classes[np.argmax(P, axis=1)] != y)),
                "nlpd": float(-np.mean(np.log(p_true))),
                "proba_row_sum_max_dev": float(np.max(np.abs(P.sum(axis=1) - 1.0)))}
    mean, sd = (np.asarray(a, float) for a in pred)
    return {"rmse": float(np.sqrt(np.mean((mean - y) ** 2))),
            "nlpd": float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + 0.5 * ((y - mean) / sd) ** 2))}


def _emit(**part):
    """One finished measurement, printed at once so a process cut off by the time limit keeps it."""
    print("PART " + json.dumps(part), flush=True)


def _lbfgs_capped(obj_func, initial_theta, bounds, maxiter=10):
    """scikit-learn's default optimiser (L-BFGS-B on the log marginal likelihood) stopped after
    ``maxiter`` iterations: the --quick runs' smoke version of the scikit-learn fits."""
    from scipy.optimize import minimize

    r = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": maxiter})
    return r.x, r.fun


def _sklearn_model(task, D, ard, quick):
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessClassifier, GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    k = ConstantKernel() * (RBF(np.ones(D)) if ard else RBF())
    opt = {"optimizer": _lbfgs_capped} if quick else {}
    if task == "classification":
        return make_pipeline(StandardScaler(), GaussianProcessClassifier(k, random_state=0, **opt))
    return make_pipeline(StandardScaler(), GaussianProcessRegressor(k + WhiteKernel(), normalize_y=True,
                                                                    random_state=0, **opt))


def _predict(task, model, X):
    if task == "classification":
        return model.predict_proba(X)
    return model.predict(X, return_std=True)


def child_gpvi(name, phase, quick):
    """gpvi in this fresh process: ``phase`` "cold" (import, first fit, 3-fold CV) or "warm"
    (import, first fit, second fit, predict, metrics, 3-fold CV)."""
    import time

    t0 = time.perf_counter()
    import gpvi
    _emit(import_s=time.perf_counter() - t0)
    import warnings

    from sklearn.model_selection import cross_val_score

    task = SETS[name]
    Xtr, Xte, ytr, yte = _load(name, quick)
    _emit(n_train=int(len(ytr)), n_test=int(len(yte)), D=int(Xtr.shape[1]),
          classes=int(len(set(ytr.tolist()))) if task == "classification" else None)

    def make():
        return gpvi.GPClassifier() if task == "classification" else gpvi.GPRegressor()

    def timed_fit(est):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t = time.perf_counter()
            est.fit(Xtr, ytr)
            s = time.perf_counter() - t
        return s, sorted({type(x.message).__name__ for x in w})

    def timed_cv3():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t = time.perf_counter()
            scores = cross_val_score(make(), Xtr, ytr, cv=3)
            s = time.perf_counter() - t
        return s, float(scores.mean()), sorted({type(x.message).__name__ for x in w})

    est = make()
    s, w = timed_fit(est)
    if phase == "cold":
        _emit(first_fit_s=s, warnings=w)
        # fills the cache with the fold sizes' programs too, so that the warm process's CV is warm
        s, score, w = timed_cv3()
        _emit(cv3_s=s, cv3_score=score, cv3_warnings=w)
        return
    fr = est.fit_result_
    _emit(first_fit_s=s, warnings=w, model_kind=getattr(est, "model_kind_", None),
          iterations=int(fr.iterations), evaluations=int(fr.evaluations),
          hyperparameter_rounds=int(fr.hyperparameter_rounds), backtracks=int(fr.backtracks),
          damped_steps=int(getattr(est, "n_damped_steps_", 0)))
    s, w2 = timed_fit(est)
    _emit(second_fit_s=s, second_fit_warnings=w2)
    t = time.perf_counter()
    pred = _predict(task, est, Xte)
    _emit(predict_s=time.perf_counter() - t)
    _emit(metrics=_metrics(task, getattr(est, "classes_", None), pred, yte))
    s, score, w = timed_cv3()
    _emit(cv3_s=s, cv3_score=score, cv3_warnings=w)


def child_sklearn(name, quick, budget):
    """scikit-learn's GP estimators in this fresh process: isotropic (fit, second fit, predict,
    3-fold CV), then ARD (fit, predict, second fit) within ``budget`` seconds."""
    import time

    import importlib

    t0 = time.perf_counter()
    importlib.import_module("sklearn.gaussian_process")
    _emit(import_s=time.perf_counter() - t0)
    import warnings

    from sklearn.model_selection import cross_val_score

    task = SETS[name]
    Xtr, Xte, ytr, yte = _load(name, quick)
    D = Xtr.shape[1]
    spent = 0.0

    def fit_predict(ard):
        nonlocal spent
        model = _sklearn_model(task, D, ard, quick)
        t = time.perf_counter()
        model.fit(Xtr, ytr)
        part = {"fit_s": time.perf_counter() - t}
        spent += part["fit_s"]
        t = time.perf_counter()
        pred = _predict(task, model, Xte)
        part["predict_s"] = time.perf_counter() - t
        part["metrics"] = _metrics(task, getattr(model, "classes_", None), pred, yte)
        return model, part

    def refit(model, part):
        nonlocal spent
        t = time.perf_counter()
        model.fit(Xtr, ytr)
        part["second_fit_s"] = time.perf_counter() - t
        spent += part["second_fit_s"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning at the bounds of the kernel parameters
        model, iso = fit_predict(False)
        _emit(iso=iso)
        refit(model, iso)
        _emit(iso=iso)
        t = time.perf_counter()
        scores = cross_val_score(_sklearn_model(task, D, False, quick), Xtr, ytr, cv=3)
        iso["cv3_s"] = time.perf_counter() - t
        iso["cv3_score"] = float(scores.mean())
        spent += iso["cv3_s"]
        _emit(iso=iso)
        if iso["fit_s"] > budget / 10:
            _emit(ard={"skipped": f"skipped (isotropic took {iso['fit_s']:.1f} s)"})
            return
        model, ard = fit_predict(True)
        _emit(ard=ard)
        if spent + ard["fit_s"] > budget:
            ard["second_fit_skipped"] = f"skipped (would pass the {budget:g} s budget)"
        else:
            refit(model, ard)
        _emit(ard=ard)


# ---- parent ----------------------------------------------------------------------------------
def _child(args, env, timeout):
    """Run ``small.py --child ...`` in a fresh process; the merged PART records, with ``error``
    when it failed or ran out of time."""
    cmd = [sys.executable, __file__, "--child"] + args
    res = {}
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        text, err = out.stdout, None
        if out.returncode != 0:
            err = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"timed out after {timeout} s"
    for line in text.splitlines():
        if line.startswith("PART "):
            res.update(json.loads(line[5:]))
    if err:
        res["error"] = err
    return res


def _env(cache=None):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "GPVI_COMPILATION_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks"), env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    if cache is not None:
        env["GPVI_COMPILATION_CACHE"] = cache
    return env


def run_set(name, quick, timeout, budget, log):
    """The three fresh processes of one data set: gpvi cold, gpvi warm (same cache dir), sklearn."""
    q = ["--quick"] if quick else []
    res = {"name": name, "task": SETS[name], "load_average_before": load_average()}
    cache = tempfile.mkdtemp(prefix="gpvi-small-cache-")
    try:
        cold = _child(["gpvi", "--set", name, "--phase", "cold"] + q, _env(cache), timeout)
        log(f"{name}: gpvi cold {cold.get('import_s', math.nan):.2f} + {cold.get('first_fit_s', math.nan):.2f} s, "
            f"cv3 {cold.get('cv3_s', math.nan):.2f} s"
            + (f" ({cold['error']})" if "error" in cold else ""))
        warm = _child(["gpvi", "--set", name, "--phase", "warm"] + q, _env(cache), timeout)
        log(f"{name}: gpvi warm {warm.get('import_s', math.nan):.2f} + {warm.get('first_fit_s', math.nan):.2f} s, "
            f"second {warm.get('second_fit_s', math.nan):.2f} s, cv3 {warm.get('cv3_s', math.nan):.2f} s"
            + (f" ({warm['error']})" if "error" in warm else ""))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    sk = _child(["sklearn", "--set", name, "--sklearn-budget", str(budget)] + q, _env(), timeout)
    ard = sk.get("ard", {})
    log(f"{name}: sklearn iso fit {sk.get('iso', {}).get('fit_s', math.nan):.2f} s, "
        f"ARD {ard.get('skipped') or format(ard.get('fit_s', math.nan), '.2f') + ' s'}"
        + (f" ({sk['error']})" if "error" in sk else ""))
    nan = math.nan
    g = {
        "import_s": warm.get("import_s", nan),
        "import_cold_s": cold.get("import_s", nan),
        "first_fit_cold_s": cold.get("first_fit_s", nan),
        "first_fit_warm_s": warm.get("first_fit_s", nan),
        "second_fit_s": warm.get("second_fit_s", nan),
        "predict_s": warm.get("predict_s", nan),
        "cv3_s": warm.get("cv3_s", nan),
        "cv3_score": warm.get("cv3_score", nan),
        "metrics": warm.get("metrics", {}),
        "warnings": sorted(set(cold.get("warnings", [])) | set(warm.get("warnings", []))
                           | set(warm.get("second_fit_warnings", []))),
        "cv3_warnings": sorted(set(cold.get("cv3_warnings", [])) | set(warm.get("cv3_warnings", []))),
        "cv3_cold_cache_s": cold.get("cv3_s", nan),
    }
    for k in ("model_kind", "iterations", "evaluations", "hyperparameter_rounds", "backtracks", "damped_steps"):
        g[k] = warm.get(k)
    errors = {k: v["error"] for k, v in (("gpvi_cold", cold), ("gpvi_warm", warm), ("sklearn", sk)) if "error" in v}
    res.update(n_train=warm.get("n_train", cold.get("n_train")), n_test=warm.get("n_test", cold.get("n_test")),
               D=warm.get("D", cold.get("D")), classes=warm.get("classes", cold.get("classes")), gpvi=g,
               sklearn={"import_s": sk.get("import_s", nan), "iso": sk.get("iso", {}), "ard": sk.get("ard", {})},
               errors=errors)
    res["targets"] = targets(res)
    return res


def _num(x):
    return float(x) if x is not None else math.nan


def targets(res):
    """Issue 32's targets for one set: {name: {"ok": bool or None, "value", "limit", "text"}}
    (``ok`` None where the target does not apply or a number is missing)."""
    g, iso = res["gpvi"], res["sklearn"]["iso"]
    out = {}

    def check(key, value, limit, applies=True):
        value, limit = _num(value), _num(limit)
        if not applies:
            out[key] = {"ok": None, "value": value, "limit": limit, "text": "n/a"}
        elif not (math.isfinite(value) and math.isfinite(limit)):
            out[key] = {"ok": None, "value": value, "limit": limit, "text": "?"}
        else:
            ok = value <= limit
            out[key] = {"ok": ok, "value": value, "limit": limit,
                        "text": f"{'✓' if ok else '✗'} {value:.2f} {'≤' if ok else '>'} {limit:.2f}"}

    check("second_fit", g["second_fit_s"], max(0.3, _num(iso.get("fit_s"))))
    check("first_fit_warm", _num(g["import_s"]) + _num(g["first_fit_warm_s"]), 3.0)
    check("first_fit_cold", _num(g["import_cold_s"]) + _num(g["first_fit_cold_s"]), 10.0)
    imports = [v for v in (_num(g["import_s"]), _num(g["import_cold_s"])) if math.isfinite(v)]
    check("import", max(imports, default=math.nan), 1.0)
    check("cv3", g["cv3_s"], 3.0, applies=res["name"] in CV3_TARGET_SETS)
    return out


TARGET_HEADERS = {"import": "import ≤ 1 s", "first_fit_warm": "warm 1st fit ≤ 3 s", "first_fit_cold": "cold 1st fit ≤ 10 s",
                  "second_fit": "2nd fit ≤ max(0.3, sk iso)", "cv3": "cv3 ≤ 3 s (iris, wine)"}


def _s(x):
    x = _num(x)
    return f"{x:.2f}" if math.isfinite(x) else "-"


def _metric_text(task, m):
    if not m:
        return "-"
    if task == "classification":
        return f"{100 * m['error']:.1f} % / {m['nlpd']:.3f}"
    return f"{m['rmse']:.1f} / {m['nlpd']:.3f}"


def table_rows(results):
    """(measurement headers, rows), (target headers, rows)."""
    mh = ["set", "train N×D", "import s", "cold: import+fit s", "warm: import+fit s", "2nd fit s", "predict s",
          "cv3 s: cold / warm cache", "sk iso fit / 2nd s", "sk iso cv3 s", "sk ARD fit s", "gpvi err/NLPD (RMSE/NLPD)",
          "sk iso", "sk ARD", "warnings", "iters/evals/rounds/backtracks"]
    mrows, trows = [], []
    for r in results:
        g, sk = r["gpvi"], r["sklearn"]
        iso, ard = sk["iso"], sk["ard"]
        shape = f"{r['n_train']}×{r['D']}" if r.get("n_train") is not None else "-"
        if r.get("classes"):
            shape += f" ({r['classes']} cl.)"
        ard_fit = ard.get("skipped") or _s(ard.get("fit_s"))
        mrows.append([
            r["name"], shape, _s(g["import_s"]),
            f"{_s(g['import_cold_s'])} + {_s(g['first_fit_cold_s'])}",
            f"{_s(g['import_s'])} + {_s(g['first_fit_warm_s'])}",
            _s(g["second_fit_s"]), _s(g["predict_s"]), f"{_s(g['cv3_cold_cache_s'])} / {_s(g['cv3_s'])}",
            f"{_s(iso.get('fit_s'))} / {_s(iso.get('second_fit_s'))}", _s(iso.get("cv3_s")), ard_fit,
            _metric_text(r["task"], g["metrics"]), _metric_text(r["task"], iso.get("metrics")),
            _metric_text(r["task"], ard.get("metrics")),
            ", ".join(g["warnings"]) or "none",
            "/".join(str(g[k]) if g[k] is not None else "-"
                     for k in ("iterations", "evaluations", "hyperparameter_rounds", "backtracks")),
        ])
        short = "; ".join(f"{k}: {v}" for k, v in r["errors"].items())
        trows.append([r["name"]] + [r["targets"][k]["text"] for k in TARGET_HEADERS] + [short or "-"])
    th = ["set"] + list(TARGET_HEADERS.values()) + ["errors"]
    return (mh, mrows), (th, trows)


def markdown(results, quick, env):
    (mh, mrows), (th, trows) = table_rows(results)

    def md(headers, rows):
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        return "\n".join(lines)

    head = (f"Default estimators, each library in fresh processes ({'--quick smoke run, ' if quick else ''}"
            f"{env.get('time', '')}, {env.get('cpu_count')} cores, load average before "
            f"{results[0]['load_average_before'] if results else '-'}).  Seconds are wall time; "
            "'cold' = empty gpvi compilation cache, 'warm' = a second process reusing it; errors are test-split "
            "error / NLPD (RMSE / NLPD for regression).\n")
    return (head + "\n" + md(mh, mrows) + "\n\nTargets (issue 32):\n\n" + md(th, trows) + "\n")


def plot(results, path):
    plt = pyplot()
    series = [
        ("gpvi cold: import + 1st fit", lambda r: _num(r["gpvi"]["import_cold_s"]) + _num(r["gpvi"]["first_fit_cold_s"])),
        ("gpvi warm: import + 1st fit", lambda r: _num(r["gpvi"]["import_s"]) + _num(r["gpvi"]["first_fit_warm_s"])),
        ("gpvi 2nd fit", lambda r: _num(r["gpvi"]["second_fit_s"])),
        ("gpvi 3-fold CV", lambda r: _num(r["gpvi"]["cv3_s"])),
        ("sklearn iso fit", lambda r: _num(r["sklearn"]["iso"].get("fit_s"))),
        ("sklearn ARD fit", lambda r: _num(r["sklearn"]["ard"].get("fit_s"))),
        ("sklearn iso 3-fold CV", lambda r: _num(r["sklearn"]["iso"].get("cv3_s"))),
    ]
    fig, ax = plt.subplots(figsize=(10, 3.8))
    w = 0.8 / len(series)
    cmap = plt.get_cmap("tab10")
    for k, (label, f) in enumerate(series):
        xs, ys = [], []
        for i, r in enumerate(results):
            v = f(r)
            x = i - 0.4 + w * (k + 0.5)
            if math.isfinite(v) and v > 0:
                xs.append(x)
                ys.append(v)
            elif label == "sklearn ARD fit" and r["sklearn"]["ard"].get("skipped"):
                ax.text(x, 0.5, "skipped", transform=ax.get_xaxis_transform(), rotation=90, fontsize=6,
                        ha="center", va="center")
        ax.bar(xs, ys, width=w, label=label, color=cmap(k), hatch="//" if label.startswith("sklearn") else None)
    ax.set_xticks(range(len(results)), [r["name"] for r in results], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("wall seconds")
    for y, ls, text in ((3.0, ":", "3 s (warm target)"), (10.0, "--", "10 s (cold target)")):
        ax.axhline(y, color="grey", lw=0.8, ls=ls, label=text)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("gpvi defaults vs scikit-learn GP (fresh processes)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"iris and diabetes only, at most {QUICK_TRAIN} training rows, scikit-learn's optimiser "
                        "capped at 10 iterations: a smoke run")
    p.add_argument("--sets", default=None, help="comma-separated subset of " + ",".join(SETS))
    p.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    p.add_argument("--sklearn-budget", type=float, default=120.0,
                   help="seconds of scikit-learn fitting per set: ARD is skipped when the isotropic fit took more "
                        "than a tenth of this")
    p.add_argument("--outdir", default=None)
    p.add_argument("--child", choices=["gpvi", "sklearn"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--set", default=None, help=argparse.SUPPRESS)
    p.add_argument("--phase", choices=["cold", "warm"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "gpvi":
        return child_gpvi(args.set, args.phase, args.quick)
    if args.child == "sklearn":
        return child_sklearn(args.set, args.quick, args.sklearn_budget)
    names = args.sets.split(",") if args.sets else (QUICK_SETS if args.quick else list(SETS))
    unknown = set(names) - set(SETS)
    if unknown:
        raise SystemExit(f"unknown sets {sorted(unknown)}; known: {sorted(SETS)}")
    import time

    t0 = time.perf_counter()

    def log(msg):
        print(f"{time.perf_counter() - t0:7.1f}s {msg}", file=sys.stderr, flush=True)

    la = warn_if_busy()
    results = [run_set(name, args.quick, args.timeout, args.sklearn_budget, log) for name in names]
    (mh, mrows), (th, trows) = table_rows(results)
    print_table(mh, mrows, title="Default estimators on small data, fresh processes (seconds are wall time)")
    print_table(th, trows, title="Targets (issue 32)")
    env = environment()
    env["load_average_before"] = la
    env["load_average_after"] = load_average()
    suffix = "_quick" if args.quick else ""
    out = results_dir(args.outdir)
    write_json(out / f"small{suffix}.json", {"results": results, "quick": args.quick, "sets": names,
                                              "timeout_s": args.timeout, "sklearn_budget_s": args.sklearn_budget,
                                              "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                              "wall_s": time.perf_counter() - t0, "environment": env})
    (out / f"small{suffix}.md").write_text(markdown(results, args.quick, env))
    plot(results, out / f"small{suffix}.png")
    return results


if __name__ == "__main__":
    main()
