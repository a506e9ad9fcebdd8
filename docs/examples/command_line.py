# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # The command line, end to end
#
# Installing gpvi puts a `gpvi` command on the path. Its subcommands:
#
# - `gpvi fit DATA --target COL` — fit a model to a CSV or Parquet file and write a model file;
# - `gpvi predict MODEL DATA` — predict at the rows of another file, write CSV;
# - `gpvi demo` — fit the bundled coal-mining data with two engines and draw a figure;
# - `gpvi cache info|clear` — the on-disk cache of compiled programs.
#
# `gpvi COMMAND -h` lists every option. This page runs the commands with `subprocess` (in a
# terminal you would type the same lines) on a small CSV file written to a temporary folder.
#
# *Run time: 20–45 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time. It starts eight `gpvi`
# processes, each importing Python, JAX and gpvi.*

# %%
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import gpvi

t_start = time.perf_counter()
pd.set_option("display.width", 140)
pd.set_option("display.max_columns", 12)

# the gpvi command of this Python environment (installed next to its python), else the one on PATH
GPVI = Path(sys.executable).parent / "gpvi"
GPVI = str(GPVI) if GPVI.exists() else shutil.which("gpvi")
tmp = Path(tempfile.mkdtemp())


def cli(*args, expect=0):
    """Run the command `gpvi ARGS...` in the temporary folder; print its stdout, stderr and exit
    code (and stop this page if the exit code is not the expected one)."""
    print("$ gpvi", " ".join(args))
    proc = subprocess.run([GPVI, *args], cwd=tmp, capture_output=True, text=True)
    if proc.stdout:
        print(proc.stdout.rstrip())
    if proc.stderr:
        print("[stderr]", proc.stderr.rstrip().replace("\n", "\n[stderr] "))
    print("[exit code]", proc.returncode)
    assert proc.returncode == expect, f"expected exit code {expect}"
    return proc


cli("--version")

# %% [markdown]
# ## The data
#
# A made-up clinical table: an `id`, two measurements and an outcome with text labels. The
# first 300 rows are for training, the other 100 for testing.

# %%
rng = np.random.default_rng(0)
n = 400
age = rng.uniform(20, 80, n).round(1)
dose = rng.uniform(0, 10, n).round(2)
logit = 0.08 * (age - 50) + np.sin(dose) * 1.5
outcome = np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-logit)), "relapse", "healthy")
df = pd.DataFrame({"id": [f"P{i:03d}" for i in range(n)], "age": age, "dose": dose, "outcome": outcome})
df.iloc[:300].to_csv(tmp / "train.csv", index=False)
df.iloc[300:].to_csv(tmp / "test.csv", index=False)
print((tmp / "train.csv").read_text().splitlines()[:4])

# %% [markdown]
# ## `gpvi fit`
#
# `--target` names the column to predict; `--drop id` keeps the identifier out of the features.
# Without `--likelihood` the likelihood is chosen from the target (two text labels: `bernoulli`)
# and a line says so. The model is the one `gpvi.GPClassifier` would fit (a full GP up to 500
# rows, an RBF kernel, standardised features, hyperparameters learned). The summary goes to
# stdout; the model file to `--out`.

# %%
cli("fit", "train.csv", "--target", "outcome", "--drop", "id", "--out", "clinic.gpvi")
print("model file:", os.path.getsize(tmp / "clinic.gpvi"), "bytes")

# %% [markdown]
# ## `gpvi predict`
#
# The test file still has the `outcome` column, so the error rate and the negative log
# predictive density (NLPD) are printed to stderr. `--keep id` copies the identifier into the
# output.

# %%
cli("predict", "clinic.gpvi", "test.csv", "--keep", "id", "--out", "predictions.csv")
pred = pd.read_csv(tmp / "predictions.csv")
print(pred.head())
print("columns:", list(pred.columns))

# %% [markdown]
# The CLI's model file is a gpvi model file like any other; the predictions can be checked
# against the test labels:

# %%
print("accuracy from the CSV:", np.mean(pred["label"].to_numpy() == df.iloc[300:]["outcome"].to_numpy()))

# %% [markdown]
# ## The same model in Python
#
# The model file is an ordinary gpvi model file: `gpvi.io.load` returns the `FitResult`, and the
# CLI's preprocessing (feature columns, their means and scales, the class labels) is stored
# beside it. And since `gpvi fit` uses the estimators' defaults, `gpvi.GPClassifier()` on the
# same columns reaches the same bound:

# %%
fit, extra = gpvi.io.load(tmp / "clinic.gpvi", with_extra=True)
print(repr(fit))
print({k: extra[k] for k in ("likelihood", "model", "features", "labels", "x_mean", "x_scale")})

train = df.iloc[:300]
clf = gpvi.GPClassifier().fit(train[["age", "dose"]], train["outcome"])
print("GPClassifier VLB:", clf.vlb_, " gpvi fit VLB:", fit.vlb, " classes:", clf.classes_)

# %% [markdown]
# ## Other choices
#
# `--likelihood`, `--engine`, `--kernel` and `--model` choose what `gpvi fit` would otherwise
# pick. For example a probit link, the gradient engine and a Matérn-5/2 kernel, without the
# progress display and summary (`--quiet`):

# %%
cli("fit", "train.csv", "-t", "outcome", "--drop", "id", "--likelihood", "probit", "--engine", "gradient",
     "--kernel", "matern52", "--quiet", "--out", "probit.gpvi")
cli("predict", "probit.gpvi", "test.csv", "--quiet", "--out", "probit.csv")
print(pd.read_csv(tmp / "probit.csv").head(3))

# %% [markdown]
# ## Errors
#
# Bad input ends with one line `gpvi: error: …` that names the problem, and exit code 2. A
# missing column:

# %%
cli("fit", "train.csv", "--target", "diagnosis", expect=2)

# %% [markdown]
# Predicting from a file that lacks one of the model's feature columns:

# %%
df.iloc[300:].drop(columns=["dose"]).to_csv(tmp / "no_dose.csv", index=False)
cli("predict", "clinic.gpvi", "no_dose.csv", expect=2)

# %% [markdown]
# ## The compilation cache
#
# Each `gpvi` run is a new process; compiled programs are kept on disk, so a second run of the
# same kind of fit loads them instead of compiling. `gpvi cache info` shows where and how much:

# %%
cli("cache", "info")

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
