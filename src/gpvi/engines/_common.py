"""What every engine shares: the result record, the clock, and the safeguarded
natural-gradient (fixed-point) step of Sheth & Khardon (2016)."""
from __future__ import annotations

import dataclasses
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from ..objective import State, Sums


@dataclasses.dataclass
class EngineResult:
    """Outcome of one engine run.

    ``trace`` is an (iterations + 1, 2) array of (seconds since start, VLB), first row at the
    starting state.  ``backtracks`` counts rejected (VLB-lowering) steps that were damped,
    ``cycles`` counts detected 2-cycles of the fixed-point map, ``evaluations`` counts
    passes over the data.
    """

    state: State
    vlb: float
    iterations: int
    converged: bool
    message: str
    trace: np.ndarray
    backtracks: int = 0
    cycles: int = 0
    evaluations: int = 0


class Clock:
    """Records (seconds, VLB) per iteration and forwards it to an optional callback."""

    def __init__(self, callback=None):
        self.t0 = time.perf_counter()
        self.rows: list[tuple[float, float]] = []
        self.callback = callback

    def tick(self, vlb, iteration):
        t = time.perf_counter() - self.t0
        self.rows.append((t, float(vlb)))
        if self.callback is not None:
            self.callback(iteration, float(vlb), t)

    @property
    def trace(self):
        return np.asarray(self.rows, dtype=np.float64).reshape(-1, 2)


def converged_change(new, old, tol):
    """The stopping rule every engine uses: |ΔVLB| ≤ tol · max(1, |VLB|)."""
    return abs(new - old) <= tol * max(1.0, abs(new))


def _spd_chol(H):
    return jnp.linalg.cholesky(0.5 * (H + H.T))


def _precision_target(sums: Sums):
    """``I − S``, the FP target precision; where it is not positive definite (γ_i < 0 for a
    non-log-concave likelihood far from the optimum) fall back to the γ-clipped
    ``I − (S − S_pos)`` (Sheth & Khardon 2016, §5: clip γ at 0).  At the optimum
    ``I − S = V⁻¹`` is positive definite, so the fixed point is unchanged."""
    d = sums.grad.shape[0]
    eye = jnp.eye(d, dtype=sums.grad.dtype)
    H = eye - sums.S
    R = _spd_chol(H)
    ok = jnp.all(jnp.isfinite(R))
    Hc = eye - (sums.S - sums.S_pos)
    Rc = _spd_chol(Hc)
    return jnp.where(ok, H, Hc), jnp.where(ok, R, Rc), ~ok


@partial(jax.jit, static_argnames=("update_mean", "update_cov"))
def natural_step(state: State, sums: Sums, alpha, update_mean=True, update_cov=True):
    """One natural-gradient step of size ``alpha`` on ``q(w) = N(m, V)``.

    With ``H = I − Σλ_i a_i a_iᵀ`` (one Cholesky serves both updates):
    ``Λ' = (1 − α) V⁻¹ + α H`` and ``m' = m + α Λ'⁻¹ ∇_m VLB``.  At ``α = 1`` this is exactly the
    fixed-point update ``V ← H⁻¹`` with a Newton step on the mean (Sheth & Khardon 2016,
    Eq. 8; DESIGN §2), the FPi step.  Only the mean (Newton) or only the covariance (FP)
    can be updated with the flags.  Returns the new state and whether γ was clipped.
    """
    d = state.mean.shape[0]
    eye = jnp.eye(d, dtype=state.mean.dtype)
    H, RH, clipped = _precision_target(sums)
    if update_cov:
        # Λ' = (1−α)V⁻¹ + αH; at α = 1 this skips forming V⁻¹.
        Linv = solve_triangular(state.chol, eye, lower=True)
        Lam = jnp.where(alpha < 1.0, (1.0 - alpha) * (Linv.T @ Linv) + alpha * H, H)
        R = jnp.where(alpha < 1.0, _spd_chol(Lam), RH)
    else:
        R = RH
    mean = state.mean + alpha * cho_solve((R, True), sums.grad) if update_mean else state.mean
    if update_cov:
        Rinv = solve_triangular(R, eye, lower=True)
        chol = _spd_chol(Rinv.T @ Rinv)  # V' = Λ'⁻¹; an M×M step, not in the O(N·M²) path
    else:
        chol = state.chol
    return State(mean, chol), clipped


def state_distance(a: State, b: State) -> float:
    return float(jnp.linalg.norm(a.mean - b.mean) + jnp.linalg.norm(a.chol @ a.chol.T - b.chol @ b.chol.T))


class SafeguardedAscent:
    """Runs natural-gradient steps that never lower the VLB.

    A proposal is accepted when its VLB is not below the current one (up to rounding);
    otherwise the step size is halved and the proposal recomputed (a backtrack), up to
    ``max_halvings`` times.  After a successful damped step the size doubles back towards 1.
    A 2-cycle (the iterate returning close to where it was two steps ago while still moving)
    halves the step size as well.  Counts of both events are kept.
    """

    def __init__(self, objective, max_halvings: int = 30):
        self.objective = objective
        self.max_halvings = max_halvings
        self.alpha = 1.0
        self.backtracks = 0
        self.cycles = 0
        self.clipped = 0
        self._history: list[State] = []

    def step(self, state: State, sums: Sums, update_mean=True, update_cov=True):
        """Return ``(new_state, new_sums, alpha_used)`` or ``None`` if no ascent step exists."""
        alpha = self.alpha
        slack = 1e-13 * max(1.0, abs(float(sums.vlb)))
        for _ in range(self.max_halvings + 1):
            prop, clipped = natural_step(state, sums, alpha, update_mean, update_cov)
            new = self.objective.sums(prop)
            v = float(new.vlb)
            if np.isfinite(v) and v >= float(sums.vlb) - slack and bool(jnp.all(jnp.isfinite(prop.chol))):
                self.clipped += int(clipped)
                self._cycle_check(prop, state)
                used = alpha
                self.alpha = min(1.0, 2.0 * self.alpha) if alpha == self.alpha else self.alpha
                return prop, new, used
            self.backtracks += 1
            alpha *= 0.5
            self.alpha = alpha
        return None

    def _cycle_check(self, new: State, cur: State):
        hist = self._history
        hist.append(cur)
        if len(hist) > 2:
            hist.pop(0)
        if len(hist) == 2:
            back = state_distance(new, hist[0])
            moved = state_distance(new, cur)
            if moved > 1e-6 and back < 1e-3 * moved:
                self.cycles += 1
                self.alpha = 0.5 * self.alpha
