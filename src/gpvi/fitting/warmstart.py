"""Warm starts across hyperparameter changes that keep ``q`` fixed in function space.

The hyperparameter search (:func:`gpvi.fit`, profile bound) runs the engine at every θ it
evaluates, warm-started from the previous optimum.  The state lives in *whitened* coordinates
``w = L⁻¹(u − μ)`` (``L`` the prior factor: ``chol K_MM`` of a sparse GP, ``chol K`` of a full GP,
``σ_p I`` of a GLM), and ``L`` changes with θ: the same ``(m, V)`` under a new θ is a different
posterior over the latent function — after the kernel variance grows tenfold, every latent
mean is √10 times larger.  For likelihoods whose curvature depends strongly on the latent
(logistic with a large kernel variance) that start is further from the new optimum.  The gain
is modest: on magic04 (1 300 rows, sparse GP, M = 200, logistic, default classifier) the inner
runs of the search took 598 fixed-point iterations in all with this map against 677 without
(most of the inner cost was the inner tolerance, see :func:`gpvi.fit`).

:func:`carry` instead maps the old state to the new coordinates so that ``q(u)`` over the
inducing values (sparse GP), the training latents (full GP) or the weights (GLM) is
unchanged: with ``T = L_new⁻¹ L_old`` (lower triangular),
``m ← T m + L_new⁻¹ (μ_old − μ_new)`` and ``chol V ← T chol V``; for a
:class:`~gpvi.models.multilatent.MultiLatent`, latent by latent (with ``T`` computed once where
all latents share one prior factor).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpvi._batching import map_latents
from gpvi.models.base import GLM, GP, SparseGP
from gpvi.models.multilatent import MultiLatent
from gpvi.objective import State
from gpvi._linalg import lower_matmul
from gpvi._compile import jit

__all__ = ["carry"]


def _factor(model, prior, d):
    """The prior factor ``L`` (d, d) of the whitening, from an Objective's prior cache."""
    if isinstance(model, SparseGP):
        return prior
    if isinstance(model, GP):
        return prior[1]
    return jnp.eye(d) * prior  # GLM: sqrt(prior_variance)


def _mean(model):
    return jnp.asarray(getattr(model, "mean", 0.0), jnp.float64)


def _carry_one(L_old, L_new, mu_old, mu_new, state):
    # One solve for both right-hand sides, [T | shift] = L_new⁻¹ [L_old | (μ_old − μ_new)·1].
    # Two separate solves, batched over the latents of a MultiLatent, made XLA:CPU (jax 0.10.2,
    # 2 cores) stop for good now and then with every thread idle: a loop of such calls hung
    # within seconds (d = 400–1233), as did USPS's hyperparameter search once in three runs.
    d = L_new.shape[0]
    Ts = solve_triangular(L_new, jnp.concatenate([L_old, jnp.full((d, 1), mu_old - mu_new)], axis=1), lower=True)
    T, shift = Ts[:, :d], Ts[:, d]
    # T is lower triangular (exact zeros above the diagonal), so T·chol is as well
    return State(T @ state.mean + shift, lower_matmul(T, state.chol))


_carry = jit(_carry_one)


@jit
def _carry_latents(L_old, L_new, mu_old, mu_new, state):
    """:func:`_carry_one` latent by latent, in one compiled call: the factors and means are
    tuples over the latents and ``state`` is stacked.  (Mapped eagerly, the slicing and
    stacking of a three-latent iris fit cost 0.35 s of its 2.5 s.)"""
    Lo, Ln = jnp.stack(L_old), jnp.stack(L_new)
    mo, mn = jnp.stack(mu_old), jnp.stack(mu_new)
    return map_latents(_carry_one, Lo, Ln, mo, mn, state)


@jit
def _carry_shared(L_old, L_new, mu_old, mu_new, state):
    """:func:`_carry_one` for latents that all share one prior factor (one kernel for all
    classes, or tied parameters): ``T = L_new⁻¹ L_old`` and ``L_new⁻¹ 1`` from one solve for all
    of them, where :func:`_carry_latents` solved the same system once per latent (d = 1 233 on
    USPS 4-7-9: three O(d³) solves per evaluation of the hyperparameter search).  The means may
    differ per latent: the shift ``L_new⁻¹ (μ_old − μ_new) 1`` is that solve's last column scaled."""
    d = L_new.shape[0]
    Ts = solve_triangular(L_new, jnp.concatenate([L_old, jnp.ones((d, 1))], axis=1), lower=True)
    T, ones = Ts[:, :d], Ts[:, d]
    shift = (jnp.stack(mu_old) - jnp.stack(mu_new))[:, None] * ones  # (Q, d)
    mean = state.mean @ T.T + shift
    return State(mean, lower_matmul(T, state.chol))


def supported(model) -> bool:
    if isinstance(model, MultiLatent):
        return all(supported(l) for l in model.latents)
    return type(model) in (SparseGP, GP, GLM)


def _same_kind(old, new) -> bool:
    """One built-in model type with the same inducing-input shapes (latent by latent)."""
    if isinstance(old, MultiLatent):
        return isinstance(new, MultiLatent) and len(old.latents) == len(new.latents) \
            and all(_same_kind(a, b) for a, b in zip(old.latents, new.latents))
    if type(old) is not type(new):
        return False
    return not isinstance(old, SparseGP) or old.inducing is new.inducing \
        or jnp.shape(old.inducing) == jnp.shape(new.inducing)


def carry(old_objective, new_objective, state: State) -> State:
    """``state`` (fitted under ``old_objective``'s θ) re-expressed in ``new_objective``'s whitened
    coordinates, keeping ``q`` over the prior's variables fixed; the input unchanged when the
    models are not of one built-in type, or when the map is not finite (a failed factor)."""
    old, new = old_objective.model, new_objective.model
    if not (supported(old) and _same_kind(old, new)) or old_objective.dim != new_objective.dim:
        return state
    d = state.mean.shape[-1]
    # With moving inducing inputs q(u) refers to other points; the map still keeps its
    # whitened meaning closer than the raw state would, and the engine corrects the rest.
    if isinstance(old, MultiLatent):  # latent by latent (q is factorised over the latents)
        parts = lambda m, prior: (tuple(_factor(l, p, d) for l, p in zip(m.latents, prior)),  # noqa: E731
                                  tuple(_mean(l) for l in m.latents))
        (Lo, mo), (Ln, mn) = parts(old, old_objective.prior), parts(new, new_objective.prior)
        one_prior = old._same_prior() == new._same_prior() == [0] * len(old.latents)
        out = (_carry_shared(Lo[0], Ln[0], mo, mn, state) if one_prior
               else _carry_latents(Lo, Ln, mo, mn, state))
    else:
        out = _carry(_factor(old, old_objective.prior, d), _factor(new, new_objective.prior, d),
                     _mean(old), _mean(new), state)
    ok = bool(np.isfinite(np.asarray(out.chol)).all() and np.isfinite(np.asarray(out.mean)).all())  # (NumPy: no eager programs)
    return out if ok else state
