# %% [markdown]
# # Sheth, Wang & Khardon (2015): sparse variational GPs with fixed-point updates
#
# **Paper.** Rishit Sheth, Yuyang Wang and Roni Khardon (2015), *Sparse Variational Inference
# for Generalized Gaussian Process Models*, Proceedings of the 32nd International Conference on
# Machine Learning (ICML).
#
# **The idea.** A sparse GP summarises the latent function by its values `u` at `M` inducing
# inputs and fits a Gaussian `q(u) = N(m, V)` by maximising a variational lower bound (VLB)
# that holds for *any* likelihood. The paper shows that the bound's derivatives depend on the
# likelihood only through two expectations per data point, ρᵢ = E[∂ log p(yᵢ|fᵢ)/∂fᵢ] and
# λᵢ = E[∂² log p(yᵢ|fᵢ)/∂fᵢ²] under the marginal q(fᵢ) (Eqs. 10a–11b, §3.1). The optimum then
# satisfies V* = (K_M⁻¹ − K_M⁻¹ K_MN diag(λ) K_NM K_M⁻¹)⁻¹ (Eq. 12b), which suggests iterating
# this equation as a **fixed-point operator** T(V) (Eq. 13, §4.1) together with a Newton step on
# the mean. There is no step size to tune, and in practice it converges in a handful of
# iterations. gpvi's default engine `"fpi"` is this update (with safeguards that never let the
# bound go down), and `"gradient"` is the L-BFGS alternative the paper compares against.
#
# This page fits a Poisson sparse GP to synthetic counts with both engines, then learns the
# kernel hyperparameters and the constant mean on the bound (as in the paper's §5, Fig. 4).
# The complete reproduction of the paper's experiments (learning curves, contraction,
# hyperparameters, BlogFeedback) is in `benchmarks/contraction.py`,
# `benchmarks/learning_curves.py`, `benchmarks/hyperparameters.py` and
# `benchmarks/blogfeedback.py`; see `benchmarks/README.md` for the numbers.
#
# **Run time:** 13 s with an empty compilation cache (JAX compiles every program) and 5 s
# once gpvi's on-disk cache holds them (10 s and 3 s of CPU time), measured with `time`
# on a 2-core CPU machine shared with other jobs (load average 5–9).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import gpvi
from gpvi.plots import plot_posterior_1d, plot_traces

# %% [markdown]
# ## Data: counts with a smoothly varying rate
#
# 5 000 inputs on [−3, 3] and Poisson counts with log-rate f(x) = sin(2x) + 0.5.

# %%
rng = np.random.default_rng(0)
N = 5000
X = rng.uniform(-3, 3, (N, 1))
f_true = np.sin(2 * X[:, 0]) + 0.5
y = rng.poisson(np.exp(f_true))
print(f"{N} rows, counts from {y.min()} to {y.max()}, mean {y.mean():.2f}")

# %% [markdown]
# ## The model
#
# A sparse GP with an RBF kernel, a Poisson likelihood (log link) and `M = 30` inducing inputs
# on a regular grid. (An integer, `inducing=30`, places them by k-means on `X` instead, which
# then runs at the start of every fit.) The inducing inputs stay fixed throughout, as the
# paper's active set does; `learn_inducing=True` would learn them too.

# %%
Z = np.linspace(-3, 3, 30)[:, None]
model = gpvi.SparseGP(
    kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=1.0),
    likelihood=gpvi.likelihoods.Poisson(),
    inducing=Z,
)

# %% [markdown]
# ## Fixed point against gradient, at fixed hyperparameters
#
# With the hyperparameters held fixed the two engines solve the same problem: maximise the VLB
# over `(m, V)`. We run each once with `max_iter=2` first, so that JAX's compilation is not in
# the timings, then time a full fit. Both stop only when their estimate of the distance to the
# optimum, `fit.gap` (nats), is below `0.1·tol·|VLB|` (`tol = 1e-6`).

# %%
fits = {}
for engine in ["fpi", "gradient"]:
    gpvi.fit(model, X, y, engine=engine, max_iter=2)  # compile
    t = time.perf_counter()
    fits[engine] = gpvi.fit(model, X, y, engine=engine)
    seconds = time.perf_counter() - t
    r = fits[engine]
    print(f"{engine:9s} VLB {r.vlb:.4f}  gap {r.gap:.1e}  converged {r.converged}  "
          f"iterations {r.iterations:3d}  passes over the data {r.evaluations:3d}  {seconds:.3f} s")
print(f"VLB difference fpi - gradient: {fits['fpi'].vlb - fits['gradient'].vlb:.1e} nats")

# %% [markdown]
# Both engines reach the same bound (to within the tolerance) and both certify it. The
# fixed-point engine needs a handful of iterations, each one pass over the data for ρ and λ plus
# O(M³) work, where L-BFGS on `(m, chol V)` needs well over a hundred here; the exact counts
# and times are printed above. Times at this size are fractions of a second and noisy on a
# shared machine; the paper's speed comparison at scale is reproduced in
# `benchmarks/learning_curves.py` and `benchmarks/blogfeedback.py` (all 52 397 BlogFeedback
# rows, M = 200).
#
# ## Learning the hyperparameters
#
# `learn_hyperparameters=True` maximises the VLB over the kernel variance, lengthscale and the
# constant mean as well: an L-BFGS-B search on the *profile* bound, running the fixed-point
# engine to convergence (warm-started) at every point it evaluates.

# %%
learned = gpvi.fit(model, X, y, engine="fpi", learn_hyperparameters=True)
print(learned)

# %%
print(f"VLB at the starting hyperparameters: {fits['fpi'].vlb:.2f}")
print(f"VLB at the learned hyperparameters:  {learned.vlb:.2f}")
print(f"learned kernel: {learned.model.kernel}")
print(f"learned constant mean: {float(learned.model.mean):.3f} (the true log-rate averages 0.5 over [-3, 3])")

# %% [markdown]
# The search ends with a converged engine run at the learned hyperparameters, so `gap` and
# `converged` in the summary above certify the final `q` exactly as for a fit at fixed
# hyperparameters. Predictions use the learned model:

# %%
Xtest = np.linspace(-3, 3, 7)[:, None]
mean_f, var_f = learned.predict_f(Xtest)
mean_y, var_y = learned.predict_y(Xtest)
for x, mf, sf, my, ft in zip(Xtest[:, 0], np.asarray(mean_f), np.sqrt(np.asarray(var_f)),
                             np.asarray(mean_y), np.sin(2 * Xtest[:, 0]) + 0.5):
    print(f"x = {x:5.2f}: latent {mf:6.3f} ± {sf:.3f} (true {ft:6.3f}); "
          f"expected count {my:.3f} (true {np.exp(ft):.3f})")

# %% [markdown]
# ## Figure
#
# Left: the distance to the best VLB against time for the two engines at fixed hyperparameters
# (each point one iteration). Right: the posterior rate with the learned hyperparameters, the
# counts, the true rate and the inducing inputs (ticks along the bottom).

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
plot_traces(fits, ax=ax1, gap=True)
ax1.set_title("fixed hyperparameters: distance to the best VLB")
plot_posterior_1d(learned, X, y, ax=ax2)
grid = np.linspace(-3, 3, 300)
ax2.plot(grid, np.exp(np.sin(2 * grid) + 0.5), "k--", lw=1, label="true rate")
ax2.set_ylim(-0.5, 12)
ax2.set_title("learned hyperparameters: posterior rate")
ax2.legend(loc="upper right")
plt.show()
