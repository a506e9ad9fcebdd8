# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Saving and loading
#
# `gpvi.io.save(obj, path)` writes a fitted object — a `FitResult` from `gpvi.fit` or a fitted
# scikit-learn estimator — to one file, and `gpvi.io.load(path)` reads it back. The file is a
# zip archive of `.npy` arrays plus a JSON description (format name, version, the classes of the
# kernel, likelihood and model with their settings). There is **no pickle**: loading never runs
# code named by the file, and every file is checked before it is used.
#
# *Run time: 5–35 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time.*

# %%
import json
import os
import tempfile
import time
import zipfile

import numpy as np
from sklearn.datasets import load_breast_cancer

import gpvi

t_start = time.perf_counter()
tmp = tempfile.mkdtemp()

# %% [markdown]
# ## A `FitResult`

# %%
rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, (500, 1))
y = rng.poisson(np.exp(np.sin(2 * X[:, 0])))
model = gpvi.SparseGP(gpvi.kernels.RBF(), gpvi.likelihoods.Poisson(), inducing=20)
fit = gpvi.fit(model, X, y, learn_hyperparameters=True)

path = os.path.join(tmp, "counts.gpvi")
gpvi.io.save(fit, path, extra={"note": "Poisson sparse GP", "columns": ["x"]})
print("file size:", os.path.getsize(path), "bytes")

loaded, extra = gpvi.io.load(path, with_extra=True)
print(repr(loaded))
print("extra:", extra)

Xs = np.linspace(-3, 3, 50)[:, None]
same = all(np.array_equal(a, b) for a, b in zip(fit.predict_y(Xs), loaded.predict_y(Xs)))
print("predict_y identical:", same)
assert same
print("VLB, converged, message and trace kept:", loaded.vlb == fit.vlb, loaded.converged == fit.converged,
      loaded.message == fit.message, np.array_equal(loaded.trace, fit.trace))
print("gap, jitter and search message kept:", loaded.gap == fit.gap, loaded.jitter == fit.jitter,
      loaded.search_message == fit.search_message)
assert loaded.gap == fit.gap and loaded.jitter == fit.jitter

# %% [markdown]
# The predictions, the bound, `converged` with its certificate (`gap`), the message, the jitter the
# factorisation used and the trace all come back exactly (a file written by an older gpvi, before
# `gap` and `jitter` were stored, loads with both as NaN).

# %% [markdown]
# ## A fitted estimator
#
# A scikit-learn estimator saves the same way, with its standardisation, classes and fitted
# attributes:

# %%
Xc, yc = load_breast_cancer(return_X_y=True)
Xc = Xc[:, :10]                    # the ten "mean" features, to keep the page quick
clf = gpvi.GPClassifier(model="sparse", inducing=30).fit(Xc[:400], yc[:400])
est_path = os.path.join(tmp, "cancer.gpvi")
gpvi.io.save(clf, est_path)
clf2 = gpvi.io.load(est_path)
print(type(clf2).__name__, "classes:", clf2.classes_)
p1, p2 = clf.predict_proba(Xc[400:]), clf2.predict_proba(Xc[400:])
print("predict_proba identical:", np.array_equal(p1, p2))
assert np.array_equal(p1, p2)
print("held-out accuracy of the loaded classifier:", clf2.score(Xc[400:], yc[400:]))

# %% [markdown]
# ## What the file checks do
#
# `gpvi.io.load` raises a `ValueError` that names the file whenever a file is not a gpvi model
# file, is truncated or damaged, or has been edited so that its contents no longer agree. A few
# cases:

# %%
def try_load(p):
    try:
        gpvi.io.load(p)
        print("loaded without error")
    except ValueError as err:
        print("ValueError:", err)


# 1. not a model file at all
wrong = os.path.join(tmp, "data.csv")
with open(wrong, "w") as f:
    f.write("x,y\n1,2\n")
try_load(wrong)

# 2. a truncated file (the last part cut off, as by an interrupted copy)
raw = open(path, "rb").read()
cut = os.path.join(tmp, "cut.gpvi")
with open(cut, "wb") as f:
    f.write(raw[: len(raw) // 2])
try_load(cut)

# %% [markdown]
# An edited file: rewrite the archive with a lengthscale of the wrong shape (two numbers for a
# one-column model), or with a NaN, keeping everything else.

# %%
def rewrite(src, dst, change):
    """Copy a model file, passing every array through change(name, array)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            name = info.filename[:-4]
            arr = np.load(zin.open(info))
            arr = change(name, arr)
            with zout.open(info.filename, "w") as f:
                np.lib.format.write_array(f, arr)


with zipfile.ZipFile(path) as z:
    meta = json.loads(np.load(z.open("meta.json.npy")).tobytes())
    names = [i.filename[:-4] for i in z.infolist()]
print("format:", meta["format"], "version:", meta["version"], "kind:", meta["kind"])
ls_name = next(n for n in names if n.endswith("lengthscale"))
print("arrays:", names[:6], "...; lengthscale array:", ls_name)

bad_shape = os.path.join(tmp, "bad_shape.gpvi")
rewrite(path, bad_shape, lambda n, a: np.array([1.0, 2.0]) if n == ls_name else a)
try_load(bad_shape)

bad_value = os.path.join(tmp, "bad_value.gpvi")
rewrite(path, bad_value, lambda n, a: np.array(np.nan) if n == ls_name else a)
try_load(bad_value)

# %% [markdown]
# And a file from a newer gpvi (a format version this gpvi does not know):

# %%
newer = os.path.join(tmp, "newer.gpvi")
rewrite(path, newer, lambda n, a: np.frombuffer(json.dumps({**meta, "version": 99}).encode(), np.uint8)
        if n == "meta.json" else a)
try_load(newer)

# %% [markdown]
# Saving is atomic: `save` writes a temporary file in the same folder and renames it onto the
# target, so an interrupted or failed save leaves the previous file as it was.

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
