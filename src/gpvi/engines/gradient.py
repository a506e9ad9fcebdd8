"""GRAD: L-BFGS on the mean and the Cholesky factor of the covariance jointly
(Challis & Barber 2013, as used by Sheth et al. 2015 and Sheth & Khardon 2016).

The VLB is concave in ``(m, C)`` for log-concave likelihoods (``V = C Cᵀ``).  Its gradient
comes from the same data sums as the fixed-point engines:
``∂/∂m = Σρ_i a_i − m`` and ``∂/∂C = tril(S C) − C + diag(1/C_jj)`` with ``S = Σλ_i a_i a_iᵀ``.
It stops when the estimated gap to the optimum (:func:`~gpvi.engines._common.estimated_gap`,
computed from the data sums of the last evaluation) is small enough, as the other engines do:
a small relative change of the VLB is not enough, since L-BFGS can crawl far from the optimum
(a sparse Poisson GP stopped 0.027 nats short that way).
"""
from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from gpvi.objective import Objective, State, as_device_array
from gpvi.engines.registry import Engine
from gpvi.engines._common import NOT_FINITE_START, STOPPED, Clock, stopped_at_start, EngineResult, estimated_gap, final_gap, finite_start, gap_threshold
from gpvi._compile import jit


# A state of Q latent blocks (mean (Q, d), gpvi.models.multilatent) is packed block after block; the
# single-latent layout is unchanged.  ``shape`` is the mean's shape.
#
# Packing and unpacking are index copies done in NumPy on the host: L-BFGS-B's vector is a host
# array anyway, and as compiled XLA:CPU programs the scatter into and the gather out of the
# lower triangle took longer than the data pass they serve (N = 200, d = 200: 1.0 ms to unpack,
# 0.5 ms to gather the gradient, against 1.2 ms for the sums; 5-8 ms and 4 ms at the test
# suite's LLVM level 0).  In NumPy the two take about 0.3 ms together.


@lru_cache(maxsize=8)
def _tril(d):
    """Row and column indices of the lower triangle of a d×d matrix (read-only, cached)."""
    i, j = np.tril_indices(d)
    i.flags.writeable = j.flags.writeable = False
    return i, j


def _unpack(shape, x) -> State:
    """The state whose mean (of shape ``shape``) and lower-triangular factor are packed in the
    host vector ``x``."""
    d = shape[-1]
    i, j = _tril(d)
    xs = np.asarray(x, dtype=np.float64).reshape(-1, d + len(i))
    C = np.zeros((len(xs), d, d))
    C[:, i, j] = xs[:, d:]
    # a copy, not a view of x: a device array on the CPU may share a host array's memory, and
    # L-BFGS-B overwrites its vector in place after the callback
    mean = xs[:, :d].copy()
    return State(as_device_array(mean.reshape(shape)), as_device_array(C.reshape(tuple(shape) + (d,))))


def _pack(state) -> np.ndarray:
    """The host vector of a state's means and the lower triangles of its factors, block by block."""
    d = state.mean.shape[-1]
    i, j = _tril(d)
    mean = np.asarray(state.mean).reshape(-1, d)
    C = np.asarray(state.chol).reshape(-1, d, d)
    return np.concatenate([mean, C[:, i, j]], axis=1).reshape(-1)


@jit
def _grad_factor(state, S):
    """``∂VLB/∂C`` on and below the diagonal: ``S C − C + diag(1/C_jj)`` (its upper triangle is
    not used: :func:`_grad_vector` keeps the lower one)."""
    C = state.chol
    diag = jnp.eye(C.shape[-1], dtype=bool)
    return S @ C - C + jnp.where(diag, 1.0 / jnp.diagonal(C, axis1=-2, axis2=-1)[..., None, :], 0.0)


def _grad_vector(state, grad_m, S) -> np.ndarray:
    """The host vector of the VLB's gradient in the packed layout of :func:`_pack`."""
    return _pack(State(grad_m, _grad_factor(state, S)))


def run(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int = 500, history: int = 20, callback=None, on_state=None) -> EngineResult:
    """Maximise the VLB with SciPy's L-BFGS-B from ``state`` until the estimated gap is at most
    ``tol_nats`` (default ``0.1·tol·max(1, |VLB|)``)."""
    d = tuple(state.mean.shape)
    clock = Clock(callback, on_state, objective.model)
    memo: dict = {}

    def fun(x):
        s = _unpack(d, x)
        sums = objective.sums(s)
        v = float(sums.vlb)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(x)
        g = _grad_vector(s, sums.grad, sums.S)
        memo.update(x=np.array(x, copy=True), state=s, sums=sums)
        return -v, -g

    def gap_at(x, f):
        """The estimated gap at x, from the sums of its evaluation when it was the last one."""
        if "x" in memo and np.array_equal(memo["x"], x):
            return float(estimated_gap(memo["state"], memo["sums"].grad, memo["sums"].S, memo["sums"].trSV)[0])
        return final_gap(objective, _unpack(d, x))

    x0 = _pack(state)
    f0, _ = fun(x0)
    if clock.tick(-f0, 0, state):
        return stopped_at_start(objective, state, -f0, clock)
    extras = {}
    if not np.isfinite(f0):
        state, _sums, scale = finite_start(objective, state, objective.sums(state))
        if scale is None:
            return EngineResult(state, -float(f0), 0, False, NOT_FINITE_START,
                                clock.trace, evaluations=objective.num_evaluations)
        extras["start_scale"] = scale
        x0 = _pack(state)
        f0, _ = fun(x0)
    cur = {"it": 0, "x": x0, "f": f0, "gap": np.inf, "thr": gap_threshold(-f0, tol, tol_nats)}

    def certified(x, f):
        cur["thr"] = gap_threshold(-f, tol, tol_nats)
        cur["gap"] = gap_at(x, f)
        return cur["gap"] <= cur["thr"]

    def cb(intermediate_result):
        cur["it"] += 1
        x, f = intermediate_result.x, float(intermediate_result.fun)
        stop = clock.tick(-f, cur["it"], _unpack(d, x) if clock.watching else None)
        change = cur["f"] - f
        cur.update(x=np.array(x, copy=True), f=f, gap=np.inf)
        if stop:
            raise StopIteration
        # The gap costs a d×d factorisation; skip it while the VLB still moves by much more than
        # the threshold (then the gap, at least the next gain, is rarely below it).
        if change <= 1e3 * gap_threshold(-f, tol, tol_nats) or cur["it"] % 10 == 0:
            if certified(x, f):
                raise StopIteration

    # L-BFGS-B's own tests (relative change ftol, projected gradient gtol) are only backstops,
    # set far below the certified rule; from a very poor start one huge first step can make the
    # next relative change look tiny, so restart with fresh curvature pairs while a run still
    # makes progress.
    x, f_start, res = x0, f0, None
    ftol = 1e-2 * gap_threshold(-f0, tol, tol_nats) / max(1.0, abs(f0))  # 1e-3·tol by default
    if certified(x0, f0):
        msg = f"estimated gap {cur['gap']:.3g} nats ≤ {cur['thr']:.3g}"
    else:
        for _ in range(20):
            import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
            res = scipy.optimize.minimize(
                fun, x, jac=True, method="L-BFGS-B", callback=cb,
                options=dict(maxiter=max(1, max_iter - cur["it"]), maxfun=20 * max_iter + 100, ftol=ftol,
                             gtol=1e-12, maxcor=history),
            )
            x = cur["x"]
            if clock.stopped or cur["gap"] <= cur["thr"] or certified(x, cur["f"]):
                break
            progressed = (f_start - cur["f"]) > ftol * max(1.0, abs(cur["f"])) and res.nit > 1
            if not progressed or cur["it"] >= max_iter:
                break
            f_start = cur["f"]
        ok = cur["gap"] <= cur["thr"]
        if ok:
            msg = f"estimated gap {cur['gap']:.3g} nats ≤ {cur['thr']:.3g}"
        elif clock.stopped:
            msg = STOPPED
        elif cur["it"] >= max_iter:
            msg = f"reached max_iter={max_iter}; estimated gap {cur['gap']:.3g} nats{_TRY_FPI}"
        else:
            msg = f"L-BFGS-B stopped ({res.message}) with estimated gap {cur['gap']:.3g} nats > {cur['thr']:.3g}{_TRY_FPI}"
    final = _unpack(d, x)
    # Columns may have flipped sign; V = C Cᵀ is unchanged by making the diagonal positive.
    chol = np.asarray(final.chol)
    diag = np.diagonal(chol, axis1=-2, axis2=-1)
    final = State(final.mean, jax.device_put(chol * np.where(diag < 0, -1.0, 1.0)[..., None, :]))
    ok = bool(cur["gap"] <= cur["thr"])
    return EngineResult(final, -float(cur["f"]), cur["it"], ok, msg, clock.trace,
                        evaluations=objective.num_evaluations, extras=extras, gap=float(cur["gap"]))


# The end of the message of a run that did not converge: on the ill-conditioned problems of
# benchmarks/hard.py where L-BFGS stalls (counts in the millions, kernel variances of 1e4–1e8),
# fpi's natural-gradient steps converge.
_TRY_FPI = "; engine='fpi' (natural-gradient steps) may finish"


ENGINE = Engine("gradient", run, "L-BFGS on (m, chol V) jointly", data="sums", latents=True)
