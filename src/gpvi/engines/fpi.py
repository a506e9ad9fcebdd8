"""FPi: incremental fixed point (Sheth & Khardon 2016, §4).

Each iteration takes one Newton step on the mean and one fixed-point step
``V ← (I − Σ λ_i a_i a_iᵀ)⁻¹`` on the covariance, both from one Cholesky of the same matrix —
together a natural-gradient step of size 1.  The step is safeguarded: a step that would
lower the VLB is damped (backtracking on the natural-gradient step size), and a 2-cycle
halves the step size; both are counted in the result.

FPi switches to the paper's order for the rest of the run — a (safeguarded) Newton step on the
mean, then a fixed-point step on the covariance at the new mean: two passes over the data per
iteration instead of one, but no rejections — when

- the joint step has been rejected twice (on logistic models rejections made convergence
  slowly linear);
- the joint steps are all accepted but slow: the estimated gap shrank by less than a factor
  :data:`SLOW_RATIO` per step for :data:`SLOW_RUN` steps in a row;
- the likelihood couples the latents (softmax; ``objective.coupled``): from the second
  iteration on.

``extras["sequential_from"]`` gives the iteration of the switch (absent when there was none)
and ``extras["sequential_because"]`` why (``"rejected steps"``, ``"slow steps"`` or
``"coupled latents"``).  The measurements behind these rules are in ``benchmarks/README.md``
("Why fpi switches to the paper's order").
"""
from __future__ import annotations

from collections import deque

import numpy as np

from gpvi.objective import Objective, State
from gpvi.engines.registry import Engine
from gpvi.engines._common import Clock, EngineResult, SafeguardedAscent, gap_threshold, objective_gap, stalled_message


def run(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int = 500, clip_gamma: str = "auto", callback=None) -> EngineResult:
    """Run FPi from ``state`` until the estimated gap to the optimum
    (:func:`~gpvi.engines._common.estimated_gap`, nats) is at most ``tol_nats``, by default
    ``0.1·tol·max(1, |VLB|)`` (see :func:`~gpvi.engines._common.gap_threshold`).

    The gap comes from the factorisation the next step needs anyway, so a certified state is
    recognised before its proposal is evaluated, whatever step sizes led there.

    ``clip_gamma``: ``"auto"`` uses γ_i clipped at 0 only in steps where ``I − S`` is not
    positive definite; ``"always"`` clips in every step (the heuristic of Sheth & Khardon 2016
    for Student-t).
    """
    clock = Clock(callback)
    sums = objective.sums(state)
    clock.tick(sums.vlb, 0)
    guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard.hold_after_damping = True
    rejected, extras = 0, {}
    converged, message, it, gap = False, f"reached max_iter={max_iter}", 0, float("inf")
    if not np.isfinite(float(sums.vlb)):
        return EngineResult(state, float(sums.vlb), 0, False, "VLB is not finite at the starting state",
                            clock.trace, evaluations=objective.num_evaluations)
    damped_run, window = 0, deque(maxlen=STALL_WINDOW)  # consecutive damped iterations; VLB at their starts
    slow_run, prev_gap = 0, float("inf")  # consecutive slow joint steps; the gap before the last one
    coupled = bool(getattr(objective, "coupled", False))
    for it in range(1, max_iter + 1):
        thr = gap_threshold(sums.vlb, tol, tol_nats)
        backtracks_before = guard.backtracks + cov_guard.backtracks
        if "sequential_from" in extras:
            out = _sequential_step(guard, cov_guard, state, sums, thr)
        else:
            before = guard.backtracks
            out = guard.step(state, sums, stop_below=thr)
            rejected += guard.backtracks > before
            slow = np.isfinite(guard.gap) and guard.gap > SLOW_RATIO * prev_gap
            slow_run, prev_gap = (slow_run + 1 if slow else 0), guard.gap
            if rejected >= 2 or slow_run >= SLOW_RUN or coupled:
                extras["sequential_from"] = it + 1
                extras["sequential_because"] = ("coupled latents" if coupled else "rejected steps" if rejected >= 2
                                                else "slow steps")
        gap = guard.gap
        if guard.certified:
            converged, message, it = True, f"estimated gap {gap:.3g} nats ≤ {thr:.3g}", it - 1
            break
        if out is None:
            message = stalled_message(gap, sums.vlb)
            it -= 1
            break
        if guard.backtracks + cov_guard.backtracks > backtracks_before:
            damped_run += 1
            window.append(float(sums.vlb))
        else:
            damped_run = 0
            window.clear()
        state, sums, _ = out
        clock.tick(sums.vlb, it)
        if damped_run >= STALL_WINDOW:
            gain = float(sums.vlb) - window[0]
            gap = objective_gap(objective, state, sums)
            if gain < 0.5 * gap:
                message = _stall_message(gain, gap, sums)
                extras["stalled"] = True
                break
    else:
        # max_iter steps taken: the gap at the final state comes from one more factorisation
        gap = objective_gap(objective, state, sums)
    return EngineResult(state, float(sums.vlb), it, converged, message, clock.trace,
                        guard.backtracks + cov_guard.backtracks, guard.cycles + cov_guard.cycles,
                        objective.num_evaluations, guard.clipped + cov_guard.clipped, extras, gap)


# fpi gives up, with a message saying why, after this many consecutive damped iterations that
# together gained less than half the gap estimated at their end: at that pace (a contraction
# factor above 0.986 per iteration) reaching the tolerance would take hundreds more damped
# iterations.  Seen on ill-conditioned posteriors (a logistic GP with kernel variance 1e8:
# I − Σλaaᵀ has eigenvalues from 1 to 1.3e4) where natural-gradient steps are damped to
# α ≈ 0.004; a separable logistic GLM with prior variance 1e6, also damped throughout,
# gains faster than that and converges in 70 iterations.
STALL_WINDOW = 30

# Joint steps that shrink the estimated gap by less than SLOW_RATIO each, SLOW_RUN times in a
# row, make fpi switch to the paper's order (see the module docstring).
SLOW_RATIO, SLOW_RUN = 0.5, 4


def _stall_message(gain, gap, sums):
    H = np.eye(sums.S.shape[-1]) - np.asarray(sums.S)
    ev = np.sort(np.linalg.eigvalsh(0.5 * (H + np.swapaxes(H, -1, -2))).ravel())
    return (f"stalled: the last {STALL_WINDOW} steps were all damped and together gained {gain:.3g} nats, "
            f"less than half the estimated gap of {gap:.3g} nats that remains; the fixed-point map does not "
            f"contract at this state (ill-conditioned: I − Σλaaᵀ has eigenvalues from {ev[0]:.3g} to "
            f"{ev[-1]:.3g}); engine='gradient' may get closer")


def _sequential_step(mean_guard, cov_guard, state, sums, stop_below):
    """Newton on m (V fixed), then FP on V at the new m; ``None`` if neither can ascend.  The
    mean step computes the gap at ``state`` (``mean_guard.gap``) and certifies it if small."""
    out_m = mean_guard.step(state, sums, update_cov=False, stop_below=stop_below)
    if mean_guard.certified:
        return out_m
    mid, mid_sums, alpha_m = (state, sums, 1.0) if out_m is None else out_m
    out_v = cov_guard.step(mid, mid_sums, update_mean=False)
    if out_v is None:
        return None if out_m is None else out_m
    return out_v[0], out_v[1], min(alpha_m, out_v[2])


ENGINE = Engine("fpi", run, "incremental fixed point: a Newton step on m and a fixed-point step on V per iteration (Sheth et al. 2015; default)", data="sums", latents=True)
