# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Getting started
#
# gpvi has two front doors:
#
# 1. **scikit-learn estimators** (`gpvi.GPClassifier`, `gpvi.GPRegressor`,
#    `gpvi.GPCountRegressor`, `gpvi.GPOrdinalRegressor`) that pick a model, standardise the inputs
#    and learn the hyperparameters for you;
# 2. **`gpvi.fit(model, X, y)`**, where you choose the model (`GP`, `SparseGP`, `GLM`), the kernel,
#    the likelihood and the engine yourself, and get back a `FitResult`.
#
# This page uses both on small synthetic data sets.
#
# *Run time: 6–30 s, measured on a 2-core CPU machine shared with other jobs (JAX compilation
# included; the longer times with a cold compilation cache on a busy machine). The last cell
# prints the page's own time.*

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_moons
from sklearn.model_selection import train_test_split

import gpvi

t_start = time.perf_counter()

# %% [markdown]
# ## 1. The scikit-learn estimators
#
# A two-class problem: 300 points of scikit-learn's "two moons", split into training and test
# sets. `GPClassifier` behaves like any scikit-learn classifier: `fit`, `predict`,
# `predict_proba`, `score` (accuracy).

# %%
X, y = make_moons(n_samples=300, noise=0.25, random_state=0)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0)

clf = gpvi.GPClassifier()          # logistic link, full GP (≤ 500 rows), RBF ARD kernel learned
clf.fit(X_train, y_train)
print("test accuracy:", clf.score(X_test, y_test))
print("class probabilities of the first 3 test points:\n", clf.predict_proba(X_test[:3]))
print("fitted VLB (nats):", clf.vlb_)
print("learned kernel (on standardised inputs):", clf.kernel_)

# %% [markdown]
# `GPRegressor` is the same for real-valued targets; `predict(X, return_std=True)` gives the
# predictive standard deviation of `y`, and `score` is R².

# %%
rng = np.random.default_rng(0)
x_reg = rng.uniform(-3, 3, (80, 1))
y_reg = np.sin(2 * x_reg[:, 0]) + 0.2 * rng.normal(size=80)

reg = gpvi.GPRegressor().fit(x_reg, y_reg)
mean, std = reg.predict(np.array([[-1.0], [0.0], [1.0]]), return_std=True)
print("mean:", mean, "\nstd: ", std)
print("R² on the training data:", reg.score(x_reg, y_reg))

# %% [markdown]
# ## 2. The same classifier with `gpvi.fit`
#
# With `gpvi.fit` you assemble the model yourself: a GP prior with an RBF kernel, a Bernoulli
# (logistic) likelihood, and an *engine* that maximises the variational lower bound (VLB).
# `learn_hyperparameters=True` also learns the kernel's variance and lengthscale.

# %%
model = gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=1.0),
                likelihood=gpvi.likelihoods.Bernoulli())
fit = gpvi.fit(model, X_train, y_train, engine="fpi", learn_hyperparameters=True)
print(repr(fit))

# %% [markdown]
# The `FitResult` records what happened:
#
# - `vlb`: the final variational lower bound (nats, summed over the data);
# - `converged` and `gap`: the engine's *certificate* — `gap` is its estimate of how far the bound
#   is from its optimum (in nats), and `converged=True` means that estimate is below the tolerance;
# - `iterations`, `hyperparameter_rounds`, `message`;
# - `trace`: rows `(seconds, VLB)` as the fit progressed — one per engine iteration, or, with
#   learned hyperparameters as here, the start and one per round of the hyperparameter search;
# - `model`: the model with the learned hyperparameters.

# %%
print("vlb:", fit.vlb)
print("converged:", fit.converged, " gap (nats):", fit.gap)
print("iterations:", fit.iterations, " hyperparameter rounds:", fit.hyperparameter_rounds)
print("message:", fit.message)
print("trace shape:", fit.trace.shape, " first rows:\n", fit.trace[:3])
print("learned kernel:", fit.model.kernel)

# %% [markdown]
# `print(fit)` shows the whole summary:

# %%
print(fit)

# %% [markdown]
# Predictions: `predict_proba` gives class probabilities, `predict_f` the latent mean and
# variance, `log_predictive_density` per-point log predictive densities.

# %%
proba = fit.predict_proba(X_test)
acc = np.mean(proba.argmax(axis=1) == y_test)
print("probability array shape:", proba.shape)
print("test accuracy with gpvi.fit:", acc)
print("mean test log predictive density:", np.mean(fit.log_predictive_density(X_test, y_test)))
f_mean, f_var = fit.predict_f(X_test[:3])
print("latent mean:", f_mean, "\nlatent variance:", f_var)

# %% [markdown]
# A figure of the predicted probability of class 1 over the input plane, with the training
# points.

# %%
g0, g1 = np.meshgrid(np.linspace(-2, 3, 80), np.linspace(-1.5, 2, 60))
grid = np.column_stack([g0.ravel(), g1.ravel()])
p1 = fit.predict_proba(grid)[:, 1].reshape(g0.shape)

fig, ax = plt.subplots(figsize=(6, 4))
cs = ax.contourf(g0, g1, p1, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
ax.contour(g0, g1, p1, levels=[0.5], colors="k", linewidths=1)
ax.scatter(*X_train[y_train == 0].T, s=12, c="tab:blue", edgecolors="k", label="class 0")
ax.scatter(*X_train[y_train == 1].T, s=12, c="tab:red", edgecolors="k", label="class 1")
fig.colorbar(cs, ax=ax, label="p(y = 1 | x)")
ax.set_title("GP classifier fitted with gpvi.fit (engine='fpi')")
ax.legend(loc="lower left")
plt.show()

# %%
print(f"this page ran in {time.perf_counter() - t_start:.1f} s")
