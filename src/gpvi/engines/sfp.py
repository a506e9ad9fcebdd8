"""SFP: the stochastic fixed point — natural-parameter averaging over minibatches.

The fixed-point (FPi) step is a natural-gradient step of size 1 (DESIGN §2).  In whitened
coordinates ``q(w) = N(m, V)`` has natural parameters ``(h, Λ) = (V⁻¹ m, V⁻¹)`` (up to the −½ on
Λ), and the full-data FP step sets them to

    Λ̂ = I − S,   ĥ = Λ̂ m + ∇_m VLB = Σ ρ_i a_i − S m,     (S = Σ λ_i a_i a_iᵀ)

i.e. ``m' = m + Λ̂⁻¹ ∇_m VLB`` (a Newton step on the mean) and ``V' = Λ̂⁻¹``.  Both are linear in the
three data sums, so replacing them by their N/B-scaled minibatch estimates
(:func:`gpvi.objective.minibatch_sums`) gives an unbiased estimate of the target, and SFP averages

    η ← (1 − γ_t) η + γ_t η̂_batch,

which is exactly :func:`~gpvi.engines._common.natural_step` of size γ_t with the minibatch sums
(``Λ' = (1−γ)V⁻¹ + γΛ̂``, ``m' = m + γ Λ'⁻¹ ĝ``).  This is Hensman et al. (2013)'s SVI for
Gaussian likelihoods; the ρ/λ sums make it work for every likelihood (the λ_i are evaluated at
the current marginals, as in FPi).  With B = N and γ = 1 one SFP step is one FPi step.  Where
``I − Ŝ`` is not positive definite (a likelihood that is not log-concave) the step uses γ_i = −λ_i
clipped at 0, as FPi does.

Step sizes (``schedule``): ``"paper"`` γ_t = 1/(1 + √t) (Cheng & Boots 2016, for step t = 1, 2, …,
as in ``ivsgpr``: the first step has γ = 1/2), a number c ∈ (0, 1] (constant), ``"adaptive"``
(Ranganath et al. 2013's rule, below), or a function ``t -> γ_t`` of the step's number t ≥ 1;
every γ_t must lie in (0, 1].

Hyperparameters (and, when named, inducing inputs) are learned by Adam (optax) on the minibatch
bound at the updated q, rate ``hyper_rate`` (×γ_t with ``hyper_decay=True``: the paper's
``hyper_rate=1e-4, hyper_decay=True``).
"""
from __future__ import annotations

import numbers
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpvi._module import flatten_params, unflatten_params
from gpvi.models.base import kl_standard_normal
from gpvi.objective import DEFAULT_CHUNK, Objective, State, minibatch_projection, minibatch_sums, minibatch_vlb, num_blocks
from gpvi.objective.blocks import raw_moments, split_rows
from gpvi.objective.minibatch import raw_expected_log_prob, raw_sums
from gpvi.engines.registry import Engine
from gpvi.data.stream import StreamObjective
from gpvi._linalg import tri_inv
from gpvi.engines._common import damped_S, natural_step, precision_chol, state_S
from gpvi.engines._stochastic import (DEFAULT_BATCH, EpochClock, check_positive_float, check_positive_int, drive,
                                      paper_step_size, setup, step_limit)
from gpvi._compile import jit


class AdaptiveSchedule:
    """The adaptive step size of Ranganath, Wang, Blei & Xing (2013) for natural-gradient SVI.

    With ``g_t = η̂_t − η_t`` (the noisy natural gradient, here ``(ĥ − h, Λ̂ − Λ)`` flattened),
    running averages ``ḡ ← (1−1/τ)ḡ + g/τ`` and ``h̄ ← (1−1/τ)h̄ + gᵀg/τ`` give
    ``γ = ḡᵀḡ / h̄`` (≈ signal / (signal + noise)) and the memory ``τ ← τ(1 − γ) + 1``.  The first
    step takes γ = 1 and sets the averages from its g with memory ``tau0``; γ is kept in
    ``[gamma_min, 1]``.
    """

    def __init__(self, tau0: float = 10.0, gamma_min: float = 1e-3):
        self.tau = float(tau0)
        self.gamma_min = float(gamma_min)
        self.gbar = None
        self.hbar = None

    def __call__(self, g):
        g = np.asarray(g)
        if self.gbar is None:
            self.gbar, self.hbar = g, float(g @ g)
            return 1.0
        w = 1.0 / self.tau
        self.gbar = (1 - w) * self.gbar + w * g
        self.hbar = (1 - w) * self.hbar + w * float(g @ g)
        gamma = float(np.clip(self.gbar @ self.gbar / self.hbar, self.gamma_min, 1.0)) if self.hbar > 0 else 1.0
        self.tau = self.tau * (1.0 - gamma) + 1.0
        return gamma


def _check_schedule(schedule):
    if isinstance(schedule, str):
        if schedule == "paper":
            return paper_step_size
        if schedule == "adaptive":
            return AdaptiveSchedule()
        raise ValueError(f"schedule must be 'paper', 'adaptive', a number in (0, 1] or a function t -> γ_t, "
                         f"got {schedule!r}")
    if isinstance(schedule, numbers.Real) and not isinstance(schedule, (bool, np.bool_)):
        c = float(schedule)
        if not (0.0 < c <= 1.0):
            raise ValueError(f"schedule: a constant step size must be in (0, 1], got {schedule!r}")
        return lambda t: c
    if callable(schedule):
        return schedule
    raise ValueError(f"schedule must be 'paper', 'adaptive', a number in (0, 1] or a function t -> γ_t, "
                     f"got {schedule!r}")


def _gamma_value(gamma, t):
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise ValueError(f"schedule returned {gamma!r} at step {t}; step sizes must be numbers in (0, 1]") from None
    if not (0.0 < g <= 1.0):
        raise ValueError(f"schedule returned γ = {g!r} at step {t}; step sizes must be in (0, 1]")
    return g


@jit
def natural_gradient(state: State, grad, S, S_state):
    """``(ĥ − h, Λ̂ − Λ)`` flattened: the natural gradient of the adaptive rule, from the
    (scaled) sums at ``state`` and its precision ``Λ = V⁻¹ = I − S_state``
    (:func:`~gpvi.engines._common.state_S`); Λ̂ = I − S, h = Λm, ĥ = Λ̂m + grad, so
    ``ĥ − h = grad + (S_state − S) m`` and ``Λ̂ − Λ = S_state − S``."""
    D = S_state - S  # (d, d), or (Q, d, d) for Q latent blocks
    return jnp.concatenate([(grad + jnp.einsum("...ij,...j->...i", D, state.mean)).reshape(-1), D.reshape(-1)])


def natural_target(state: State, grad, S):
    """``(ĥ, Λ̂)``: the natural parameters of the FP target from the sums at ``state``
    (``Λ̂ = I − S``, ``ĥ = Λ̂ m + grad``); linear in the sums (see the module docstring)."""
    Lhat = jnp.eye(S.shape[0], dtype=S.dtype) - S
    return Lhat @ state.mean + grad, Lhat


def _neg_bound(theta, model, batch, state, scale, blocks):
    return -minibatch_vlb(unflatten_params(model, theta), batch, state, scale, blocks)


#: Adam's scaling (the rate is applied in :func:`_hyper_step`), made once: it is a static argument
#: of the compiled θ step, and a new one per fit made every fit compile that step again (2.1 s
#: per fit on kin40k).
_ADAM = optax.scale_by_adam()


def _adam_update(theta, opt_state, g, rate, opt):
    """Adam's step of size ``rate`` down the gradient ``g``; and whether the new θ is finite."""
    upd, opt_state = opt.update(g, opt_state, theta)
    new = jax.tree_util.tree_map(lambda p, u: p - rate * u, theta, upd)
    ok = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(new)]))
    return new, opt_state, ok


@partial(jit, static_argnames=("opt", "blocks"))
def _hyper_step(theta, opt_state, model, batch, state, scale, rate, opt, blocks):
    g = jax.grad(_neg_bound)(theta, model, batch, state, scale, blocks)
    return _adam_update(theta, opt_state, g, rate, opt)


_prior = jit(lambda model, X: model.prior_cache(X))
_pass_cache = jit(lambda model, prior: model.pass_cache(prior))


@partial(jit, static_argnames=("blocks",))
def _batch_bound(model, prior, batch, state, scale, blocks):
    """The minibatch estimate of the VLB at ``state`` (no derivatives): the safeguard's test."""
    return minibatch_vlb(model, batch, state, scale, blocks, prior=prior)


@partial(jit, static_argnames=("blocks", "safeguard"))
def _fused_step(model, prior, batch, state, scale, gamma, blocks, safeguard, pcache=None, proj=None, S_state=None):
    """The usual step in one compiled call (one host round trip): the scaled sums at ``state``,
    the factor of ``I − Ŝ``, the proposal at ``gamma`` and, with ``safeguard``, the batch's bound
    at the proposal; plus whether ``I − Ŝ`` was positive definite and the proposal finite.
    ``pcache`` (``model.pass_cache(prior)``, made here when None) is kept across steps while the
    hyperparameters are fixed: for a sparse GP it is ``L⁻¹``, whose triangular solve per step
    took a fifth of the step (M = 300, B = 4096).  ``proj``: the batch's projections, when the
    caller has them.  ``S_state``: the state's precision as ``V⁻¹ = I − S_state``
    (:func:`~gpvi.engines._common.state_S`), which spares the damped step a triangular inverse and
    a Gram product of ``V``'s factor; the proposal's own is returned last (``None`` without it)."""
    # a batch of one chunk shares its projections between both states (one kernel pass)
    if proj is None and batch.mask.shape[0] <= DEFAULT_CHUNK:
        proj = minibatch_projection(model, prior, batch, blocks, pcache)
    sums = minibatch_sums(model, prior, batch, state, scale, blocks, proj=proj)
    RH = precision_chol(sums.S)
    new = natural_step(state, sums.grad, RH, gamma, S=sums.S, S_state=S_state)
    v_new = minibatch_vlb(model, batch, new, scale, blocks, proj=proj) if safeguard else jnp.zeros(())
    ok_H = jnp.all(jnp.isfinite(RH))
    finite = jnp.all(jnp.isfinite(new.mean)) & jnp.all(jnp.isfinite(new.chol))
    new_S = None if S_state is None else damped_S(S_state, sums.S, gamma)
    return sums, RH, new, v_new, ok_H, finite, new_S


def _features(theta, base, X):
    """What both halves of a learning step compute from θ: the prior cache, the pass cache
    ``T`` and the batch's raw features ``(F, b, k)`` of a factored model."""
    mdl = unflatten_params(base, theta)
    return (*mdl.caches(X), mdl.raw_features(X))


@partial(jit, static_argnames=("blocks", "safeguard", "opt"))
def _fused_learning_step(theta, opt_state, base, batch, state, scale, gamma, rate, blocks, safeguard, opt,
                         S_state=None):
    """:func:`_fused_step` at the hyperparameters ``theta`` and, at its proposal,
    :func:`_hyper_step`, in one compiled call (one host round trip instead of two).  The θ step
    is taken whether or not the safeguard accepts the proposal; the caller keeps it only with
    the proposal.

    For a factored model with one latent and a batch of one chunk of at least 3d rows (a sparse
    GP, :func:`~gpvi.objective.minibatch.raw_sums`), the two halves
    share their work: the prior's factor and inverse and the batch's kernel features are
    computed once (with their pullback to θ), and the bound at the proposal is computed once,
    in the raw features (:func:`~gpvi.objective.minibatch.raw_expected_log_prob`), as both the
    safeguard's test and the θ step's objective (M = 512, B = 2048: 154 ms as two calls, 134–145 ms as one)."""
    mdl = unflatten_params(base, theta)
    if not (batch.mask.shape[0] <= DEFAULT_CHUNK and raw_sums(base, state, batch)):
        step = _fused_step(mdl, mdl.prior_cache(None), batch, state, scale, gamma, blocks, safeguard,
                           S_state=S_state)
        return step, _hyper_step(theta, opt_state, base, batch, step[2], scale, rate, opt, blocks)
    (prior, T, feats), pull = jax.vjp(lambda th: _features(th, base, batch.X), theta)
    At, b, c = mdl.project_raw(T, *feats)
    sums, RH, new, _, ok_H, finite, new_S = _fused_step(mdl, prior, batch, state, scale, gamma, blocks, False, T,
                                                        proj=(split_rows(At, blocks), b, c), S_state=S_state)

    def neg_bound(th, T_, feats_):
        Tm, D = raw_moments(new, T_)
        E = raw_expected_log_prob(unflatten_params(base, th).likelihood, batch, Tm, D, *feats_)
        return kl_standard_normal(new.mean, new.chol) - scale * E

    nb, (g_direct, g_T, g_feats) = jax.value_and_grad(neg_bound, argnums=(0, 1, 2))(theta, T, feats)
    (g_pulled,) = pull((jnp.zeros_like(prior), g_T, g_feats))
    g = jax.tree_util.tree_map(jnp.add, g_direct, g_pulled)
    v_new = -nb if safeguard else jnp.zeros(())
    return (sums, RH, new, v_new, ok_H, finite, new_S), _adam_update(theta, opt_state, g, rate, opt)


# The safeguard halves γ at most this many times per step before giving the step up.
MAX_HALVINGS = 20


def run(objective: Objective | StreamObjective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int | None = None, callback=None, batch_size: int | None = None, schedule="paper", epochs: int | None = None,
        seed: int = 0, eval_every: int | None = None, max_steps: int | None = None,
        hyper_rate: float = 0.01, hyper_decay: bool = False, safeguard: bool = True, hyperparameters=None,
        on_batch=None, on_state=None):
    """Run SFP from ``state``; returns an :class:`~gpvi.engines._common.EngineResult`.

    Parameters
    ----------
    objective : the data in memory (an :class:`~gpvi.objective.Objective`: streamed in shuffled
        minibatches; it also gives the full-data VLB of the trace and the final gap, off the
        clock) or a :class:`~gpvi.data.stream.StreamObjective` (a model and a stream of
        minibatches, :func:`gpvi.fit_stream`).
    batch_size : rows per minibatch B (default min(N, 1024)).
    schedule : ``"paper"`` (default), ``"adaptive"``, a constant in (0, 1] or ``t -> γ_t``.
    epochs : passes over the data; default 2, or as many as make 50 minibatch steps when the
        data are small.
    max_iter, max_steps : stop after this many minibatch steps (an iteration of a stochastic
        engine is one step, as ``iterations`` counts them; the smaller limit holds; None: no limit
        but ``epochs``).
    seed : seed of the per-epoch shuffles.  eval_every : full-data VLB for the trace every
        this many steps (default: after each epoch).
    hyper_rate, hyper_decay : Adam's rate for the hyperparameters (× γ_t when ``hyper_decay``).
    safeguard : test each step on its own minibatch (one more pass over the batch, without
        derivatives): a step that lowers the batch's bound has its γ halved until it does not
        (counted in ``backtracks``), and the damping then relaxes by a factor 2 per accepted
        step.  The step η̂ − η ascends the batch's bound, so a small enough γ always passes.
        Without it a noisy first steps on a Poisson model (N = 10⁶, B = 4096, M = 300) sent
        whitened means to |m| ≈ 100 in directions the batch hardly sees and the run to overflow
        after 63 steps.
    hyperparameters : dotted names learned by Adam on the minibatch bound (the learned model is
        returned in ``extras["model"]``).
    on_batch : ``on_batch(epoch, steps, rows_done, seconds)`` after every step (progress).
    on_state : ``on_state(model, state, progress)`` at every trace row (each epoch, or every
        ``eval_every`` steps; off the clock), e.g. for checkpoints or test metrics; returning True
        ends the run there.
    """
    sched = _check_schedule(schedule)
    epochs = check_positive_int("epochs", epochs, allow_none=True)
    eval_every = check_positive_int("eval_every", eval_every, allow_none=True)
    max_steps = check_positive_int("max_steps", max_steps, allow_none=True)
    hyper_rate = check_positive_float("hyper_rate", hyper_rate)
    if not isinstance(safeguard, (bool, np.bool_)):
        raise ValueError(f"safeguard must be True or False, got {safeguard!r}")
    if not isinstance(hyper_decay, (bool, np.bool_)):
        raise ValueError(f"hyper_decay must be True or False, got {hyper_decay!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    model, stream, data, N, B = setup(objective, batch_size, "sfp", lambda N: min(N, DEFAULT_BATCH))
    if epochs is None:
        epochs = max(2, -(-50 * B // N))
    names = list(hyperparameters or ())
    blocks = num_blocks(state.mean.shape[0])
    opt = _ADAM
    box = {"state": state, "model": model, "theta": flatten_params(model, names) if names else None,
           "prior": None if names else _prior(model, None), "pcache": None, "clipped": 0, "gammas": [], "damp": 1.0,
           "backtracks": 0}
    # V⁻¹ = I − S_state of the current state, carried from step to step (each step's mixture):
    # the damped steps need no triangular inverse of V's factor (M = 512: ms a step)
    box["S_state"] = state_S(state.chol)
    box["opt_state"] = opt.init(box["theta"]) if names else None
    if not names:  # fixed hyperparameters: the per-pass work (L⁻¹ of a sparse GP) once for the run
        box["pcache"] = _pass_cache(model, box["prior"])

    def current():
        return box["model"], box["state"]

    def step(chunk, scale, t):
        n = t + 1  # the step's number: schedules count steps from 1 (t is the number taken so far)
        st, mdl = box["state"], box["model"]
        if not isinstance(sched, AdaptiveSchedule):
            gamma = _gamma_value(sched(n), n) * box["damp"]
            if names:  # the θ step at the proposal rides along (kept only if the proposal is)
                (sums, RH, new, v_new, ok_H, finite, new_S), hyper = _fused_learning_step(
                    box["theta"], box["opt_state"], model, chunk, st, scale, gamma, hyper_rate_at(gamma), blocks,
                    safeguard, opt, box["S_state"])
            else:
                sums, RH, new, v_new, ok_H, finite, new_S = _fused_step(
                    mdl, box["prior"], chunk, st, scale, gamma, blocks, safeguard, box["pcache"],
                    S_state=box["S_state"])
                hyper = None
            vlb, v_new, ok_H, finite = (float(x) for x in jax.device_get((sums.vlb, v_new, ok_H, finite)))
            if (ok_H and finite and np.isfinite(vlb)
                    and (not safeguard or (np.isfinite(v_new) and v_new >= vlb - 1e-10 * abs(vlb)))):
                box["damp"] = min(1.0, 2.0 * box["damp"])
                return accept(new, new_S, gamma, mdl, chunk, scale, sums, hyper)
        # the slow path: adaptive γ, clipping, or a step the safeguard refused
        prior = box["prior"] if box["prior"] is not None else _prior(mdl, None)
        if isinstance(sched, AdaptiveSchedule):
            sums = minibatch_sums(mdl, prior, chunk, st, scale, blocks)
            gamma = sched(natural_gradient(st, sums.grad, sums.S, box["S_state"]))
        else:
            gamma = _gamma_value(sched(n), n)
        S = sums.S
        RH = precision_chol(S)
        if not bool(jnp.all(jnp.isfinite(RH))):
            # I − Ŝ not positive definite (λ_i > 0 somewhere): clip γ_i = −λ_i at 0, as FPi does
            box["clipped"] += 1
            S = minibatch_sums(mdl, prior, chunk, st, scale, blocks, clip_gamma=True).S
            RH = precision_chol(S)
        if not np.isfinite(float(sums.vlb)):
            return None
        gamma = gamma * box["damp"]
        for k in range(MAX_HALVINGS + 1):
            new = natural_step(st, sums.grad, RH, gamma, S=S, S_state=box["S_state"])
            finite = bool(jnp.all(jnp.isfinite(new.chol))) and bool(jnp.all(jnp.isfinite(new.mean)))
            if finite and not safeguard:
                break
            if finite:
                v = float(_batch_bound(mdl, prior, chunk, new, scale, blocks))
                if np.isfinite(v) and v >= float(sums.vlb) - 1e-10 * abs(float(sums.vlb)):
                    break
            box["backtracks"] += 1
            gamma *= 0.5
        else:
            return None
        box["damp"] = min(1.0, 2.0 * box["damp"]) if k == 0 else box["damp"] * 0.5 ** k
        return accept(new, damped_S(box["S_state"], S, gamma), gamma, mdl, chunk, scale, sums)

    def hyper_rate_at(gamma):
        return hyper_rate * (gamma if hyper_decay else 1.0)

    def accept(new, new_S, gamma, mdl, chunk, scale, sums, hyper=None):
        if names:
            theta, ost, ok = hyper if hyper is not None else _hyper_step(
                box["theta"], box["opt_state"], mdl, chunk, new, scale, hyper_rate_at(gamma), opt, blocks)
            if not bool(ok):
                return None
            box["theta"], box["opt_state"] = theta, ost
            box["model"] = unflatten_params(model, theta)
        box["state"], box["S_state"] = new, new_S
        box["gammas"].append(gamma)
        return sums.vlb

    clock = EpochClock(callback)
    res = drive(stream=stream, batch_size=B, epochs=epochs, seed=seed, max_steps=step_limit(max_steps, max_iter),
                eval_every=eval_every, objective=data, clock=clock, step=step, current=current,
                likelihood=model.likelihood, tol=tol, tol_nats=tol_nats,
                extras={"schedule": schedule if isinstance(schedule, (str, numbers.Real)) else "callable"},
                message="sfp", on_batch=on_batch, on_state=on_state)
    res.clipped = box["clipped"]
    res.backtracks = box["backtracks"]
    res.extras["last_gamma"] = box["gammas"][-1] if box["gammas"] else float("nan")
    if names:
        res.extras["model"] = box["model"]
    return res




@jit
def assumed_density_step(state: State, grad, S, S_state=None):
    """One online (assumed-density / streaming-VB) update of ``q`` by a batch whose *unscaled*
    sums at ``state`` are ``grad = Σ_b ρ_i a_i − m`` and ``S = Σ_b λ_i a_i a_iᵀ`` (γ clipped at 0):
    the current ``q`` plays the prior, so ``Λ' = V⁻¹ − S`` and ``h' = Λ' m + Σ_b ρ_i a_i``, i.e.
    ``m' = m + Λ'⁻¹ (grad + m)``.  For a Gaussian likelihood and fixed hyperparameters the
    result after all batches is the exact full-data posterior (Titsias' optimum), whatever the
    batches; otherwise each batch is linearised at the ``q`` it found (Broderick et al. 2013).

    ``S_state``: the state's precision as ``V⁻¹ = I − S_state``
    (:func:`~gpvi.engines._common.state_S`, computed from ``state.chol`` when not given).  Then
    ``Λ' = I − (S_state + S)``: the new state's own ``S_state`` is ``S_state + S``, which a caller
    stepping through many batches carries instead of inverting each state's factor."""
    from gpvi.engines._common import flip, reversed_chol

    if S_state is None:
        S_state = state_S(state.chol)
    R = reversed_chol(jnp.eye(S.shape[-1], dtype=S.dtype) - (S_state + S))
    mean = state.mean + jax.scipy.linalg.cho_solve((R, True), (grad + state.mean)[::-1])[::-1]
    return State(mean, flip(tri_inv(R).T))


ENGINE = Engine("sfp", run, "stochastic fixed point: natural-parameter averaging over minibatches", data="minibatch", hyperparameters="joint", streams=True)
