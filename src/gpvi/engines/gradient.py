"""GRAD: L-BFGS on the mean and the Cholesky factor of the covariance jointly
(Challis & Barber 2013, as used by Sheth et al. 2015 and Sheth & Khardon 2016).

The VLB is concave in ``(m, C)`` for log-concave likelihoods (``V = C Cᵀ``).  Its gradient
comes from the same data sums as the fixed-point engines:
``∂/∂m = Σρ_i a_i − m`` and ``∂/∂C = tril(S C) − C + diag(1/C_jj)`` with ``S = Σλ_i a_i a_iᵀ``.
The stopping rule is SciPy's ``ftol``, i.e. the relative VLB change, as for the other engines.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from ..objective import Objective, State
from ._common import Clock, EngineResult


@partial(jax.jit, static_argnums=0)
def _unpack(d, x):
    i, j = jnp.tril_indices(d)
    C = jnp.zeros((d, d), x.dtype).at[i, j].set(x[d:])
    return State(x[:d], C)


@jax.jit
def _pack(state):
    d = state.mean.shape[0]
    i, j = jnp.tril_indices(d)
    return jnp.concatenate([state.mean, state.chol[i, j]])


@jax.jit
def _grad_vector(state, grad_m, S):
    C = state.chol
    d = C.shape[0]
    gC = jnp.tril(S @ C) - C + jnp.diag(1.0 / jnp.diag(C))
    i, j = jnp.tril_indices(d)
    return jnp.concatenate([grad_m, gC[i, j]])


def run(objective: Objective, state: State, *, tol: float = 1e-6, max_iter: int = 500,
        history: int = 20, callback=None) -> EngineResult:
    """Maximise the VLB with SciPy's L-BFGS-B from ``state``."""
    d = state.mean.shape[0]
    clock = Clock(callback)
    memo: dict = {}

    def fun(x):
        s = _unpack(d, jnp.asarray(x))
        sums = objective.sums(s)
        v = float(sums.vlb)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(x)
        g = np.asarray(_grad_vector(s, sums.grad, sums.S))
        memo["vlb"] = v
        return -v, -g

    x0 = np.asarray(_pack(state))
    f0, _ = fun(x0)
    clock.tick(-f0, 0)
    if not np.isfinite(f0):
        return EngineResult(state, -float(f0), 0, False, "VLB is not finite at the starting state",
                            clock.trace, evaluations=objective.num_evaluations)
    counter = {"it": 0}

    def cb(intermediate_result):
        counter["it"] += 1
        clock.tick(-float(intermediate_result.fun), counter["it"])

    # SciPy's ftol test is relative to |VLB|: from a very poor start (e.g. a Poisson GLM with
    # large features at its prior, VLB ≈ −1e32) one huge first step can make the next change
    # look relatively tiny and stop far from the optimum.  Restart with fresh curvature
    # history while a run still makes progress by the same test measured from its start.
    x, f_start = x0, f0
    for _ in range(20):
        res = scipy.optimize.minimize(
            fun, x, jac=True, method="L-BFGS-B", callback=cb,
            options=dict(maxiter=max_iter - counter["it"], maxfun=20 * max_iter + 100, ftol=tol,
                         gtol=1e-12, maxcor=history),
        )
        x = res.x
        progressed = (f_start - res.fun) > tol * max(1.0, abs(res.fun)) and res.nit > 1
        if not progressed or counter["it"] >= max_iter or not res.success:
            break
        f_start = res.fun
    final = _unpack(d, jnp.asarray(res.x))
    # Columns may have flipped sign; V = C Cᵀ is unchanged by making the diagonal positive.
    chol = np.asarray(final.chol)
    final = State(final.mean, jnp.asarray(chol * np.where(np.diag(chol) < 0, -1.0, 1.0)[None, :]))
    ok = bool(res.success) and counter["it"] < max_iter
    msg = str(res.message)
    if "RELATIVE REDUCTION" in msg or "REL_REDUCTION" in msg:
        msg = f"VLB change below tol={tol:g}"
    return EngineResult(final, -float(res.fun), counter["it"], ok, msg, clock.trace,
                        evaluations=objective.num_evaluations)
