# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Running on a GPU
#
# gpvi is written in JAX, so it runs wherever JAX runs. **Nothing in your gpvi code changes**:
# the same `gpvi.fit(...)` or `gpvi.GPClassifier().fit(...)` runs on a GPU when the installed JAX
# has one, and on the CPU otherwise. What you change is the JAX installation.
#
# This page was executed on a machine **without** a GPU: the code below prints the devices it
# found, and every output on this page comes from the CPU. No GPU timings are claimed here.
#
# *Run time: 6–20 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time.*
#
# ## Installing JAX for an NVIDIA GPU
#
# Install gpvi as usual, then the CUDA build of JAX (Linux, x86-64 or aarch64; see the
# [JAX installation guide](https://docs.jax.dev/en/latest/installation.html) for the details and
# the supported driver versions):
#
# ```bash
# pip install -e ".[plot]"                  # or: pip install gpvi
# pip install -U "jax[cuda13]"              # NVIDIA driver for CUDA 13
# # or
# pip install -U "jax[cuda12]"              # NVIDIA driver for CUDA 12
# python -c "import jax; print(jax.devices())"
# ```
#
# The CUDA wheels bring their own CUDA and cuDNN libraries; only the NVIDIA driver must be on the
# machine. gpvi is tested with jax and jaxlib 0.10.2 on the CPU; to stay on that version, pin
# it (`pip install "jax[cuda13]==0.10.2"`).
#
# ## What changes, and what does not
#
# - **Devices.** `jax.devices()` lists the GPUs; arrays and compiled programs go to the first one
#   by default.
# - **float64.** Importing gpvi switches JAX to double precision (`jax_enable_x64`), on every
#   backend: the Cholesky-based updates need it. GPUs differ widely in float64 throughput
#   (check your card's specification), so measure your own problem on both backends.
# - **Compilation.** The first fit of each shape compiles its programs for the device it runs
#   on; gpvi's on-disk compilation cache (`gpvi cache info`) is used on every backend.
# - **Several GPUs.** `gpvi.fit(..., executor="devices")` spreads the blocks of the data pass
#   over every device of JAX's default backend; the sums are combined in a fixed order, so the
#   result is the same as on one device.
# - **Forcing the CPU.** `JAX_PLATFORMS=cpu python script.py` hides the GPU from JAX, e.g. to
#   compare the two.

# %%
import time

import jax
import numpy as np

import gpvi

t_start = time.perf_counter()

print("JAX version:", jax.__version__)
print("default backend:", jax.default_backend())
print("devices:", jax.devices())
print("float64 enabled by gpvi:", jax.config.jax_enable_x64)

# %% [markdown]
# ## The same fit on whatever device JAX has
#
# A Poisson sparse GP on 10 000 rows. The code is what you would run on a GPU machine; here it
# runs on the device printed above.

# %%
rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, (10_000, 2))
y = rng.poisson(np.exp(np.sin(2 * X[:, 0]) + 0.3 * X[:, 1]))
model = gpvi.SparseGP(gpvi.kernels.RBF(variance=1.0, lengthscale=[1.0, 1.0]), gpvi.likelihoods.Poisson(),
                      inducing=100)

fit = gpvi.fit(model, X, y)
print(repr(fit))
print("the posterior's arrays live on:", fit.state.mean.devices(), " dtype:", fit.state.mean.dtype)

# %% [markdown]
# The second fit of the same shapes reuses the compiled programs, so its time is the engine's
# alone; this is the number to compare between a CPU and a GPU machine (on the CPU of this page
# it is printed below).

# %%
fit2 = gpvi.fit(model, X, y)
print(f"first run (compilation included): {fit.seconds:.3f} s")
print(f"{jax.default_backend()}: {fit2.iterations} iterations in {fit2.seconds:.3f} s (second run), "
      f"VLB {fit2.vlb:.6f}")

# %% [markdown]
# `executor="devices"` uses every device of the default backend: several GPUs on a multi-GPU
# machine, the one CPU device here. The bound is the same either way:

# %%
print("devices used:", jax.devices())
fit_dev = gpvi.fit(model, X, y, executor="devices")
print("VLB, in-memory path:", fit.vlb)
print("VLB, executor='devices':", fit_dev.vlb, " relative difference:", abs(fit_dev.vlb - fit.vlb) / abs(fit.vlb))

# %% [markdown]
# To run one fit on a particular device (say the CPU, on a machine that also has a GPU), JAX's
# `jax.default_device` context works around any gpvi call:

# %%
with jax.default_device(jax.devices("cpu")[0]):
    fit_cpu = gpvi.fit(model, X, y)
print("arrays on:", fit_cpu.state.mean.devices(), " VLB:", fit_cpu.vlb)

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
