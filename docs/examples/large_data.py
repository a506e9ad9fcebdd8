# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Large data: sources and executors
#
# The batch engines `fpi`, `fpb` and `gradient` need from the data only a few sums over the
# rows in each pass. gpvi therefore does not need the rows in memory:
#
# - a **source** (`gpvi.data.sources`) hands out the rows in numbered blocks: `ArraySource`
#   (in-memory arrays), `NpySource` (`.npy` files opened as memory maps) and `ParquetSource` (a
#   Parquet file, one block per row group);
# - an **executor** (`executor=` of `gpvi.fit`) runs each pass over the blocks: in this process
#   (`None` or `"local"`), over every JAX device (`"devices"`), or on a Dask cluster (a
#   `distributed.Client`).
#
# Each block's partial sums are added in a fixed pairwise order, so every combination gives the
# same fit, up to floating-point rounding (the differences are printed below). This page writes 40 000 rows to a temporary folder as `.npy` files and as Parquet,
# and fits the same model from memory, from both files, with a small memory budget, and on a
# two-worker Dask `LocalCluster`.
#
# *Run time: 8–30 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time.
# Needs `pip install "gpvi[parquet,dask]"` (pyarrow and dask.distributed).*

# %%
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import gpvi
from gpvi.data.sources import ArraySource, NpySource, ParquetSource

t_start = time.perf_counter()

# %% [markdown]
# ## The data
#
# Counts with an exposure (e.g. events per region, `exposure` = population), two input columns.

# %%
N = 40_000
rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (N, 2))
exposure = rng.uniform(0.5, 2.0, N)
y = rng.poisson(exposure * np.exp(np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]))

tmp = tempfile.mkdtemp()
np.save(os.path.join(tmp, "X.npy"), X)
np.save(os.path.join(tmp, "y.npy"), y.astype(np.float64))
np.save(os.path.join(tmp, "offset.npy"), np.log(exposure))

table = pa.table({"x0": X[:, 0], "x1": X[:, 1], "y": y, "log_exposure": np.log(exposure)})
pq.write_table(table, os.path.join(tmp, "counts.parquet"), row_group_size=8192)   # 5 row groups
for name in sorted(os.listdir(tmp)):
    print(f"{name:16s} {os.path.getsize(os.path.join(tmp, name)) / 1e6:6.2f} MB")

# %% [markdown]
# ## The same fit from four places
#
# A Poisson sparse GP with 50 inducing inputs and fixed hyperparameters. The inducing inputs
# are given explicitly (`inducing=Z`), so that all fits share them (an integer `inducing=M`
# would place them by k-means on the rows).

# %%
Z = rng.uniform(-2, 2, (50, 2))
model = gpvi.SparseGP(gpvi.kernels.RBF(variance=1.0, lengthscale=[1.0, 1.0]),
                      gpvi.likelihoods.Poisson(), inducing=Z)

fit_mem = gpvi.fit(model, X, y, offset=np.log(exposure))

# the same arrays as a block source: read block by block like the files below
arrays = ArraySource(X, y, offset=np.log(exposure), block_rows=10_000)
fit_arr = gpvi.fit(model, arrays)

npy = NpySource(os.path.join(tmp, "X.npy"), os.path.join(tmp, "y.npy"), os.path.join(tmp, "offset.npy"),
                block_rows=10_000)
fit_npy = gpvi.fit(model, npy)

parquet = ParquetSource(os.path.join(tmp, "counts.parquet"), target="y", features=["x0", "x1"],
                        offset="log_exposure")
print("Parquet source:", parquet.num_rows, "rows,", parquet.num_cols, "features,", parquet.num_blocks, "blocks")
fit_pq = gpvi.fit(model, parquet)

for name, f in [("in memory", fit_mem), ("ArraySource", fit_arr), ("NpySource", fit_npy), ("ParquetSource", fit_pq)]:
    print(f"{name:14s} VLB {f.vlb:.10f}  iterations {f.iterations}  converged {f.converged}  "
          f"seconds {f.seconds:.2f}")
print("largest difference of the bounds:", max(abs(f.vlb - fit_mem.vlb) for f in (fit_arr, fit_npy, fit_pq)), "nats")
assert all(abs(f.vlb - fit_mem.vlb) <= 1e-10 * abs(fit_mem.vlb) for f in (fit_arr, fit_npy, fit_pq))

# %% [markdown]
# ## Out of core: a small memory budget
#
# Between passes a fit keeps the rows and their projections onto the inducing inputs in memory,
# up to `cache_bytes` (512 MiB by default). With a budget smaller than the data, the blocks that
# do not fit are read from the file again and projected again in every pass: slower, but the
# memory stays bounded. A pass that recomputes the projections forms its sums in a different
# order of floating-point operations, so the bound can differ in the last digits (the relative
# difference is printed below), far below the fit's tolerance (`tol=1e-6` relative).

# %%
fit_ooc = gpvi.fit(model, parquet, cache_bytes=64 * 2**10)       # 64 KiB: no block fits
print(f"cache_bytes=64 KiB: VLB {fit_ooc.vlb:.10f}  passes {fit_ooc.evaluations}  seconds {fit_ooc.seconds:.2f}")
print("difference from the in-memory fit:", abs(fit_ooc.vlb - fit_mem.vlb), "nats, relative",
      abs(fit_ooc.vlb - fit_mem.vlb) / abs(fit_mem.vlb))

# %% [markdown]
# Hyperparameters are learned the same way, block by block (here the kernel's variance and
# lengthscales, on the Parquet file):

# %%
fit_hyp = gpvi.fit(model, parquet, learn_hyperparameters=["kernel.variance", "kernel.lengthscale"])
print(repr(fit_hyp))
print("learned kernel:", fit_hyp.model.kernel)

# %% [markdown]
# ## On a Dask cluster
#
# With `executor=distributed.Client(...)` every block is read once on a worker and kept there;
# each pass sends the current posterior to the workers and only the partial sums come back.
# Here a `LocalCluster` of two single-threaded workers in this process (`processes=False`) stands
# in for a real cluster; with a cluster elsewhere you would pass `Client("scheduler:8786")` and
# a file path the workers can read.

# %%
from distributed import Client, LocalCluster

with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
        Client(cluster) as client:
    print("workers:", len(client.scheduler_info()["workers"]))
    fit_dask = gpvi.fit(model, parquet, executor=client)
print(f"Dask: VLB {fit_dask.vlb:.10f}  iterations {fit_dask.iterations}  converged {fit_dask.converged}  "
      f"seconds {fit_dask.seconds:.2f}")
print("difference from the in-memory fit:", abs(fit_dask.vlb - fit_mem.vlb), "nats, relative",
      abs(fit_dask.vlb - fit_mem.vlb) / abs(fit_mem.vlb))
assert abs(fit_dask.vlb - fit_mem.vlb) <= 1e-10 * abs(fit_mem.vlb)

# %% [markdown]
# A cluster pays when its workers are other machines and the data is too large for one. The
# printed differences show the point of the design: whichever source, budget or executor, the
# fit is the same up to floating-point rounding.
#
# Predictions need only the fitted posterior, not the data source:

# %%
mean, var = fit_dask.predict_y(np.array([[0.0, 0.0], [1.0, -1.0]]), offset=np.log([1.0, 1.0]))
print("predictive mean:", mean, " variance:", var)

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
