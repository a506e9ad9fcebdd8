"""FPb: batch fixed point (Sheth et al. 2015, §4.1; Sheth & Khardon 2016).

Each iteration first runs Newton on the mean with the covariance held fixed until the VLB
stops changing, then takes one fixed-point step ``V ← (I − Σ λ_i a_i a_iᵀ)⁻¹``.  Both
updates are safeguarded against lowering the VLB exactly as in :mod:`gpvi.engines.fpi`.
"""
from __future__ import annotations

from gpvi.objective import Objective, State
from gpvi.engines.registry import Engine
from gpvi.engines._common import (NOT_FINITE_START, STOPPED, Clock, EngineResult, SafeguardedAscent, converged_change, estimated_gap,
                                 finite_start, gap_threshold, stalled_message, stopped_at_start)


def run(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int = 500, max_newton: int = 50, clip_gamma: str = "auto", callback=None,
        on_state=None) -> EngineResult:
    """Run FPb from ``state``; one iteration = a Newton loop on m plus one FP step on V.

    Stops when the estimated gap to the optimum (nats) is at most ``tol_nats``, by default
    ``0.1·tol·max(1, |VLB|)``; the gap is computed by the first Newton step of each iteration
    from the factorisation it needs anyway.  The Newton loop itself ends when the VLB changes
    by at most ``tol·max(1, |VLB|)`` (it only has to make the next FP step worthwhile).
    ``clip_gamma`` as in :func:`gpvi.engines.fpi.run`.
    """
    clock = Clock(callback, on_state, objective.model)
    sums = objective.sums(state)
    if clock.tick(sums.vlb, 0, state):
        return stopped_at_start(objective, state, sums.vlb, clock)
    state, sums, scale = finite_start(objective, state, sums)
    if scale is None:
        return EngineResult(state, float(sums.vlb), 0, False, NOT_FINITE_START,
                            clock.trace, evaluations=objective.num_evaluations)
    mean_guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    converged, message, it, gap = False, f"reached max_iter={max_iter}", 0, float("inf")
    for it in range(1, max_iter + 1):
        thr = gap_threshold(sums.vlb, tol, tol_nats)
        for k in range(max_newton):
            out = mean_guard.step(state, sums, update_cov=False, stop_below=thr if k == 0 else None)
            if k == 0:
                gap = mean_guard.gap
                if mean_guard.certified:
                    converged, message = True, f"estimated gap {gap:.3g} nats ≤ {thr:.3g}"
                    break
            if out is None:
                break
            prev = float(sums.vlb)
            state, sums, alpha = out
            if converged_change(float(sums.vlb), prev, tol) and alpha >= 0.25:
                break
        if converged:
            it -= 1
            break
        out = cov_guard.step(state, sums, update_mean=False)
        if out is None:
            gap = float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
            message = stalled_message(gap, sums.vlb)
            clock.tick(sums.vlb, it)
            break
        state, sums, alpha = out
        if clock.tick(sums.vlb, it, state):
            gap = float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
            message = STOPPED
            break
    else:
        gap = float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
    return EngineResult(state, float(sums.vlb), it, converged, message, clock.trace,
                        mean_guard.backtracks + cov_guard.backtracks,
                        mean_guard.cycles + cov_guard.cycles, objective.num_evaluations,
                        mean_guard.clipped + cov_guard.clipped, {} if scale == 1.0 else {"start_scale": scale}, gap)


ENGINE = Engine("fpb", run, "batch fixed point: Newton on m to convergence, then a fixed-point step on V (Sheth et al. 2015)", data="sums")
