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
- the likelihood couples the latents (softmax; ``objective.coupled``) and one joint step left
  more than :data:`COUPLED_SLOW_RATIO` of the gap before it.  Joint steps of coupled latents
  (the joint Newton direction of the means, the fixed point of each covariance) shrink the gap
  fast far from the optimum and slowly near it, where two passes in the paper's order gain
  more than two joint ones.

``extras["sequential_from"]`` gives the iteration of the switch (absent when there was none)
and ``extras["sequential_because"]`` why (``"rejected steps"``, ``"slow steps"`` or
``"slow coupled steps"``).  The measurements behind these rules are in ``benchmarks/README.md``
("Why fpi switches to the paper's order").

Where the fixed-point map does not contract (:data:`STALL_WINDOW` damped iterations in a row that
gained less than half the remaining gap: a very large kernel or prior variance, separable
classes; before the first rescue, iterations whose step size is still held below 1 count as
damped too, where at least :data:`HELD_STALL_NATS` remain), fpi runs L-BFGS on ``(m, chol V)`` (:mod:`gpvi.engines.gradient`) from its state for at
most :data:`RESCUE_ITER` iterations — up to :data:`MAX_RESCUES` times — and resumes its own steps
where L-BFGS stopped.  ``extras["rescues"]`` lists ``(iteration, L-BFGS iterations, VLB gained)``
of each; their iterations count towards ``iterations`` and ``max_iter``.  A starting state whose
VLB is not finite (the prior under a large variance with a Poisson or exponential likelihood) is
replaced by the same mean with a narrower covariance (:func:`~gpvi.engines._common.finite_start`;
``extras["start_scale"]``).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from gpvi.objective import Objective, State
from gpvi.engines.registry import Engine
from gpvi.engines import gradient as _gradient
from gpvi.engines._common import (NOT_FINITE_START, STOPPED, Clock, EngineResult, SafeguardedAscent, finite_start, gap_threshold, stopped_at_start,
                                 objective_gap, stalled_message)


def run(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int = 500, clip_gamma: str = "auto", sequential: bool = False, callback=None,
        on_state=None) -> EngineResult:
    """Run FPi from ``state`` until the estimated gap to the optimum
    (:func:`~gpvi.engines._common.estimated_gap`, nats) is at most ``tol_nats``, by default
    ``0.1·tol·max(1, |VLB|)`` (see :func:`~gpvi.engines._common.gap_threshold`).

    The gap comes from the factorisation the next step needs anyway, so a certified state is
    recognised before its proposal is evaluated, whatever step sizes led there.

    ``clip_gamma``: ``"auto"`` uses γ_i clipped at 0 only in steps where ``I − S`` is not
    positive definite; ``"always"`` clips in every step (the heuristic of Sheth & Khardon 2016
    for Student-t).

    ``sequential``: take the paper's order (a Newton step on m, then a fixed-point step on V) from
    the first iteration, instead of joint steps until two are rejected or four are slow.  The
    hyperparameter search passes it to its next runs once a run has switched: each of them
    would otherwise pay for the same rejected joint steps again.  Where the run switched, and
    why, is in ``extras["sequential_from"]`` and ``extras["sequential_because"]``.
    """
    clock = Clock(callback, on_state, objective.model)
    sums = objective.sums(state)
    if clock.tick(sums.vlb, 0, state):
        return stopped_at_start(objective, state, sums.vlb, clock)
    guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard = SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard.hold_after_damping = True
    rejected, extras = 0, {}
    converged, message, it, gap = False, f"reached max_iter={max_iter}", 0, float("inf")
    state, sums, scale = finite_start(objective, state, sums)
    if scale is None:
        return EngineResult(state, float(sums.vlb), 0, False, NOT_FINITE_START,
                            clock.trace, evaluations=objective.num_evaluations)
    if scale != 1.0:
        extras["start_scale"] = scale
    damped_run, halved_run, window = 0, 0, deque(maxlen=STALL_WINDOW)  # consecutive damped iterations; VLB at their starts
    slow_run, prev_gap = 0, float("inf")  # consecutive slow joint steps; the gap before the last one
    coupled = bool(getattr(objective, "coupled", False))
    if sequential:
        extras["sequential_from"], extras["sequential_because"] = 1, "asked (sequential=True)"
    rescues = []  # (iteration, L-BFGS iterations, VLB gained) of each rescue
    while it < max_iter:
        it += 1
        thr = gap_threshold(sums.vlb, tol, tol_nats)
        backtracks_before = guard.backtracks + cov_guard.backtracks
        if "sequential_from" in extras:
            out = _sequential_step(guard, cov_guard, state, sums, thr, tol)
        else:
            before = guard.backtracks
            out = guard.step(state, sums, stop_below=thr)
            rejected += guard.backtracks > before
            slow = np.isfinite(guard.gap) and guard.gap > (COUPLED_SLOW_RATIO if coupled else SLOW_RATIO) * prev_gap
            slow_run, prev_gap = (slow_run + 1 if slow else 0), guard.gap
            if rejected >= 2 or slow_run >= (1 if coupled else SLOW_RUN):
                extras["sequential_from"] = it + 1
                extras["sequential_because"] = ("rejected steps" if rejected >= 2 else "slow coupled steps" if coupled
                                                else "slow steps")
        gap = guard.gap
        if guard.certified:
            converged, message, it = True, f"estimated gap {gap:.3g} nats ≤ {thr:.3g}", it - 1
            break
        if out is None:
            message = stalled_message(gap, sums.vlb)
            it -= 1
            break
        # damped: a step halved in this iteration or, until the first rescue, one whose size is
        # still held below 1 from an earlier halving (see HELD_STALL_NATS)
        halved = guard.backtracks + cov_guard.backtracks > backtracks_before
        halved_run = halved_run + 1 if halved else 0
        if halved or (out[2] < 1.0 and not rescues):
            damped_run += 1
            window.append(float(sums.vlb))
        else:
            damped_run = 0
            window.clear()
        state, sums, _ = out
        if clock.tick(sums.vlb, it, state):
            message, gap = STOPPED, objective_gap(objective, state, sums)
            break
        if damped_run >= STALL_WINDOW:
            held_only = halved_run < STALL_WINDOW  # the run is damped only by held step sizes
            if held_only and gap < HELD_STALL_NATS:
                continue  # near the optimum by the gap at this iteration's start: no factorisation for it
            gain = float(sums.vlb) - window[0]
            gap = objective_gap(objective, state, sums)
            if gain >= 0.5 * gap or (held_only and gap < HELD_STALL_NATS):
                continue
            if len(rescues) >= MAX_RESCUES or it >= max_iter:
                message = _stall_message(gain, gap, sums, rescues)
                extras["stalled"] = True
                break
            # the map does not contract here: L-BFGS on (m, chol V) still ascends
            # its iterations go on fpi's clock; states are built for it only when a hook watches
            relay = ({"on_state": lambda m, st, p, at=it: p.iteration > 0 and clock.tick(p.vlb, at + p.iteration, st)}
                     if clock.watching else
                     {"callback": lambda i, v, t, at=it: clock.tick(v, at + i) if i > 0 else None})
            res = _gradient.run(objective, state, tol=tol, tol_nats=tol_nats,
                                max_iter=min(RESCUE_ITER, max_iter - it), **relay)
            rescues.append((it, res.iterations, res.vlb - float(sums.vlb)))
            it += res.iterations
            state, gap = res.state, res.gap
            sums = objective.sums(state)
            if clock.stopped:
                message = STOPPED
                break
            if res.converged:
                converged, message = True, f"{res.message} (by L-BFGS after fpi's steps were damped at iteration {rescues[-1][0]})"
                break
            damped_run, rejected, slow_run, prev_gap = 0, 0, 0, float("inf")
            window.clear()
            guard.alpha = cov_guard.alpha = 1.0
    else:
        # max_iter steps taken: the gap at the final state comes from one more factorisation
        gap = objective_gap(objective, state, sums)
    if rescues:
        extras["rescues"] = rescues
        if not converged and "stalled" not in extras:
            message += (f" (the fixed-point map does not contract on this posterior: {len(rescues)} phase(s) of L-BFGS "
                        f"from iteration {rescues[0][0]} on; estimated gap {gap:.3g} nats: a larger max_iter may finish)")
    return EngineResult(state, float(sums.vlb), it, converged, message, clock.trace,
                        guard.backtracks + cov_guard.backtracks, guard.cycles + cov_guard.cycles,
                        objective.num_evaluations, guard.clipped + cov_guard.clipped, extras, gap)


# When the fixed-point map does not contract — STALL_WINDOW consecutive damped iterations that
# together gained less than half the gap estimated at their end — fpi hands the state to L-BFGS on
# (m, chol V) (the gradient engine) for at most RESCUE_ITER iterations, then resumes its own steps
# from where L-BFGS stopped; after MAX_RESCUES such rescues it gives up, with a message saying why.
# At the stall's pace (a contraction factor above 0.986 per iteration) reaching the tolerance would
# take hundreds more damped iterations.  Seen on ill-conditioned posteriors: a logistic GP with
# kernel variance 1e8 (I − Σλaaᵀ has eigenvalues from 1 to 1e8) where natural-gradient steps are
# damped to α ≈ 0.004, a separable sparse logistic GP with kernel variance 1e6 (L-BFGS then
# certifies the optimum 9 nats above the stalled state), an ordinal GP with kernel variance 1e6
# (benchmarks/hard.py).  A separable logistic GLM with prior variance 1e6, also damped
# throughout, gains faster than that and converges in about 60 iterations without a rescue.
STALL_WINDOW = 30
MAX_RESCUES, RESCUE_ITER = 3, 300

# Until the first rescue, iterations whose step size is only held below 1 (no new halving) count
# as damped as well, where the estimated gap is at least HELD_STALL_NATS.  In a wine CV fold's
# hyperparameter search (83 rows, three softmax latents, kernel variances 6.4e6, 1.3e4 and 5e-4)
# fpi crawled 5–50 nats below the optimum with its mean step held at α = 1/16 and its covariance
# step at 1/64–1/128, halving only every few iterations: 30 halvings in a row never came, and
# the run used all 500 iterations (10–13 s) where L-BFGS alone converges in 535 (2 s); with the
# held steps counted it converges in 350–370 iterations (3–5 s) after one rescue at iteration 59.
# Under a nat from the optimum fpi's held steps finish on their own: benchmarks/hard.py's ordinal
# GP first stalls this way 0.7 nats below it, where 300 L-BFGS iterations gained 3 % of the gap
# and the fit took 1056 iterations instead of 776.
HELD_STALL_NATS = 1.0

# Joint steps that shrink the estimated gap by less than SLOW_RATIO each, SLOW_RUN times in a
# row, make fpi switch to the paper's order (see the module docstring).
SLOW_RATIO, SLOW_RUN = 0.5, 4

# Coupled latents (softmax) switch after one joint step that left more than COUPLED_SLOW_RATIO of
# the gap: near the optimum an iteration in the paper's order (two passes) shrinks the gap about
# tenfold or more, as much as two joint steps at this ratio (0.3² ≈ 0.1).  On the USPS 4-7-9
# search (benchmarks/README.md, "Why fpi switches to the paper's order") joint steps shrank the
# gap 10–50× a step in the search's first runs and by 0.3–0.8 a step once θ neared its optimum.
COUPLED_SLOW_RATIO = 0.3


# Most extra Newton steps on the mean per iteration while its target is clipped (see _sequential_step).
CLIPPED_NEWTON = 20


def _stall_message(gain, gap, sums, rescues=()):
    H = np.eye(sums.S.shape[-1]) - np.asarray(sums.S)
    ev = np.sort(np.linalg.eigvalsh(0.5 * (H + np.swapaxes(H, -1, -2))).ravel())
    why = (f"stalled: the last {STALL_WINDOW} steps were all damped and together gained {gain:.3g} nats, "
           f"less than half the estimated gap of {gap:.3g} nats that remains; the fixed-point map does not "
           f"contract at this state (ill-conditioned: I − Σλaaᵀ has eigenvalues from {ev[0]:.3g} to {ev[-1]:.3g})")
    if not rescues:
        return why + "; engine='gradient' may get closer"
    return (why + f", and {len(rescues)} phases of L-BFGS (engine='gradient', {sum(r[1] for r in rescues)} iterations "
            f"in all) did not finish either; engine='fpb' (a full Newton solve for the mean before each covariance "
            f"step) may finish, at many more passes over the data — a very large kernel or prior variance makes "
            f"a posterior this ill-conditioned")


def _sequential_step(mean_guard, cov_guard, state, sums, stop_below, tol=1e-6):
    """Newton on m (V fixed), then FP on V at the new m; ``None`` if neither can ascend.  The
    mean step computes the gap at ``state`` (``mean_guard.gap``) and certifies it if small;
    while the curvature is clipped, the extra Newton steps on the mean stop once one gains at
    most ``tol`` (the run's relative tolerance) of the bound."""
    out_m = mean_guard.step(state, sums, update_cov=False, stop_below=stop_below)
    if mean_guard.certified:
        return out_m
    # While the curvature had to be clipped (some γ_i < 0: far from the optimum of a likelihood
    # that is not log-concave), the mean goes on to convergence first, as in fpb: the clipped
    # covariance target is only a heuristic until the residuals are small
    for _ in range(CLIPPED_NEWTON):
        if out_m is None or not mean_guard.target_clipped:
            break
        nxt = mean_guard.step(out_m[0], out_m[1], update_cov=False)
        if nxt is None:
            break
        change = float(nxt[1].vlb) - float(out_m[1].vlb)
        out_m = nxt[0], nxt[1], min(out_m[2], nxt[2])
        if change <= tol * max(1.0, abs(float(nxt[1].vlb))):
            break
    mid, mid_sums, alpha_m = (state, sums, 1.0) if out_m is None else out_m
    out_v = cov_guard.step(mid, mid_sums, update_mean=False)
    if out_v is None:
        return None if out_m is None else out_m
    return out_v[0], out_v[1], min(alpha_m, out_v[2])


ENGINE = Engine("fpi", run, "incremental fixed point: a Newton step on m and a fixed-point step on V per iteration (Sheth et al. 2015; default)", data="sums", latents=True)
