"""First-fit latency of a new training-set size, from a cold process (issue 19, item 3).

Each measurement is a fresh Python process that imports gpvi and fits estimators with default
settings on scikit-learn's own data at two training-set sizes in a row, as the first two folds
of a cross-validation would (the second size differs by a few rows):

- ``GPRegressor`` on diabetes (full GP, Gaussian noise), train sizes 353 and 354;
- ``GPClassifier(model="sparse")`` on breast cancer (sparse GP, M = 50), train sizes 455 and 456.

Configurations: the code under test with the persistent compilation cache off, with a fresh
(empty) cache directory, and again with that now-filled directory (a second process, e.g. the
next run of a script); optionally the same fits with an older source tree (``--before-src``,
e.g. ``git archive <rev> src | tar -x -C /tmp/before``), which had no buckets and no cache.

    python benchmarks/first_fit.py [--before-src /tmp/before/src] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, print_table, pyplot, results_dir, warn_if_busy, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import gpvi
from sklearn.datasets import load_breast_cancer, load_diabetes
t_import = time.perf_counter() - t0
quick = sys.argv[1] == "1"
rng = np.random.default_rng(0)
out = {"import_s": t_import}
X, y = load_diabetes(return_X_y=True)
idx = rng.permutation(len(y))
for n in ([120, 124] if quick else [353, 354]):
    t = time.perf_counter()
    gpvi.GPRegressor().fit(X[idx[:n]], y[idx[:n]])
    out.setdefault("regression_full", []).append(time.perf_counter() - t)
X, y = load_breast_cancer(return_X_y=True)
idx = rng.permutation(len(y))
for n in ([146, 150] if quick else [455, 456]):
    t = time.perf_counter()
    gpvi.GPClassifier(model="sparse", inducing=50).fit(X[idx[:n]], y[idx[:n]])
    out.setdefault("classification_sparse", []).append(time.perf_counter() - t)
print(json.dumps(out))
"""


def child(src, cache, quick):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "GPVI_COMPILATION_CACHE")}
    env["PYTHONPATH"] = str(src)
    env["JAX_PLATFORMS"] = "cpu"
    env["GPVI_COMPILATION_CACHE"] = cache
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if quick else "0"], env=env, capture_output=True,
                         text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", help="source tree (the directory holding gpvi/) of the code to compare with")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--outdir", default=None)
    args = p.parse_args(argv)
    warn_if_busy()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before_src:
            runs["before (no cache)"] = child(Path(args.before_src), "0", args.quick)
        runs["after, cache off"] = child(ROOT / "src", "0", args.quick)
        runs["after, empty cache"] = child(ROOT / "src", tmp, args.quick)
        runs["after, filled cache (new process)"] = child(ROOT / "src", tmp, args.quick)
    rows = []
    for name, r in runs.items():
        rows.append([name, f"{r['import_s']:.2f}"]
                    + [f"{s:.2f}" for task in ("regression_full", "classification_sparse") for s in r[task]])
    headers = ["configuration", "import s", "regr. 1st size s", "regr. 2nd size s", "clf. 1st size s",
               "clf. 2nd size s"]
    print_table(headers, rows, title="Wall seconds per fit, each configuration a fresh process (default estimators)")
    suffix = "_quick" if args.quick else ""
    out = results_dir(args.outdir)
    write_json(out / f"first_fit{suffix}.json", {"runs": runs, "quick": args.quick, "environment": environment()})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = ["regr. 1st", "regr. 2nd", "clf. 1st", "clf. 2nd"]
    for k, (name, r) in enumerate(runs.items()):
        vals = r["regression_full"] + r["classification_sparse"]
        ax.bar([i + 0.2 * k for i in range(4)], vals, width=0.2, label=name)
    ax.set_xticks([i + 0.3 for i in range(4)], labels)
    ax.set_ylabel("seconds (incl. compilation)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"first_fit{suffix}.png", dpi=120)
    return runs


if __name__ == "__main__":
    main()
