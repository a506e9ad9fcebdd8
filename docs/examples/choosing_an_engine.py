# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Choosing an engine
#
# Every engine of `gpvi.fit` maximises the **same** variational lower bound (VLB) of the same
# model; they differ in how they get there. This page fits one small problem with each engine and
# compares the bound they reach, their iterations, their time and their *certificate*
# (`converged`, `gap`). `gpvi.engines.names()` lists the registered engines.
#
# *Run time: 8–30 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time.*

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import gpvi

t_start = time.perf_counter()
print(gpvi.engines.names())

# %% [markdown]
# ## A Poisson sparse GP
#
# 1500 counts from a smooth rate, a sparse GP with 30 inducing inputs and *fixed*
# hyperparameters (so the only thing being optimised is the variational posterior, and every
# engine solves exactly the same problem).

# %%
rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, (1500, 1))
y = rng.poisson(np.exp(1.0 + np.sin(2 * X[:, 0])))

model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=0.7),
                      likelihood=gpvi.likelihoods.Poisson(), inducing=30)

# %% [markdown]
# Each engine is run twice and the second run is reported, so that the times below are the
# engines' own and not JAX's compilation. `fit.seconds` is the wall time of the fit.

# %%
engines = ["fpi", "fpb", "gradient", "dual", "laplace"]
fits = {}
for name in engines:
    gpvi.fit(model, X, y, engine=name)            # compile
    fits[name] = gpvi.fit(model, X, y, engine=name)

print(f"{'engine':9s} {'VLB':>14s} {'iterations':>10s} {'seconds':>8s} {'converged':>9s} {'gap (nats)':>11s}")
for name, f in fits.items():
    print(f"{name:9s} {f.vlb:14.6f} {f.iterations:10d} {f.seconds:8.3f} {str(f.converged):>9s} {f.gap:11.2e}")

# %% [markdown]
# What the table shows:
#
# - `fpi`, `fpb`, `gradient` and `dual` reach the same VLB to within the tolerance: with the
#   default `tol=1e-6`, an engine says `converged=True` only when its estimated distance to the
#   optimum (`gap`, in nats) is at most `0.1 · tol · max(1, |VLB|)`. Each engine's distance
#   from the best bound of the four is printed below.
# - They get there very differently: compare the `iterations` and `seconds` columns.
# - The `laplace` engine does not maximise the VLB: it finds the posterior mode and uses the
#   curvature there. Its `vlb` is the bound *evaluated at* the Laplace approximation, which is
#   lower, and it reports no gap (`NaN`).

# %%
best = max(f.vlb for n, f in fits.items() if n != "laplace")
for name, f in fits.items():
    print(f"{name:9s} VLB* - VLB = {best - f.vlb:.3e} nats")
# the claims of the text above, checked
assert all(best - fits[n].vlb <= 1e-6 * abs(best) for n in ["fpi", "fpb", "gradient", "dual"])
assert fits["laplace"].vlb < best and np.isnan(fits["laplace"].gap)
print("laplace extras:", {k: v for k, v in fits["laplace"].extras.items() if k == "log_marginal"})

# %% [markdown]
# The traces: VLB against the wall time of each iteration (`fit.trace`, one `(seconds, VLB)`
# row per iteration). The distance to the best bound is drawn on a log scale (clipped at 1e5
# nats: the dual engine's first iterates lie far below the optimum).

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
for name in ["fpi", "fpb", "gradient", "dual"]:
    t, v = fits[name].trace[:, 0], fits[name].trace[:, 1]
    ax1.plot(np.arange(1, len(v) + 1), np.maximum(best - v, 1e-10), marker=".", label=name)
    ax2.plot(t, np.maximum(best - v, 1e-10), marker=".", label=name)
for ax in (ax1, ax2):
    ax.set_yscale("log")
    ax.set_ylabel("VLB* − VLB (nats)")
    ax.set_ylim(1e-10, 1e5)
    ax.legend()
ax1.set_xlabel("iteration")
ax1.set_xscale("log")
ax2.set_xlabel("seconds")
fig.suptitle("Poisson sparse GP, N = 1500, M = 30, fixed hyperparameters")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Logistic classification and the Jaakkola–Jordan engine
#
# For a Bernoulli likelihood with the logistic link there are also the quadratic-surrogate
# engines of Izmailov & Kropotov (2017): `jj` maximises the Jaakkola–Jordan lower bound of the
# logistic function in closed form. Its `FitResult.vlb` is still the true (quadrature) VLB,
# computed off the clock; the surrogate bound it maximised is in `extras["surrogate_bound"]`.
# (The `dual` engine accepts a Bernoulli likelihood too, but strong duality does not hold for
# the logit link; it is shown separately below.)
#
# Note what `converged` means for `jj`: the engine certifies its own (surrogate) problem — its
# `message` says so — while `gap` is the estimated distance of the resulting posterior from the
# optimum of the true VLB.

# %%
Xc = rng.uniform(-3, 3, (1500, 2))
yc = (np.sin(Xc[:, 0]) + 0.5 * Xc[:, 1] + 0.5 * rng.normal(size=1500) > 0).astype(int)
clf_model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=2.0, lengthscale=1.0),
                          likelihood=gpvi.likelihoods.Bernoulli(), inducing=30)
cfits = {}
for name in ["fpi", "gradient", "jj"]:
    gpvi.fit(clf_model, Xc, yc, engine=name)
    cfits[name] = gpvi.fit(clf_model, Xc, yc, engine=name)
print(f"{'engine':9s} {'VLB':>14s} {'iterations':>10s} {'seconds':>8s} {'converged':>9s} {'gap (nats)':>11s}")
for name, f in cfits.items():
    print(f"{name:9s} {f.vlb:14.6f} {f.iterations:10d} {f.seconds:8.3f} {str(f.converged):>9s} {f.gap:11.2e}")
print("jj surrogate bound:", cfits["jj"].extras.get("surrogate_bound"))
print("jj message:", cfits["jj"].message)

# %% [markdown]
# The Jaakkola–Jordan bound is a lower bound of the logistic likelihood, so `jj`'s posterior
# maximises a looser objective: its true VLB is below `fpi`'s by the difference printed below,
# which is about the `gap` it reports.

# %%
print("fpi VLB - jj VLB =", cfits["fpi"].vlb - cfits["jj"].vlb, "nats;  jj's gap:", cfits["jj"].gap, "nats")
assert cfits["jj"].vlb < cfits["fpi"].vlb
assert cfits["gradient"].iterations > cfits["fpi"].iterations and fits["gradient"].iterations > fits["fpi"].iterations

# %% [markdown]
# The `dual` engine on a logistic model: strong duality need not hold, so its duality gap does
# not certify the fit, and it reports `converged=False` with a message that says why. It is
# also slow here, so it runs on the first 300 rows with at most 100 iterations:

# %%
dual_fit = gpvi.fit(clf_model, Xc[:300], yc[:300], engine="dual", max_iter=100)
fpi_fit = gpvi.fit(clf_model, Xc[:300], yc[:300], engine="fpi")
print(repr(dual_fit))
print("message:", dual_fit.message)
print(repr(fpi_fit))
assert not dual_fit.converged

# %% [markdown]
# ## Which engine when
#
# | engine | what it does | pick it when |
# |---|---|---|
# | `fpi` (default) | a Newton step on the mean and a fixed-point step on the covariance per iteration, safeguarded (steps that would lower the bound are damped) | almost always: no step size, few iterations, works with every likelihood and with data read block by block or on a cluster |
# | `fpb` | Newton on the mean to convergence, then the fixed point on the covariance | an alternative to `fpi`, worth comparing on your problem; the engine an ill-conditioned `fpi` fit names when it stalls (a kernel variance of 1e6–1e8: more passes over the data, but it finished every such problem of `benchmarks/hard.py`) |
# | `gradient` | L-BFGS on the mean and the Cholesky factor of the covariance | a baseline; more iterations than the fixed-point engines on the problems above |
# | `dual` | L-BFGS-B on the Lagrangian dual (Khan et al. 2013) | Gaussian or Poisson likelihoods in memory; for logit/probit it reports `converged=False` |
# | `laplace` | the Laplace approximation (mode + curvature) | a fast approximate posterior; no VLB maximisation and no gap; `extras["log_marginal"]` is the Laplace evidence |
# | `jj`, `taylor`, … | quadratic surrogates of the logistic likelihood, closed-form updates | Bernoulli with the logit link (Izmailov & Kropotov 2017) |
# | `sfp`, `svi`, `ivsgpr` | minibatch (stochastic) engines | data streamed in minibatches (`gpvi.fit_stream`, or `gpvi.fit(..., engine="sfp")`); `ivsgpr` for Gaussian sparse-GP regression |
#
# Whatever the engine, read `fit.converged` and `fit.gap` before trusting a fit: they mean the
# same thing for every engine that maximises the VLB.

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
