"""What every engine shares: the result record, the clock, and the safeguarded
natural-gradient (fixed-point) step of Sheth & Khardon (2016)."""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from gpvi._batching import map_latents
from gpvi._linalg import lower_gram, tri_inv
from gpvi.objective import Objective, State, Sums
from gpvi.objective.newton import coupled_direction
from gpvi.objective.state import per_latent_products
from gpvi._watchdog import paused
from gpvi._compile import jit


@dataclasses.dataclass
class EngineResult:
    """Outcome of one engine run.

    ``trace`` is an (iterations + 1, 2) array of (seconds since start, VLB), first row at the
    starting state.  ``backtracks`` counts rejected (VLB-lowering) steps that were damped,
    ``cycles`` counts detected 2-cycles of the fixed-point map, ``clipped`` counts steps whose
    precision used γ_i = −λ_i clipped at 0 (Sheth & Khardon 2016, §4), ``evaluations`` counts
    passes over the data.  ``extras`` holds engine-specific numbers (e.g. the Laplace
    approximation's log marginal likelihood, the dual objective).  ``gap`` is the estimated
    distance ``VLB* − VLB`` to the optimum in nats at ``state`` (see :func:`estimated_gap`; the
    duality gap for the dual engine where strong duality holds; NaN where not estimated).
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
    clipped: int = 0
    extras: dict = dataclasses.field(default_factory=dict)
    gap: float = float("nan")


@dataclasses.dataclass(frozen=True)
class Progress:
    """What an ``on_state(model, state, progress)`` hook is told with each state it sees.

    ``iteration``: the engine's iteration (or the hyperparameter search's round) that produced
    the state; ``vlb``: the VLB there (nats, summed over the data; for a stochastic engine the
    full-data VLB where the data are in memory, else the epoch's mean minibatch estimate);
    ``seconds``: since the start of the engine run (of the fit, for search rounds);
    ``round``: ``None`` inside an engine run, the search round's number (from 1) when the
    hyperparameter search reports a round.
    """

    iteration: int
    vlb: float
    seconds: float
    round: int | None = None


#: The message of an engine run that an ``on_state`` hook stopped (it returned True).
STOPPED = "stopped by on_state"


def check_on_state(on_state):
    """``on_state`` itself, after checking that it is None or callable."""
    if on_state is not None and not callable(on_state):
        raise ValueError(f"on_state must be callable as on_state(model, state, progress) or None, got {on_state!r}")
    return on_state


def call_on_state(on_state, model, state, progress: Progress) -> bool:
    """Call ``on_state(model, state, progress)`` with the fit's watchdog paused; True when it
    asks the fit to stop (returns True)."""
    with paused():
        return on_state(model, state, progress) is True


class Clock:
    """Records (seconds, VLB) per iteration, forwards it to an optional ``callback(iteration,
    vlb, seconds)``, and shows each state to an optional ``on_state(model, state, progress)``
    hook (:class:`Progress`; ``model`` is the objective's).  :attr:`stopped` turns True when
    the hook returns True: the engine then ends its run with the message :data:`STOPPED`."""

    def __init__(self, callback=None, on_state=None, model=None):
        self.t0 = time.perf_counter()
        self.rows: list[tuple[float, float]] = []
        self.callback = callback
        self.on_state = check_on_state(on_state)
        self.model = model
        self.stopped = False

    def tick(self, vlb, iteration, state=None) -> bool:
        """Record one iteration; ``state`` is shown to the hook.  Returns :attr:`stopped`."""
        vlb = float(vlb)  # block on JAX's async dispatch first, so the time is the VLB's time
        t = time.perf_counter() - self.t0
        self.rows.append((t, vlb))
        if self.callback is not None:
            with paused():
                self.callback(iteration, float(vlb), t)
        if self.on_state is not None and state is not None and not self.stopped:
            self.stopped = call_on_state(self.on_state, self.model, state, Progress(int(iteration), vlb, t))
        return self.stopped

    @property
    def watching(self) -> bool:
        """Whether a hook wants the states (engines that must build a state to show it skip
        that work otherwise)."""
        return self.on_state is not None

    @property
    def trace(self):
        return np.asarray(self.rows, dtype=np.float64).reshape(-1, 2)


def stopped_at_start(objective, state: State, vlb, clock: Clock, extras=None) -> EngineResult:
    """The result of a run whose ``on_state`` hook stopped it at its starting ``state``."""
    return EngineResult(state, float(vlb), 0, False, STOPPED, clock.trace, evaluations=objective.num_evaluations,
                        extras=dict(extras or {}), gap=final_gap(objective, state))


def converged_change(new, old, tol):
    """|ΔVLB| ≤ tol · max(1, |VLB|): a statement about speed, used only for inner loops (Newton
    on the mean in fpb) and the hyperparameter driver; engines stop on :func:`estimated_gap`."""
    return abs(new - old) <= tol * max(1.0, abs(new))


# The certified stopping rule: an engine stops when its estimated gap VLB* − VLB is at most
# GAP_FRACTION · tol · max(1, |VLB|) nats (or the user's absolute ``tol_nats``).  With the
# fraction 0.1 any two engines that stop this way agree to tol relative with room to spare.
GAP_FRACTION = 0.1


def gap_threshold(vlb: float, tol: float, tol_nats: float | None = None) -> float:
    """Largest estimated gap (nats) at which an engine may stop and report ``converged``."""
    if tol_nats is not None:
        return float(tol_nats)
    return GAP_FRACTION * tol * max(1.0, abs(float(vlb)))


def transposed(X):
    """``Xᵀ`` as a copy, for the left operand of a product: XLA:CPU runs ``X.T @ Y`` (a dot
    contracting its left operand's rows) about 2× slower than the same product on a copied
    transpose (2-core AMD EPYC, d = 1233: 37 against 18 ms; the copy costs < 1 ms).  The
    barrier keeps XLA from folding the copy back into the dot."""
    return jax.lax.optimization_barrier(X.T)


def _gap_from_factor(state: State, grad, RH, trSV=None):
    """See :func:`estimated_gap`; ``RH`` is the reversed Cholesky factor of ``H = I − S``."""
    z = solve_triangular(RH, grad[::-1], lower=True)  # RH⁻¹ J g, so zᵀz = gᵀ H⁻¹ g
    return _clean_gap(0.5 * (z @ z) + _covariance_gap(state, RH, trSV))


def _covariance_gap(state: State, RH, trSV=None):
    """The covariance's share of :func:`estimated_gap`, ``½ [tr(H V) − log det(H V) − d]``.

    ``tr(H V) = tr V − tr(S V)``, with ``tr(S V) = Σ λ_i a_iᵀ V a_i`` from the data pass
    (:attr:`gpvi.objective.Sums.trSV`) when given: O(d²) instead of the d×d×d product
    ``‖RHᵀ J L‖²_F`` (USPS, three latents of d = 1233: 99 ms a gap estimate otherwise)."""
    d = state.mean.shape[-1]
    if trSV is None:
        B = transposed(RH) @ state.chol[::-1]  # tr(H V) = ‖RHᵀ J L‖²_F
        trHV = jnp.sum(B * B)
    else:
        trHV = jnp.sum(state.chol * state.chol) - trSV
    logdet_HV = 2.0 * (jnp.sum(jnp.log(jnp.diag(RH))) + jnp.sum(jnp.log(jnp.abs(jnp.diag(state.chol)))))
    return 0.5 * (trHV - logdet_HV - d)


def _clean_gap(gap):
    # tr(HV) − log det(HV) − d ≥ 0 exactly; rounding can leave −1e-13·d.  Not finite (H not
    # positive definite: far from the optimum of a likelihood that is not log-concave): +inf.
    return jnp.where(jnp.isfinite(gap), jnp.maximum(gap, 0.0), jnp.inf)


@jit
def estimated_gap(state: State, grad, S, trSV=None):
    if grad.ndim == 2:  # Q latent blocks (gpvi.models.multilatent): the gaps of the blocks add up
        gaps, RH = map_latents(_estimated_gap, state, grad, S, trSV)
        return jnp.sum(gaps), RH
    return _estimated_gap(state, grad, S, trSV)


def _estimated_gap(state: State, grad, S, trSV=None):
    """Estimated distance ``VLB* − VLB`` (nats) from ``state`` to the optimum, and the reversed
    Cholesky factor of ``H = I − S`` (see :func:`precision_chol`) it used.

    It is the gain that one undamped natural-gradient (fixed-point) step predicts, i.e. the
    maximum of the model that is quadratic in the mean and linear in the marginal variances
    (the λ_i held fixed) over ``(m, V)``:

        gap = ½ gᵀ H⁻¹ g + ½ [tr(H V) − log det(H V) − d],

    the Newton decrement of the mean (whose exact Hessian at fixed V is −H) plus the KL-like
    distance between ``V`` and the fixed-point covariance ``H⁻¹``.  It is zero exactly at a
    stationary point (g = 0 and V⁻¹ = I − S are the optimality conditions), exact for Gaussian
    likelihoods (E_i quadratic in m_i, linear in v_i), and asymptotically exact near the optimum
    otherwise (the neglected terms are of third order in the distance).  ``inf`` where ``H`` is
    not positive definite.  ``trSV``: ``tr(S V)`` from the data pass, if known (see
    :func:`_covariance_gap`).
    """
    RH = reversed_chol(jnp.eye(S.shape[0], dtype=S.dtype) - S)
    return _gap_from_factor(state, grad, RH, trSV), RH


def stalled_message(gap: float, vlb) -> str:
    """Why an engine stopped when no step size raised the VLB and the gap was not certified."""
    return (f"no step size increases the VLB (stopped at the best state found; estimated gap "
            f"{gap:.3g} nats at VLB {float(vlb):.10g})")


# finite_start shrinks the starting covariance by these factors of its Cholesky factor (so the
# covariance by their squares), in turn, until the VLB is finite.
START_SCALES = tuple(10.0 ** -k for k in range(1, 9))


def finite_start(objective, state: State, sums: Sums):
    """``(state, sums, scale)``: ``state`` itself (``scale = 1``) when its VLB is finite, else the
    first of ``State(mean, s·chol)``, ``s`` in :data:`START_SCALES`, whose VLB is.

    The prior is the usual starting state, and under a large kernel or prior variance its
    expected log-likelihood can overflow although the problem is well posed: a Poisson or
    exponential likelihood needs ``E[e^f] = e^{m + v/2}``, infinite in float64 once the prior
    variance ``v`` exceeds about 1400.  A narrower Gaussian at the same mean is a valid start
    whose VLB is finite.  ``scale`` is ``None`` (and the state unchanged) when none was.
    """
    if np.isfinite(float(sums.vlb)):
        return state, sums, 1.0
    for s in START_SCALES:
        cand = State(state.mean, state.chol * s)
        cand_sums = objective.sums(cand)
        if np.isfinite(float(cand_sums.vlb)):
            return cand, cand_sums, s
    return state, sums, None


#: The message of an engine run that :func:`finite_start` could not start.
NOT_FINITE_START = ("VLB is not finite at the starting state, nor with its covariance shrunk by up to "
                    f"{START_SCALES[-1] ** 2:g}")


def final_gap(objective, state: State) -> float:
    """:func:`estimated_gap` at ``state`` with a fresh pass over the data (for engines that do
    not form ``I − S`` in their iterations)."""
    sums = objective.sums(state)
    return objective_gap(objective, state, sums)


def objective_gap(objective, state: State, sums) -> float:
    """:func:`estimated_gap` at ``state`` from its sums, with the joint Newton direction where the
    objective's latent blocks are coupled."""
    if getattr(objective, "coupled", False):
        return coupled_target(objective, state, sums.grad, sums.S, sums.rows_h, sums.trSV)[2]
    return float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])


def reversed_chol(H):
    """Lower-triangular ``R`` with ``J H J = R Rᵀ``, ``J`` the order-reversing permutation.

    Then ``H = U Uᵀ`` with ``U = J R J`` upper triangular, so ``H⁻¹ = U⁻ᵀ U⁻¹`` has the
    *lower*-triangular factor ``U⁻ᵀ = J R⁻ᵀ J``: one Cholesky and one triangular inverse give
    the covariance factor of a precision, without forming ``H⁻¹`` and factorising it again.
    NaN when ``H`` is not positive definite.  ``H`` is symmetrised, ``(H + Hᵀ)/2``, by
    ``jnp.linalg.cholesky`` itself, after the flip (which commutes with it): the same numbers as
    symmetrising before the flip, with one pass over the matrix fewer.
    """
    return jnp.linalg.cholesky(flip(H), symmetrize_input=True)


def flip(X):
    return X[::-1, ::-1]


@jit
def precision_chol(S):
    """Reversed Cholesky factor (see :func:`reversed_chol`) of ``H = I − S``, the
    fixed-point target precision; NaN if H is not positive definite.  ``S`` (Q, d, d): one
    factor per latent block."""
    if S.ndim == 3:
        return map_latents(precision_chol, S)
    return reversed_chol(jnp.eye(S.shape[0], dtype=S.dtype) - S)


@jit
def precision_and_inverse(S):
    """``(RH, RH⁻¹)``: :func:`precision_chol` of ``S`` (Q, d, d) and the inverses of its factors
    (:func:`tri_inv`, per latent block).  The coupled-latent step needs ``H⁻¹`` applied to
    vectors many times (the conjugate gradients' preconditioner) and the covariance factor
    ``J RH⁻ᵀ J`` once; with the inverse factor both are products, where XLA:CPU runs a
    triangular solve of one vector about 10× slower than the product with the inverse (three
    blocks of d = 1233: 21 against 1.8 ms)."""
    RH = precision_chol(S)
    return RH, map_latents(tri_inv, RH)


@jit
def natural_step(state: State, grad, RH, alpha, update_mean=True, update_cov=True, direction=None, RH_inv=None,
                 S=None, S_state=None):
    """One natural-gradient step of size ``alpha`` on ``q(w) = N(m, V)``.

    With ``H = I − Σλ_i a_i a_iᵀ`` given by its reversed Cholesky factor ``RH``
    (:func:`precision_chol`; one factorisation serves both updates):
    ``Λ' = (1 − α) V⁻¹ + α H`` and ``m' = m + α Λ'⁻¹ ∇_m VLB``.  At ``α = 1`` this is exactly the
    fixed-point update ``V ← H⁻¹`` with a Newton step on the mean (Sheth & Khardon 2016,
    Eq. 8; DESIGN §2), the FPi step.  The flags restrict the step to the mean (Newton with
    V fixed) or to the covariance (FP with m fixed).  With Q latent blocks (mean (Q, d)) the
    step is taken in every block, with one step size: the VLB is one sum over all blocks.
    With ``direction`` (the joint Newton direction of coupled latent blocks) the mean moves to
    ``m + α d`` instead.  ``RH_inv``, the inverse of ``RH`` if already at hand
    (:func:`precision_and_inverse`), saves the triangular inverse of the full (α = 1) step.
    A damped covariance step factorises ``Λ' = I − ((1 − α) S_state + α S)``.  ``S``, the
    ``Σλ_i a_i a_iᵀ`` whose ``H = I − S`` ``RH`` factorises, saves it the product ``RH RHᵀ``
    that gives ``H`` back; ``S_state``, the state's own precision as ``V⁻¹ = I − S_state``
    (:func:`state_S`, known after every covariance step), saves it the triangular inverse of
    ``V``'s factor and its Gram product.  The other steps use neither: any array of the shape
    may stand in.

    The two flags are traced, not static: all four combinations share one compiled program
    (a fit that first needs the damped mean-only or covariance-only step, e.g. a second fit of
    a same-sized problem, compiles nothing new).
    """
    if grad.ndim == 2:
        if direction is not None and RH_inv is not None:
            return _coupled_natural_step(state, grad, RH, alpha, update_mean, update_cov, direction, RH_inv, S,
                                         S_state)
        return map_latents(lambda s_, g_, r_, d_, i_, S_, P_: _natural_step(s_, g_, r_, alpha, update_mean,
                                                                            update_cov, d_, i_, S_, P_),
                           state, grad, RH, direction, RH_inv, S, S_state)
    return _natural_step(state, grad, RH, alpha, update_mean, update_cov, direction, RH_inv, S, S_state)


def _coupled_natural_step(state: State, grad, RH, alpha, update_mean, update_cov, direction, RH_inv, S=None,
                          S_state=None):
    """:func:`_natural_step` of every latent block with the joint direction and ``RH⁻¹`` at hand
    (the coupled softmax step): the full step's covariance factor ``J RH⁻ᵀ J`` is taken on the
    stacked blocks at once, and only a damped covariance step (which factorises) goes block by
    block.  Mapping the whole step over the blocks copied each block of the state and of both
    factors out of their stacks in every step (XLA:CPU copies a static slice): 48 ms of copies
    per step on USPS 4-7-9, three blocks at d = 1233."""
    mean = jnp.where(update_mean, state.mean + alpha * direction, state.mean)

    def damped():
        return map_latents(lambda s_, g_, r_, S_, P_: _natural_step(s_, g_, r_, alpha, False, True, S=S_,
                                                                    S_state=P_).chol,
                           state, grad, RH, S, S_state)

    def full():
        return jnp.where(update_cov, _flipped_transpose(RH_inv), state.chol)

    chol = jax.lax.cond(jnp.logical_and(update_cov, alpha < 1.0), damped, full)
    return State(mean, chol)


def _flipped_transpose(RH_inv):
    """``J RH⁻ᵀ J`` of stacked factors (Q, d, d): the covariance factor of the full step."""
    return jnp.swapaxes(RH_inv, -1, -2)[:, ::-1, ::-1]


@jit
def state_S(chol):
    """The ``S`` with ``V⁻¹ = I − S`` of the covariance ``V = L Lᵀ`` given by its factor ``L``
    (d, d) or stacked factors (Q, d, d): the form of a state's precision that
    :func:`natural_step`'s damped covariance step takes as ``S_state``.  ``I − L⁻ᵀ L⁻¹``, by a
    triangular inverse and a Gram product; after a covariance step it is known without them
    (see :meth:`SafeguardedAscent._state_S`)."""
    if chol.ndim == 3:
        return map_latents(state_S, chol)
    return jnp.eye(chol.shape[-1], dtype=chol.dtype) - flip(lower_gram(flip(tri_inv(chol).T)))


def _natural_step(state: State, grad, RH, alpha, update_mean, update_cov, direction=None, RH_inv=None, S=None,
                  S_state=None):
    def damped():
        # Λ' = (1−α) V⁻¹ + α H = I − ((1−α) S_state + α S) with V⁻¹ = I − S_state, H = I − S; the
        # mean's Newton step then uses Λ' too.  V' = Λ'⁻¹ = (J R⁻ᵀ J)(J R⁻ᵀ J)ᵀ with R the
        # Cholesky factor of J Λ' J: one Cholesky and one triangular inverse, as in a full step,
        # once S_state is known (two blocks of d = 1 233: 0.25 s a step; 0.40 s from the factor)
        eye = jnp.eye(state.chol.shape[-1], dtype=state.chol.dtype)
        S_ = eye - flip(RH @ RH.T) if S is None else S
        P_ = state_S(state.chol) if S_state is None else S_state
        R = jnp.linalg.cholesky(eye - flip(damped_S(P_, S_, alpha)), symmetrize_input=True)
        return State(_mean_step(state, grad, R, alpha, update_mean, direction), flip(tri_inv(R).T))

    # a mean-only step keeps V: its Newton step uses H itself at any α
    return jax.lax.cond(jnp.logical_and(update_cov, alpha < 1.0), damped,
                        lambda: _undamped_step(state, grad, RH, alpha, update_mean, update_cov, direction, RH_inv))


def _mean_step(state: State, grad, R, alpha, update_mean, direction=None):
    """The mean's part of :func:`_natural_step` with the precision ``Λ'`` of the step given by its
    reversed factor ``R``: ``m + α Λ'⁻¹ g = m + α J (R Rᵀ)⁻¹ J g``, or ``m + α d`` along a joint
    ``direction``; ``m`` where the mean is not updated."""
    if direction is not None:
        return jnp.where(update_mean, state.mean + alpha * direction, state.mean)
    return jax.lax.cond(update_mean, lambda: state.mean + alpha * cho_solve((R, True), grad[::-1])[::-1],
                        lambda: state.mean)


@jit
def target_and_step(state: State, grad, S, alpha, update_mean=True, update_cov=True, trSV=None):
    """:func:`precision_chol` of ``S``, the :func:`estimated_gap` at ``state`` and the
    :func:`natural_step` from it, in one compiled call (the first proposal of every iteration;
    in an fpi iteration at N = 20 000, d = 200 separate calls took 1.7 ms between the passes).
    Returns ``(RH, proposal, gap)``.

    The proposal is that of an undamped step: a covariance step of size ``alpha < 1`` (which
    factorises ``(1 − α) V⁻¹ + α H`` again) is left to :func:`natural_step`, whose program a fit
    compiles only once it damps such a step (see :meth:`SafeguardedAscent._target`)."""
    RH = precision_chol(S)
    if grad.ndim == 2:
        gap = jnp.sum(map_latents(_gap_from_factor, state, grad, RH, trSV))
        prop = map_latents(lambda s_, g_, r_: _undamped_step(s_, g_, r_, alpha, update_mean, update_cov),
                           state, grad, RH)
    else:
        gap = _gap_from_factor(state, grad, RH, trSV)
        prop = _undamped_step(state, grad, RH, alpha, update_mean, update_cov)
    return RH, prop, gap


def _undamped_step(state: State, grad, RH, alpha, update_mean, update_cov, direction=None, RH_inv=None):
    """:func:`_natural_step` where the covariance step, if taken, has size 1 (``V ← H⁻¹``): its
    branch without the damped factorisation.  For a damped covariance step (``alpha < 1``),
    which :func:`target_and_step`'s caller takes with :func:`natural_step` instead, the
    triangular inverse is skipped and the covariance left as it was.  ``RH_inv``, if given, is
    ``RH⁻¹`` (then no triangular inverse at all)."""
    mean = _mean_step(state, grad, RH, alpha, update_mean, direction)
    inverse = (lambda: tri_inv(RH)) if RH_inv is None else (lambda: RH_inv)
    chol = jax.lax.cond(jnp.logical_and(update_cov, alpha >= 1.0), lambda: flip(inverse().T), lambda: state.chol)
    return State(mean, chol)


@jit
def _coupled_gap(state: State, RH, mean_gain, trSV=None):
    """:func:`estimated_gap` of Q coupled latent blocks: the gain ``mean_gain`` of the joint
    Newton step of the means (:meth:`gpvi.objective.Objective.newton_direction`) plus the
    blocks' covariance shares."""
    # products and sums only (no LAPACK call): batched, not mapped (see per_latent_products)
    return _clean_gap(mean_gain + jnp.sum(per_latent_products(_covariance_gap, True, state, RH, trSV)))


@jit
def _in_memory_coupled_target(model, chunks, proj, state: State, grad, S, rows_h, trSV, rtol, alpha,
                              update_mean, update_cov):
    """:func:`coupled_target` of an in-memory :class:`~gpvi.objective.Objective` in one compiled
    call: the factors, the joint direction (:func:`gpvi.objective.newton.coupled_direction`) and
    the gap, with whether every factor is finite (three calls and two waits before: 2.0 ms of a
    6.3 ms softmax iteration on iris, whose parts take 0.8 ms), and the undamped proposal
    (:func:`_coupled_natural_step` at step size ``alpha`` with a covariance step, if any, of size
    1).  Where a factor is not finite the direction's conjugate gradients stop at once (their
    residual is NaN) and the caller drops it."""
    RH = precision_chol(S)
    RH_inv = _preconditioner_factors(state, RH, update_cov)
    d, mean_gain = coupled_direction(model, chunks, proj, state, grad, RH_inv, rows_h, rtol=rtol)
    # (a cond, not a where: the reversed transpose of (Q, d, d) factors is a strided copy, 20 ms at
    # three latents of d = 1 233, which a mean-only step does not need)
    prop = State(jnp.where(update_mean, state.mean + alpha * d, state.mean),
                 jax.lax.cond(update_cov, lambda: _flipped_transpose(RH_inv), lambda: state.chol))
    return RH, d, _coupled_gap(state, RH, mean_gain, trSV), RH_inv, jnp.all(jnp.isfinite(RH)), prop


@jit
def _preconditioner_factors(state: State, RH, update_cov):
    """The factors ``P`` (Q, d, d) of the coupled direction's preconditioner (see
    :func:`coupled_target`): ``RH⁻¹`` for a step that moves the covariance, else ``J Lᵀ J`` of
    every block's covariance factor ``L`` (preconditioner ``V_q``), NaN where some ``RH`` is not
    finite so that the iterations stop at once, as with ``RH⁻¹``."""
    return jax.lax.cond(update_cov, lambda: map_latents(tri_inv, RH),
                        lambda: jnp.where(jnp.all(jnp.isfinite(RH)), _flipped_transpose(state.chol), jnp.nan))


def coupled_target(objective, state: State, grad, S, rows_h=None, trSV=None, step=(1.0, False, False)):
    """``(RH, d, gap, P, proposal)`` for an objective whose latent blocks the likelihood
    couples (``objective.coupled``): the per-latent precision factors, the joint Newton direction
    of the means, the estimated gap with the mean's share ``½ gᵀ d``, the preconditioner's
    factors ``P`` and, for an in-memory objective, the undamped
    :func:`natural_step` of ``step = (alpha, update_mean, update_cov)`` along ``d`` (``None``
    otherwise: the caller takes the step).  ``d`` is ``None`` (and the gap ``inf``) when some
    ``I − S_q`` is not positive definite.

    The direction's conjugate gradients are preconditioned with ``H_q⁻¹`` through the inverse
    factors ``P = RH⁻¹`` (:func:`precision_and_inverse`) where the step moves the covariance,
    which needs them anyway (``V' = H⁻¹`` has the factor ``J RH⁻ᵀ J``).  A mean-only step (the
    paper's order, right after the covariance step ``V ← H⁻¹``) is preconditioned with ``V_q``
    itself: ``P = J Lᵀ J`` from the covariance factors ``L``, and no triangular inverse (USPS
    4-7-9, three blocks of d = 1 233: 130 ms of a 330 ms call; the per-class fit's 78 mean-only
    targets took 9.1 s instead of 12.4 s).  ``P`` is what natural_step needs with ``d``.

    Returning the proposal from the same program means a fit whose coupled steps are never
    damped does not compile :func:`natural_step` at all (1.0 s of XLA compilation on USPS 4-7-9,
    three latents of d = 1 233)."""
    if type(objective).newton_direction is Objective.newton_direction:  # the in-memory objective: one call
        RH, d, gap, RH_inv, finite, prop = _in_memory_coupled_target(
            objective.model, objective.chunks, objective.proj, state, grad, S, rows_h, trSV, objective.newton_rtol,
            *step)
        if not bool(finite):
            return RH, None, float("inf"), None, None
        return RH, d, float(gap), RH_inv, prop
    RH = precision_chol(S)
    RH_inv = _preconditioner_factors(state, RH, step[2])
    if not is_finite(RH):
        return RH, None, float("inf"), None, None
    d, mean_gain = objective.newton_direction(state, grad, RH_inv, rows_h)
    return RH, d, float(_coupled_gap(state, RH, mean_gain, trSV)), RH_inv, None


@jit
def state_from_precision_chol(mean, R):
    """``State(mean, chol V)`` with ``V = (R Rᵀ)⁻¹`` for a lower-triangular precision factor
    ``R`` in the usual order (the dual and Laplace engines' final states)."""
    Rinv = tri_inv(R)
    V = transposed(Rinv) @ Rinv  # a d×d step, not in the O(N·d²) data path
    return State(mean, jnp.linalg.cholesky(0.5 * (V + V.T)))


def is_finite(x) -> bool:
    # NumPy on the (d, d) result: not worth an XLA compilation per problem size
    return bool(np.all(np.isfinite(np.asarray(x))))


def state_distance(a: State, b: State) -> float:
    """A cheap distance between states (means and covariance factors); in NumPy, since an
    O(d²) reduction is not worth an XLA compilation per problem size."""
    same_chol = a.chol is b.chol  # a mean-only step keeps the factor object (SafeguardedAscent._try)
    return float(np.linalg.norm(np.asarray(a.mean) - np.asarray(b.mean))
                 + (0.0 if same_chol else np.linalg.norm(np.asarray(a.chol) - np.asarray(b.chol))))


# Halvings of a covariance-only step towards a clipped target (γ clipped at 0) before that step is
# given up for the iteration (see SafeguardedAscent._halving).
CLIPPED_HALVINGS = 4

# With ``hold_after_damping``, a step size that had to be halved is kept for this many steps that
# pass at once before it is doubled again.
HOLD_STEPS = 1


@jit
def damped_S(S_state, S, alpha):
    """``S_state`` after a damped covariance step of size ``alpha`` towards ``I − S``."""
    return (1.0 - alpha) * S_state + alpha * S


class SafeguardedAscent:
    """Runs natural-gradient steps that never lower the VLB.

    A proposal is accepted when its VLB is not below the current one (up to rounding);
    otherwise the step size is halved and the proposal recomputed (a backtrack), up to
    ``max_halvings`` times.  After a successful damped step the size doubles back towards 1.
    A 2-cycle (the iterate returning close to where it was two steps ago while still moving)
    halves the step size as well.  Counts of both events are kept.
    """

    def __init__(self, objective, max_halvings: int = 30, clip_gamma: str = "auto"):
        if clip_gamma not in ("auto", "always"):
            raise ValueError(f"clip_gamma must be 'auto' or 'always', got {clip_gamma!r}")
        self.objective = objective
        self.clip_gamma = clip_gamma
        self.max_halvings = max_halvings
        self.alpha = 1.0
        self.backtracks = 0
        self.cycles = 0
        self.clipped = 0
        self._history: list[State] = []
        self.gap = float("inf")  # estimated gap at the state of the last step() call
        self.direction = None  # joint Newton direction of coupled latents at that state (or None)
        self.inverse = None  # with it, the inverses of the precision factors (precision_and_inverse)
        # keep a damped step size for the next step instead of doubling it at once (a map that
        # needs α = 1/4 every step otherwise wastes one rejected proposal at 1/2 per step)
        self.hold_after_damping = False
        self._held = HOLD_STEPS
        self.certified = False  # the last step() stopped because that gap was small enough
        # whether the last target fell back to γ clipped at 0 (clip_gamma="auto": its step size is
        # not the unclipped map's)
        self.target_clipped = False
        self.target_S = None  # the S whose I − S the last target factorised (clipped or not)
        # (factor, S_state) of the last covariance this ascent made or looked up: V⁻¹ = I − S_state
        # (see _state_S), the damped covariance step's input, known after every covariance step
        self._known = None

    def _state_S(self, state: State):
        """``S_state`` of ``state`` (``V⁻¹ = I − S_state``, :func:`state_S`) for a damped
        covariance step.  It is known, without a triangular inverse, where ``state``'s covariance
        factor is the one an accepted step of this ascent produced (``I − S`` of the target after
        a full step, the mixture after a damped one; a mean-only step keeps the factor object) or
        the one looked up last (the halvings of one step share it)."""
        known = self._known
        if known is not None and known[0] is state.chol:
            return known[1]
        S_state = state_S(state.chol)
        self._known = (state.chol, S_state)
        return S_state

    def _S_state_arg(self, state: State, damped: bool):
        """``natural_step``'s ``S_state`` argument: the state's own for a damped covariance step;
        elsewhere unused, and ``target_S`` stands in, so that every call has one argument
        structure (one compiled program) and no step pays for a lookup it does not need."""
        return self._state_S(state) if damped else self.target_S

    def _target(self, state: State, sums: Sums, alpha, update_mean, update_cov):
        """``(RH, proposal, alpha)``: the target factor, the proposal at the step size
        ``alpha`` (``None`` when it was not computed) and that step size — 1 instead of a
        damped ``alpha`` when the target is the first unclipped one after clipped ones.
        Records :func:`estimated_gap` at ``state`` in ``self.gap``."""
        if self.clip_gamma == "always":
            # Sheth & Khardon (2016, §4): every γ_i < 0 is replaced by 0 in every step.
            # (every target is the clipped map here: the usual step-size rules apply, not the
            # special handling of a clipped target between unclipped ones)
            self.clipped += 1
            self.gap = float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
            self.target_S = self.objective.sums(state, clip_gamma=True).S
            return precision_chol(self.target_S), None, alpha
        was_clipped, self.target_clipped = self.target_clipped, False
        self.direction = self.inverse = None
        self.target_S = sums.S
        # the compiled targets return the undamped proposal; a damped covariance step is left to
        # _try (natural_step), so that a fit that never damps one does not compile that branch
        damped = bool(update_cov and alpha < 1.0)
        if update_mean and getattr(self.objective, "coupled", False):
            RH, d, gap, self.inverse, prop = coupled_target(self.objective, state, sums.grad, sums.S, sums.rows_h,
                                                            sums.trSV, step=(alpha, update_mean, update_cov))
            self.gap, self.direction = gap, d
            if d is not None and (prop is None or damped):
                prop = natural_step(state, sums.grad, RH, alpha, update_mean, update_cov, d, self.inverse,
                                    self.target_S, self._S_state_arg(state, damped))
        else:
            RH, prop, gap = target_and_step(state, sums.grad, sums.S, alpha, update_mean, update_cov, sums.trSV)
            self.gap = float(gap)
            if damped:
                prop = None
        if not is_finite(RH):
            # I − S is not positive definite: some γ_i = −λ_i < 0 (a likelihood that is not
            # log-concave, e.g. Student-t, far from the optimum).  Use γ clipped at 0
            # (Sheth & Khardon 2016, §5) for this step; at the optimum I − S = V⁻¹ is
            # positive definite, so the fixed point itself is unchanged.
            self.clipped += 1
            self.target_clipped = True
            self.target_S = self.objective.sums(state, clip_gamma=True).S
            return precision_chol(self.target_S), None, alpha
        if was_clipped and alpha < 1.0:
            # The step size was damped for the clipped map (a heuristic direction, Sheth & Khardon
            # 2016 §5); the first unclipped step starts again at full size.  Carried over, a size of
            # 3e-8 took 22 doublings back to 1 on a sparse Student-t GP (136 passes; 46 without).
            return RH, None, 1.0
        return RH, prop, alpha

    def _try(self, state, sums, RH, alpha, update_mean, update_cov, prop=None):
        if prop is None:
            d, inverse = self.direction, self.inverse
            if d is None and not update_mean and update_cov and alpha < 1.0 and getattr(self.objective, "coupled", False):
                # A damped covariance-only step of coupled latents takes the program of the damped
                # joint steps (given a direction and RH⁻¹), not a second one (0.5 s of compilation
                # in iris's first fit): that program's damped branch uses neither, so a zero
                # direction and RH standing in for RH⁻¹ give the same step.
                d, inverse = jax.device_put(np.zeros(np.shape(state.mean))), RH
            prop = natural_step(state, sums.grad, RH, alpha, update_mean, update_cov, d, inverse, self.target_S,
                                self._S_state_arg(state, update_cov and alpha < 1.0))
        if not update_cov:
            # the same values, as the same object: its S_state stays known, and it is not checked
            # or compared again (is_finite, state_distance: O(d²) NumPy passes)
            prop = State(prop.mean, state.chol)
        new = self.objective.sums(prop)
        v = float(new.vlb)
        slack = 1e-13 * max(1.0, abs(float(sums.vlb)))
        ok = np.isfinite(v) and v >= float(sums.vlb) - slack and (not update_cov or is_finite(prop.chol))
        if not ok:
            return None
        if update_cov and alpha >= 1.0:
            self._known = (prop.chol, self.target_S)  # V' = (I − S)⁻¹
        elif update_cov and self._known is not None and self._known[0] is state.chol:
            self._known = (prop.chol, damped_S(self._known[1], self.target_S, alpha))
        return prop, new

    def _halving(self, state, sums, update_mean, update_cov, alpha, stop_below=None):
        RH, prop, alpha = self._target(state, sums, alpha, update_mean, update_cov)
        if stop_below is not None and self.gap <= stop_below:
            self.certified = True
            return None
        # a clipped covariance target (a heuristic) that fails at 1/2^CLIPPED_HALVINGS of the step
        # is abandoned for this step rather than halved towards nothing, one pass per halving
        # (sparse Student-t GP: 24 rejected proposals, then steps of size 1e-8 that did nothing)
        halvings = CLIPPED_HALVINGS if self.target_clipped and update_cov and not update_mean else self.max_halvings
        for _ in range(halvings + 1):
            out = self._try(state, sums, RH, alpha, update_mean, update_cov, prop)
            if out is not None:
                return out[0], out[1], alpha
            self.backtracks += 1
            alpha, prop = 0.5 * alpha, None
        return None

    def step(self, state: State, sums: Sums, update_mean=True, update_cov=True, stop_below=None):
        """Return ``(new_state, new_sums, alpha_used)`` or ``None`` if no ascent step exists.

        ``self.gap`` is then the :func:`estimated_gap` at ``state``.  With ``stop_below``, a
        state whose gap is at most that many nats is certified instead of stepped from:
        ``self.certified`` is set and ``(state, sums, 1.0)`` returned, saving the pass that
        would evaluate the proposal.

        A rejected joint (mean + covariance) step is first retried in the FPb order — a full
        fixed-point step on V, then a backtracked Newton step on m from the new V — because
        damping the precision only halves its excess per step, which is slow to recover from
        a collapsed covariance; only if that fails is the joint step damped.
        """
        alpha = self.alpha
        self.certified = False
        if update_mean and update_cov:
            RH, prop, alpha = self._target(state, sums, alpha, True, True)
            if stop_below is not None and self.gap <= stop_below:
                self.certified = True
                return state, sums, 1.0
            out = self._try(state, sums, RH, alpha, True, True, prop)
            if out is not None:
                self._cycle_check(out[0], state)
                self.alpha = min(1.0, 2.0 * alpha)
                return out[0], out[1], alpha
            self.backtracks += 1
            cov = self._halving(state, sums, False, True, 1.0)
            if cov is not None and cov[2] == 1.0:
                mid, mid_sums, _ = cov
                mean = self._halving(mid, mid_sums, True, False, 1.0)
                new_state, new_sums = (mean[0], mean[1]) if mean is not None else (mid, mid_sums)
                self._cycle_check(new_state, state)
                return new_state, new_sums, 1.0
            out = self._halving(state, sums, True, True, 0.5 * alpha)
        else:
            out = self._halving(state, sums, update_mean, update_cov, alpha, stop_below)
            if self.certified:
                return state, sums, 1.0
        if out is None:
            return None
        self._cycle_check(out[0], state)
        if self.target_clipped:
            self.alpha = out[2]  # kept while the target is clipped (back to 1 when it no longer is)
        elif self.hold_after_damping and out[2] < alpha:
            self.alpha, self._held = out[2], 0  # the size that passed, kept for a while
        elif self.hold_after_damping and self._held < HOLD_STEPS:
            self._held += 1
        else:
            self.alpha = min(1.0, 2.0 * out[2])
        return out

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
