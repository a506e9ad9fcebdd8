"""Laplace approximation: Newton on the mode of the whitened posterior (GPML Ch. 3 style).

In the whitened coordinates of :mod:`gpvi.models` (prior ``N(0, I)``) the unnormalised log
posterior is

    ``Ψ(w) = Σ_i log p(y_i | f_i) − ½|w|²``,  ``f_i = a_i·w + b_i + offset_i``.

Newton's method with a backtracking line search on Ψ finds the mode ``ŵ``; the Laplace
approximation is ``q(w) = N(ŵ, H⁻¹)`` with ``H = I − Σ_i h_i a_i a_iᵀ`` and the point
derivatives ``g_i = ∂log p/∂f``, ``h_i = ∂²log p/∂f²`` at ``f̂_i``, obtained by autodiff of
``likelihood.log_prob`` (so any twice-differentiable likelihood works).  The approximate log
marginal likelihood is ``log p(y) ≈ Ψ(ŵ) − ½ log|H|`` (GPML Eq. 3.32; invariant under the
linear whitening).  All sums over data run chunk by chunk in a jitted ``lax.scan`` like
:meth:`gpvi.objective.Objective.sums`.

Three uses:

- the engine :func:`run` (``gpvi.fit(..., engine="laplace")``): its result's ``vlb`` is the
  *true* VLB of ``N(ŵ, H⁻¹)`` so it is comparable with the variational engines; the Laplace
  log marginal is in ``extras["log_marginal"]``;
- the initialiser of the variational engines (``gpvi.fit(..., init="laplace")``, Sheth et
  al. 2015, §5);
- the baseline of Sheth et al. (2015), whose hyperparameters are learned on the Laplace
  log marginal: :func:`laplace_log_marginal` is differentiable in the model's
  hyperparameters (the mode is found without autodiff, then one Newton step from it is taken
  *inside* the differentiated function; at the fixed point that step's derivative is the
  implicit derivative ``dŵ/dθ = H⁻¹ ∂g/∂θ`` of the mode, i.e. the implicit terms of GPML
  Algorithm 5.1).

Notes
-----
- **Non-log-concave likelihoods** (Student-t): ``h_i`` can be positive and ``H`` indefinite
  away from the mode.  The Newton matrix then uses ``min(h_i, 0)`` (a Fisher-like safeguard;
  the gradient, hence the mode, is unchanged) and the line search keeps every step an ascent
  step.  At the mode the covariance and the log marginal use the exact ``h_i`` (``H`` is
  positive definite at a strict local maximum); only if it is not does the engine fall back
  to the clipped matrix, reported as ``extras["hessian"] == "clipped"``.
- **Sparse GP**: the Laplace approximation is that of the projected (subset-of-regressors)
  model ``f_i = a_i·w + b_i``; the conditional variances ``c_i`` are ignored in the mode
  search and in the log marginal.  They do enter the VLB reported for the resulting state.
- **Hyperparameters learned on the Laplace log marginal** are checked for self-consistency
  (:func:`check_learned_hyperparameters`): on (nearly) separable data the Laplace evidence
  rewards an ever larger latent scale, at which the approximation is useless; such a fit is
  refused instead of being reported as converged.
- **Likelihoods without a usable second derivative** (``Laplace``: ``h = 0`` almost
  everywhere) have no Laplace approximation; they raise a ``ValueError`` pointing to the
  variational engines, which differentiate the Gaussian expectation instead.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

from gpvi.likelihoods import Laplace
from gpvi.models.base import check_X
from gpvi.objective import DEFAULT_CHUNK, Chunks, Objective, State, assemble_gram, block_gram, block_vecmat, chunk_projection, make_chunks, num_blocks, zero_gram
from gpvi.engines.registry import Engine
from gpvi.engines._common import STOPPED, Clock, EngineResult, stopped_at_start, is_finite, converged_change, state_from_precision_chol
from gpvi._compile import jit

__all__ = ["check_learned_hyperparameters", "find_mode", "laplace_log_marginal", "laplace_log_marginal_at", "run"]

_ARMIJO = 1e-4
_MAX_HALVINGS = 30


# ---- point derivatives and their sums over chunks ---------------------------------------
def _point_derivatives(lik, y, f):
    """``(log p, g, h)`` elementwise for 1-D ``y, f``.

    ``log_prob`` is elementwise in ``f``, so its Hessian in ``f`` is diagonal and the
    directional derivative of the gradient along the ones vector is exactly that diagonal.
    """

    def total(ff):
        return jnp.sum(lik.log_prob(y, ff))

    g, h = jax.jvp(jax.grad(total), (f,), (jnp.ones_like(f),))
    return lik.log_prob(y, f), g, h


def _chunk_terms(model, prior, ch, pr, w, cached, blocks, derivatives, clip):
    """Sums over one chunk: ``Σ log p`` and, with ``derivatives``, ``Σ g_i a_i``,
    ``Σ h_i a_i a_iᵀ`` (h clipped at ≤ 0 with ``clip``) and two counts: rows with
    ``h_i > 0`` and rows with ``h_i ≠ 0``.  ``c_i`` is ignored (see module notes)."""
    A, b, _ = chunk_projection(model, prior, ch, pr, cached, blocks)
    f = block_vecmat(w, A) + b + ch.offset
    keep = ch.mask > 0
    if not derivatives:
        return jnp.sum(jnp.where(keep, model.likelihood.log_prob(ch.y, f), 0.0))
    lp, g, h = _point_derivatives(model.likelihood, ch.y, f)
    lp, g, h = (jnp.where(keep, t, 0.0) for t in (lp, g, h))
    hw = jnp.minimum(h, 0.0) if clip else h
    H, Ag = block_gram(A, hw, g)
    return (jnp.sum(lp), Ag, H,
            jnp.sum(h > 0, dtype=jnp.int32), jnp.sum(h != 0, dtype=jnp.int32))


def _data_sums(model, prior, chunks, proj, w, cached, blocks, derivatives, clip, checkpoint=False):
    """Scan :func:`_chunk_terms` over all chunks.  ``checkpoint`` rematerialises each chunk
    in the backward pass (memory O(chunk·d + d²) for hyperparameter gradients)."""
    d = w.shape[0]

    def one(ch, pr):
        return _chunk_terms(model, prior, ch, pr, w, cached, blocks, derivatives, clip)

    if checkpoint:
        one = jax.checkpoint(one)

    def body(carry, xs):
        out = one(*xs)
        return jax.tree_util.tree_map(jnp.add, carry, out), None

    if derivatives:
        zi = jnp.zeros((), jnp.int32)
        init = (jnp.zeros((), w.dtype), jnp.zeros(d, w.dtype), zero_gram(d, blocks, w.dtype), zi, zi)
    else:
        init = jnp.zeros((), w.dtype)
    out, _ = jax.lax.scan(body, init, (chunks, proj))
    if derivatives:
        out = out[:2] + (assemble_gram(out[2], blocks),) + out[3:]
    return out


def _chol_precision(S):
    """Cholesky factor of ``H = I − S`` (NaN when H is not positive definite)."""
    H = jnp.eye(S.shape[0], dtype=S.dtype) - S
    return jnp.linalg.cholesky(0.5 * (H + H.T))


@jit
def _psi(lp, w):
    return lp - 0.5 * w @ w


@jit
def _state_at(w, S):
    """``(N(w, H⁻¹), chol H)`` for ``H = I − S`` as one compiled program (NaNs where H is not
    positive definite); eagerly these were about a dozen small programs per problem size."""
    R = _chol_precision(S)
    return state_from_precision_chol(w, R), R


# ---- one safeguarded Newton iteration (shared by the engine and the jitted mode finder) ---
def _newton_step(model, prior, chunks, proj, w, sums, cached, blocks):
    """A Newton step on Ψ from ``w`` with backtracking (Armijo) on Ψ.

    ``sums`` are the (clipped) derivative sums at ``w``.  Returns ``(w', Ψ(w'), α, Newton
    decrement gᵀH⁻¹g)``; ``α = 0`` and ``w' = w`` when no step size up to ``2⁻³⁰``
    increases Ψ (``w`` is then a mode to rounding precision, or H is unusable).
    """
    lp, gsum, S = sums[:3]
    psi = _psi(lp, w)
    grad = gsum - w
    R = _chol_precision(S)
    delta = cho_solve((R, True), grad)
    dec = grad @ delta
    slack = 1e-13 * jnp.maximum(1.0, jnp.abs(psi))

    def value(alpha):
        wn = w + alpha * delta
        return _psi(_data_sums(model, prior, chunks, proj, wn, cached, blocks, False, False), wn)

    def ok(alpha, psi_new):
        return jnp.isfinite(psi_new) & (psi_new >= psi + _ARMIJO * alpha * dec - slack)

    def cond(c):
        alpha, psi_new, k = c
        return ~ok(alpha, psi_new) & (k < _MAX_HALVINGS)

    def body(c):
        alpha, _, k = c
        return 0.5 * alpha, value(0.5 * alpha), k + 1

    alpha, psi_new, _ = jax.lax.while_loop(cond, body, (jnp.ones((), w.dtype), value(1.0), 0))
    good = ok(alpha, psi_new) & jnp.all(jnp.isfinite(delta))
    alpha = jnp.where(good, alpha, 0.0)
    w_new = jnp.where(good, w + alpha * delta, w)
    return w_new, jnp.where(good, psi_new, psi), alpha, dec


@partial(jit, static_argnames=("cached", "blocks", "clip"))
def _sums_jit(model, prior, chunks, proj, w, cached, blocks, clip):
    return _data_sums(model, prior, chunks, proj, w, cached, blocks, True, clip)


@partial(jit, static_argnames=("cached", "blocks"))
def _step_jit(model, prior, chunks, proj, w, sums, cached, blocks):
    return _newton_step(model, prior, chunks, proj, w, sums, cached, blocks)


@partial(jit, static_argnames=("cached", "blocks", "max_iter"))
def _find_mode_jit(model, prior, chunks, proj, w0, tol, cached, blocks, max_iter):
    sums0 = _data_sums(model, prior, chunks, proj, w0, cached, blocks, True, True)

    def cond(c):
        _, _, _, it, done = c
        return ~done & (it < max_iter)

    def body(c):
        w, sums, psi, it, _ = c
        w1, psi1, alpha, _ = _newton_step(model, prior, chunks, proj, w, sums, cached, blocks)
        sums1 = _data_sums(model, prior, chunks, proj, w1, cached, blocks, True, True)
        small = jnp.abs(psi1 - psi) <= tol * jnp.maximum(1.0, jnp.abs(psi1))
        return w1, sums1, psi1, it + 1, (alpha == 0) | (small & (alpha == 1))

    w, _, _, it, done = jax.lax.while_loop(
        cond, body, (w0, sums0, _psi(sums0[0], w0), 0, jnp.zeros((), bool)))
    return w, it, done


def _check_likelihood(lik):
    if isinstance(lik, Laplace):
        raise ValueError(
            "the Laplace approximation needs the second derivative of log p(y|f) in f, but the "
            f"{type(lik).__name__} likelihood has h = 0 almost everywhere (log p is piecewise linear); "
            "use a variational engine (engine='fpi', 'fpb' or 'gradient'), which differentiates the "
            "Gaussian expectation instead"
        )


# ---- the engine ---------------------------------------------------------------------------
def run(objective: Objective, state: State, *, tol: float = 1e-6, max_iter: int = 100,
        callback=None, on_state=None) -> EngineResult:
    """Laplace approximation by Newton's method from ``state.mean`` (its ``chol`` is unused
    except for the first trace row).

    Stops when Ψ changes by at most ``tol·max(1, |Ψ|)`` after a full (undamped) Newton step.

    Returns an :class:`EngineResult` with ``state = State(ŵ, chol(H⁻¹))``, ``vlb`` the VLB of
    that Gaussian (in the same units as every other engine), ``trace`` rows (seconds, VLB of
    ``N(w_k, H(w_k)⁻¹)``) with row 0 at the given ``state`` (and one more row at iteration 0
    when no Newton step was needed), ``backtracks`` the halvings of the
    Newton step, ``clipped`` the Newton matrices in which some ``h_i > 0`` was clipped to 0,
    and ``extras``: ``log_marginal`` (``Ψ(ŵ) − ½ log|H|``), ``newton_iterations``, ``psi``
    (``Ψ(ŵ)``) and ``hessian`` (``"exact"`` or, if the exact ``H`` at the mode is not positive
    definite, ``"clipped"``).

    Raises ``ValueError`` for a likelihood whose second derivative is zero everywhere (the
    ``Laplace`` likelihood).
    """
    model, prior, chunks, proj, cached, blocks = (objective.model, objective.prior, objective.chunks,
                                                  objective.proj, objective.cached, objective.blocks)
    _check_likelihood(model.likelihood)
    clock = Clock(callback, on_state, model)
    if clock.tick(objective.vlb(state), 0, state):
        return stopped_at_start(objective, state, clock.rows[0][1], clock)
    w = jnp.asarray(state.mean)

    def derivative_sums(w_, clip=True):
        objective.num_evaluations += 1
        return _sums_jit(model, prior, chunks, proj, w_, cached, blocks, clip)

    def laplace_state(w_, sums):
        """``(N(w_, H⁻¹), chol H, which h)``: the exact ``h_i`` unless that H is not
        positive definite (then the clipped one)."""
        if int(sums[3]) > 0:  # some h_i > 0 were clipped in ``sums``: try the exact Hessian
            st, R = _state_at(w_, derivative_sums(w_, clip=False)[2])
            if is_finite(R):
                return st, R, "exact"
            kind = "clipped"
        else:
            kind = "exact"
        st, R = _state_at(w_, sums[2])
        return st, R, kind

    sums = derivative_sums(w)
    # A likelihood with h = 0 at every point (piecewise linear log p) has no Laplace
    # approximation.  Saturated points of e.g. a logistic likelihood at a poor warm start can
    # also underflow to h = 0, so the test is decided at the prior mean w = 0.
    if int(sums[4]) == 0 and int(derivative_sums(jnp.zeros_like(w))[4]) == 0:
        raise ValueError(
            f"the {type(model.likelihood).__name__} likelihood has ∂²log p/∂f² = 0 at every data point, so "
            "the Laplace approximation carries no information from the data; use a variational engine "
            "(engine='fpi', 'fpb' or 'gradient')"
        )
    psi = float(_psi(sums[0], w))
    if not np.isfinite(psi):
        return EngineResult(state, float(clock.rows[0][1]), 0, False,
                            "log posterior Ψ is not finite at the starting mean", clock.trace,
                            evaluations=objective.num_evaluations)
    clipped = int(int(sums[3]) > 0)
    backtracks = 0
    current = None  # (state, chol H, hessian kind, VLB) at w
    converged, message, it = False, f"reached max_iter={max_iter}", 0
    for it in range(1, max_iter + 1):
        w_new, psi_new, alpha, dec = _step_jit(model, prior, chunks, proj, w, sums, cached, blocks)
        alpha, psi_new = float(alpha), float(psi_new)
        halvings = round(-np.log2(alpha)) if alpha > 0 else _MAX_HALVINGS
        objective.num_evaluations += 1 + halvings
        backtracks += halvings
        if alpha == 0.0:
            # No step size raises Ψ: ``w`` is the mode to rounding precision when the
            # predicted increase (half the Newton decrement) is at that level.
            converged = abs(float(dec)) <= 1e-10 * max(1.0, abs(psi))
            message = ("Newton decrement at rounding level (mode found)" if converged else
                       "line search found no ascent step (stopped at the best point found)")
            it -= 1
            break
        done = converged_change(psi_new, psi, tol) and alpha == 1.0
        w, psi = w_new, psi_new
        sums = derivative_sums(w)
        clipped += int(int(sums[3]) > 0)
        st, R, kind = laplace_state(w, sums)
        current = (st, R, kind, float(objective.vlb(st)))
        stop = clock.tick(current[3], it, st)
        if done:
            converged, message = True, f"Ψ change below tol={tol:g}"
            break
        if stop:
            message = STOPPED
            break
    if current is None:  # no step was taken: the approximation at the starting mean
        st, R, kind = laplace_state(w, sums)
        current = (st, R, kind, float(objective.vlb(st)))
        clock.tick(current[3], 0, st)
    state, R, hessian, vlb = current
    log_marginal = psi - float(np.sum(np.log(np.diag(np.asarray(R)))))
    return EngineResult(state, vlb, it, converged, message, clock.trace, backtracks, 0,
                        objective.num_evaluations, clipped,
                        {"log_marginal": log_marginal, "newton_iterations": it, "psi": psi,
                         "hessian": hessian})


# ---- the approximate log marginal likelihood, differentiable in hyperparameters -----------
def laplace_log_marginal_at(model, X, chunks: Chunks, mode, clip: bool = False):
    """Laplace log marginal likelihood of ``model`` given (an approximation of) its mode.

    Differentiable in the model's parameters (use inside ``jax.value_and_grad``): ``mode`` is
    treated as a constant, one Newton step ``w₁ = ŵ + H⁻¹∇Ψ(ŵ)`` is taken inside the
    differentiated function, and ``Ψ(w₁) − ½ log|H(w₁)|`` is returned.  At the mode,
    ``dw₁/dθ = H⁻¹ ∂∇Ψ/∂θ`` is exactly the implicit derivative of the mode, so the gradient is
    the total derivative of the Laplace log marginal (GPML Algorithm 5.1).  Each chunk is
    rematerialised in the backward pass, so the gradient needs O(chunk·d + C·d²) memory.

    Parameters
    ----------
    model : a concrete model; X : (N, D) training inputs (for ``model.prior_cache``);
    chunks : ``make_chunks(X, y, offset)`` with y in the likelihood's internal coding;
    mode : (d,) whitened mode, e.g. ``run(...).state.mean``;
    clip : use ``min(h_i, 0)`` in H (only when the exact H is not positive definite; the
        derivative is then not the exact implicit one).

    Returns
    -------
    scalar
        The Laplace log marginal (NaN if ``H`` is not positive definite).
    """
    return _log_marginal_jit(model, jnp.asarray(X), chunks, jnp.asarray(mode), clip)


@partial(jit, static_argnames=("clip",))
def _log_marginal_jit(model, X, chunks, mode, clip):
    prior = model.prior_cache(X)
    w0 = jax.lax.stop_gradient(mode)
    empty = jnp.zeros((chunks.mask.shape[0], 0))
    k = num_blocks(w0.shape[0])
    _, gsum, S, _, _ = _data_sums(model, prior, chunks, empty, w0, False, k, True, clip, checkpoint=True)
    R = _chol_precision(S)
    w1 = w0 + cho_solve((R, True), gsum - w0)
    lp1, _, S1, _, _ = _data_sums(model, prior, chunks, empty, w1, False, k, True, clip, checkpoint=True)
    return _psi(lp1, w1) - jnp.sum(jnp.log(jnp.diag(_chol_precision(S1))))


def find_mode(model, X, chunks: Chunks, *, w0=None, tol: float = 1e-10, max_iter: int = 100):
    """Mode ``ŵ`` (d,) of Ψ by safeguarded Newton, as one jitted ``lax.while_loop``.

    Works on traced hyperparameters (no gradient flows through it: the model is
    ``stop_gradient``-ed).  Returns ``(ŵ, iterations, converged)``.
    """
    Xj = jnp.asarray(X)
    d = model.num_weights(Xj)
    w0 = jnp.zeros(d) if w0 is None else jnp.asarray(w0, jnp.float64)
    return _find_mode_from_scratch(model, Xj, chunks, w0, jnp.asarray(tol, jnp.float64), int(max_iter))


@partial(jit, static_argnames=("max_iter",))
def _find_mode_from_scratch(model, X, chunks, w0, tol, max_iter):
    model, w0 = jax.lax.stop_gradient((model, w0))
    prior = model.prior_cache(X)
    empty = jnp.zeros((chunks.mask.shape[0], 0))
    return _find_mode_jit(model, prior, chunks, empty, w0, tol, False, num_blocks(w0.shape[0]), max_iter)


def laplace_log_marginal(model, X, y, offset=None, *, tol: float = 1e-10, max_iter: int = 100,
                         chunk_size: int = DEFAULT_CHUNK):
    """Laplace approximation of the log marginal likelihood ``log p(y | X, θ)`` (nats).

    ``Ψ(ŵ) − ½ log|I − Σ h_i a_i a_iᵀ|`` at the mode ``ŵ`` of the whitened log posterior
    (GPML Eq. 3.32; for a sparse GP, that of the subset-of-regressors model, see the module
    notes).  Usable inside ``jax.value_and_grad``/``jax.jit`` with respect to the model's
    parameters: the mode is found without autodiff and the gradient comes from one Newton
    step inside the differentiated function (see :func:`laplace_log_marginal_at`).

    Parameters
    ----------
    model : GLM, GP or SparseGP (a SparseGP needs its inducing inputs as an (M, D) array, or
        an int M to place them by k-means on ``X``, which needs concrete parameters).
    X : (N, D) inputs; y : (N,) observations (user coding, validated by the likelihood);
    offset : (N,) added to every latent, or None.
    tol, max_iter : stopping rule of the Newton iterations (relative change of Ψ).
    chunk_size : most rows per chunk of the data sums.

    Returns
    -------
    scalar
        The Laplace log marginal, a JAX scalar.

    Raises
    ------
    ValueError
        For the ``Laplace`` likelihood and bad input.
    """
    _check_likelihood(model.likelihood)
    X = check_X(X, "X")
    y = model.likelihood.validate(y)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries: lengths must match")
    if offset is not None:
        offset = np.asarray(offset, np.float64)
        if offset.shape != (X.shape[0],) or not np.all(np.isfinite(offset)):
            raise ValueError(f"offset must be a finite (N,) = ({X.shape[0]},) array")
    if np.ndim(getattr(model, "inducing", np.zeros((1, 1)))) == 0:
        model = model.initialise(X, y)
    chunks = make_chunks(X, y, offset, chunk_size)
    w, _, _ = find_mode(model, X, chunks, tol=tol, max_iter=max_iter)
    return laplace_log_marginal_at(model, X, chunks, w)


# ---- self-consistency of hyperparameters learned on the Laplace log marginal -------------
#: Largest ``log_marginal − VLB`` (nats per observation) accepted at hyperparameters learned on
#: the Laplace log marginal likelihood (see :func:`check_learned_hyperparameters`).
MAX_GAP_PER_OBSERVATION = 0.1


def check_learned_hyperparameters(model, names, log_marginal: float, vlb: float, n: int) -> None:
    """Refuse hyperparameters at which the Laplace approximation contradicts itself.

    ``log_marginal`` is the Laplace log marginal ``Ψ(ŵ) − ½ log|H|`` of ``model`` and ``vlb``
    the VLB of its Gaussian ``q = N(ŵ, H⁻¹)`` (as reported by :func:`run`).  Their difference is

        ``Δ = log_marginal − vlb = Σ_i E_q[T_i(f_i) − log p(y_i | f_i)]``,

    where ``T_i`` is the second-order Taylor expansion of ``log p(y_i | ·)`` at the mode
    ``f̂_i`` (expand both sides: the ``½ h_i Var_q f_i`` terms sum to ``½(tr H⁻¹ − d)``, which
    cancels the trace term of the KL; exact for the exact H, while for a sparse GP the VLB also
    counts the conditional variances that the approximation ignores).  So Δ is the error,
    averaged over the Laplace posterior itself, of the quadratic model of the likelihood that
    the Laplace method rests on: 0 for Gaussian noise and a fraction of a nat for a sound
    approximation (measured at learned hyperparameters: |Δ| ≤ 0.3 on Bernoulli, Poisson,
    ordinal, Student-t, full, sparse and GLM fits of 60-200 points).
    And since ``vlb ≤ log p(y)``, the Laplace evidence overestimates ``log p(y)`` by at most Δ:
    a large Δ means the maximised objective may be mostly approximation error.

    That is what happens on (nearly) separable data (200 points x ~ U(−3, 3),
    y = 1 for x > 0, RBF GP): the larger the latent scale (kernel variance, GLM prior
    variance), the further the mode's latents move from 0 (only like its logarithm), the
    likelihood saturates there, ``Ψ(ŵ) → 0`` and the curvatures ``h_i → 0``, so ``H → I`` and
    ``q`` keeps nearly the prior's variance, while ``½ log|H|`` grows only slowly.  The Laplace
    evidence therefore peaks at a huge scale (kernel variance 4.9·10⁴, lengthscale 1.17, log
    marginal −6.3), where the latent at x = 2 has mean 64 and standard deviation 205 and
    P(y = 1 | x = 2) ≈ 0.5 although every label at x > 0 is 1; ``vlb`` there is −7438
    (Δ = 7432 nats, 37 per observation), while fpi's optimum over the hyperparameters is
    −8.1 with P(y = 1 | x = 2) = 0.9999.  L-BFGS-B converges correctly, to a maximum of an
    objective that has stopped approximating anything.

    Raises ``ValueError`` (naming the learned values and the way out) when
    ``Δ > max(1, MAX_GAP_PER_OBSERVATION · n)`` for ``n`` observations: 0.1 nats per
    observation is 70 times the largest Δ per observation of the sound cases above (0.0014)
    and 1/30 of the smallest separable case measured (3 nats per observation: a logistic GLM,
    prior variance learned to ≈ 8·10³).
    """
    gap = float(log_marginal) - float(vlb)
    limit = max(1.0, MAX_GAP_PER_OBSERVATION * n)
    if not gap > limit:
        return
    params = model.parameters()
    values = ", ".join(f"{k} = {np.array2string(np.asarray(params[k]), precision=4)}" for k in names)
    raise ValueError(
        "engine='laplace' cannot learn these hyperparameters: where the Laplace log marginal "
        f"likelihood is largest ({values}; log marginal {float(log_marginal):.6g}) the Laplace "
        f"approximation contradicts itself: the VLB of its own Gaussian is {float(vlb):.6g}, "
        f"{gap:.4g} nats lower (the limit is {MAX_GAP_PER_OBSERVATION:g} nats per observation, "
        f"{limit:.4g} for {n}), so neither its evidence nor its probabilities can be trusted. "
        "This happens on (nearly) separable data: the Laplace evidence keeps rewarding a larger "
        "latent scale, the likelihood saturates at the mode, its curvature vanishes and the "
        "Laplace Gaussian keeps almost the prior's variance (predictive probabilities near 0.5). "
        "Use a variational engine (e.g. engine='fpi'), which maximises a lower bound on the "
        "marginal likelihood, or keep the latent scale fixed (leave kernel.variance or "
        "prior_variance out of learn_hyperparameters)."
    )


ENGINE = Engine("laplace", run, "Laplace approximation: Newton on the mode, V = (-Hessian)^-1 (not a VLB maximiser)", data="rows", evidence="laplace")
