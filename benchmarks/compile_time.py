"""XLA compilation time of gpvi's fits from an empty compilation cache, against a baseline revision.

Each task runs in a fresh process with an empty gpvi compilation cache and the user's XLA flags
(none; ``XLA_FLAGS`` is removed from the children's environment): the seconds JAX reports for
each XLA compilation (``jax_log_compiles``) are summed, with the number of programs and the
fit's wall time (compilation included).  With ``--baseline REV`` the same tasks run with REV's
``src`` tree, alternating with the current tree in every repeat (which goes first alternates
too), so that a slow spell of a shared machine falls on both.

Tasks (the programs of a learned fit are compiled in its first rounds; the later rounds only run
them, so the searches are cut short here):

- ``iris``: ``GPClassifier()`` fitted on iris and its probabilities (scikit-learn's data);
- ``diabetes``: ``GPRegressor()`` on diabetes and its predictions;
- ``usps``, ``usps-per-class``: the learned USPS 4-7-9 fits of ``peers.py`` (three softmax latents
  sharing one kernel; per-class kernels with ``reference=2``), ``max_rounds=3``;
- ``kin40k``: the collapsed sparse-GP fit of ``peers.py`` (θ, noise and Z), ``max_rounds=3``;
- ``kin40k-sfp``: sfp on kin40k with everything learned, 5 minibatches of 2 048 rows.

The USPS and kin40k tasks need ``../shared/data`` (see ``benchmarks/_common.py``).

    python benchmarks/compile_time.py [--tasks iris,diabetes,usps,...] [--baseline REV] [--repeats 2]
    python benchmarks/compile_time.py --quick     # iris and diabetes, one repeat, current tree only

Writes ``results/compile_time[_quick].{json,md,png}``.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

TASKS = ("iris", "diabetes", "usps", "usps-per-class", "kin40k", "kin40k-sfp")


def _count_compilations():
    """A list that every XLA compilation of this process appends its seconds to."""
    import logging
    import re

    import jax

    seconds = []

    class Handler(logging.Handler):
        def emit(self, record):
            m = re.search(r"Finished XLA compilation of .*? in ([\d.e+-]+) sec", record.getMessage())
            if m:
                seconds.append(float(m.group(1)))

    jax.config.update("jax_log_compiles", True)
    for name in ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax._src.compiler", "jax._src.pjit"):
        log = logging.getLogger(name)
        log.addHandler(Handler())
        log.setLevel(logging.DEBUG)
        log.propagate = False  # (the log lines would otherwise go to stderr)
    return seconds


def child(task):
    seconds = _count_compilations()
    import numpy as np

    import gpvi
    from gpvi import kernels, likelihoods as L

    t = time.perf_counter()
    if task in ("iris", "diabetes"):
        from sklearn import datasets

        X, y = getattr(datasets, f"load_{task}")(return_X_y=True)
        if task == "iris":
            gpvi.GPClassifier().fit(X, y).predict_proba(X)
        else:
            gpvi.GPRegressor().fit(X, y).predict(X)
    elif task.startswith("usps"):
        from gpvi.models import MultiLatent
        from nguyen2014 import load

        tr = load("usps479", 1, "train")
        X, y = tr[:, 3:], tr[:, :3].argmax(1).astype(float)
        k = kernels.RBF(variance=1.0, lengthscale=float(np.sqrt(X.shape[1])))
        if task == "usps":
            model = MultiLatent.full([k] * 3, L.Softmax(num_classes=3))
            learn = ["latents.*.kernel.variance", "latents.*.kernel.lengthscale"]
        else:
            model, learn = MultiLatent.full([k] * 2, L.Softmax(num_classes=3, reference=2)), True
        gpvi.fit(model, X, y, learn_hyperparameters=learn, max_rounds=3)
    elif task.startswith("kin40k"):
        from cheng2016 import load

        X, y, _, _ = load()
        model = gpvi.SparseGP(kernels.RBF(variance=1.0, lengthscale=np.ones(X.shape[1])), L.Gaussian(variance=0.1),
                              inducing=512)
        if task == "kin40k":
            gpvi.fit(model, X, y, learn_hyperparameters=True, learn_inducing=True, max_rounds=3)
        else:
            gpvi.fit(model, X, y, engine="sfp", learn_hyperparameters=True, learn_inducing=True,
                     engine_options=dict(batch_size=2048, max_steps=5, epochs=1, eval_every=5))
    else:
        raise ValueError(f"unknown task {task!r}")
    return {"compile_s": sum(seconds), "programs": len(seconds), "fit_s": time.perf_counter() - t}


def run_child(task, src, timeout):
    cache = tempfile.mkdtemp(prefix="gpvi-compile-time-")
    env = dict(os.environ, GPVI_COMPILATION_CACHE=cache, PYTHONPATH=str(src), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    try:
        p = subprocess.run([sys.executable, __file__, "--child", task], capture_output=True, text=True, env=env,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if p.returncode != 0:
        return {"error": ((p.stderr or p.stdout).strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--baseline", default=None, help="a git revision whose src/ runs the same tasks, alternating")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--quick", action="store_true", help="iris and diabetes, one repeat")
    ap.add_argument("--outdir", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child)))
        return 0
    from _common import environment, print_table, pyplot, results_dir, source_tree, write_json

    tasks = ["iris", "diabetes"] if a.quick else a.tasks.split(",")
    repeats = 1 if a.quick else a.repeats
    versions = {"current": ROOT / "src"}
    work = Path(tempfile.mkdtemp(prefix="gpvi-compile-time-src-"))
    try:
        if a.baseline:
            versions = {"baseline": source_tree(a.baseline, work), **versions}
        runs = []
        for r in range(repeats):
            order = list(versions) if r % 2 == 0 else list(versions)[::-1]
            for task in tasks:
                for v in order:
                    res = dict(run_child(task, versions[v], a.timeout), task=task, version=v, repeat=r)
                    runs.append(res)
                    print(json.dumps(res), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows, summary = [], {}
    for task in tasks:
        for v in versions:
            ok = [x for x in runs if x["task"] == task and x["version"] == v and "error" not in x]
            if not ok:
                rows.append([task, v, "-", "-", "-", "failed"])
                continue
            c = sorted(x["compile_s"] for x in ok)
            f = sorted(x["fit_s"] for x in ok)
            summary.setdefault(task, {})[v] = {"compile_s": c, "fit_s": f, "programs": ok[0]["programs"]}
            rows.append([task, v, ok[0]["programs"], " / ".join(f"{x:.2f}" for x in c),
                         " / ".join(f"{x:.1f}" for x in f), ""])
    head = ["task", "version", "programs", "XLA compilation s (each run)", "fit s (each run)", "note"]
    title = f"Compilation from an empty cache, user XLA flags ({a.baseline or 'current only'}; {repeats} repeat(s))"
    print_table(head, rows, title=title)
    out = results_dir(a.outdir)
    stem = "compile_time_quick" if a.quick else "compile_time"
    write_json(out / f"{stem}.json", {"environment": environment(), "runs": runs, "summary": summary,
                                      "args": {k: v for k, v in vars(a).items() if k != "child"}})
    md = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(versions)
    for i, v in enumerate(versions):
        runs_s = [summary.get(t, {}).get(v, {}).get("compile_s") or [0.0] for t in tasks]  # (a failed task: 0)
        means = [sum(c) / len(c) for c in runs_s]
        ax.bar([j + i * width for j in range(len(tasks))], means, width, label=v)
    ax.set_xticks([j + width * (len(versions) - 1) / 2 for j in range(len(tasks))], tasks, rotation=20)
    ax.set_ylabel("XLA compilation, s (mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)
    print(f"wrote {out / stem}.json, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
