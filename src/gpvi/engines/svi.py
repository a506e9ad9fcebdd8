"""SVI: stochastic variational inference of Hensman, Matthews & Ghahramani (2015), the
baseline of Izmailov & Kropotov (2017).

Each step draws a minibatch of B rows, forms the unbiased estimate of the VLB
``(N/B) Σ_batch E_q[log p(y_i|f_i)] − KL`` (:func:`gpvi.objective.minibatch_vlb`) and moves the
mean ``m``, the lower-triangular factor ``L`` of ``V = L Lᵀ`` (whitened coordinates) and, when
asked, the unconstrained hyperparameters θ along its gradient (JAX autodiff) with an optax
optimiser: AdaDelta (the paper's baseline, climin-style: decay 0.9) or Adam.  One iteration is
one epoch (a pass over the data).  Full-data VLBs for the trace are computed every
``eval_every`` steps (or once per epoch), off the clock.
"""
from __future__ import annotations

import functools

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpvi._module import flatten_params, unflatten_params
from gpvi.objective import Objective, State, minibatch_vlb, num_blocks
from gpvi.engines.registry import Engine
from gpvi.data.stream import StreamObjective
from gpvi.engines._stochastic import EpochClock, check_positive_float, check_positive_int, drive, setup, step_limit
from gpvi._compile import jit

OPTIMIZERS = ("adadelta", "adam")
DEFAULT_RATES = {"adadelta": 1.0, "adam": 0.01}


@functools.lru_cache(maxsize=64)
def _optimizer(name, rate):
    # Cached: the optimiser is a static argument of the compiled step, and a fresh optax object
    # per fit (new closures, new hash) made every fit compile the step again (15–33 s).
    if name == "adadelta":
        # climin's Adadelta as used by Izmailov & Kropotov: decay 0.9, offset 1e-6 (optax's ε)
        return optax.adadelta(learning_rate=rate, rho=0.9, eps=1e-6)
    return optax.adam(learning_rate=rate)


_prior_cache = jit(lambda m: m.prior_cache(None))


def _negative_bound(params, model, names, batch, scale, prior, blocks):
    mean, L, theta = params
    state = State(mean, jnp.tril(L))
    if names:
        model = unflatten_params(model, theta)
        prior = None
    return -minibatch_vlb(model, batch, state, scale, blocks, prior=prior)


@partial(jit, static_argnames=("names", "opt", "blocks"))
def _step(params, opt_state, model, names, batch, scale, prior, opt, blocks):
    val, g = jax.value_and_grad(_negative_bound)(params, model, names, batch, scale, prior, blocks)
    g = (g[0], jnp.tril(g[1]), g[2])
    updates, opt_state = opt.update(g, opt_state, params)
    new = optax.apply_updates(params, updates)
    leaves = jax.tree_util.tree_leaves(new)
    ok = jnp.isfinite(val) & jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in leaves]))
    return new, opt_state, -val, ok


def run(objective: Objective | StreamObjective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int | None = None, callback=None, batch_size: int | None = None, learning_rate: float | None = None,
        epochs: int | None = None, seed: int = 0, optimizer: str = "adadelta", eval_every: int | None = None,
        max_steps: int | None = None, hyperparameters=None, on_batch=None, on_state=None):
    """Run SVI from ``state``; returns an :class:`~gpvi.engines._common.EngineResult`.

    Parameters
    ----------
    objective : the data in memory (an :class:`~gpvi.objective.Objective`: its rows are streamed
        in random minibatches, and it gives the full-data VLB of the trace and the final gap) or a
        :class:`~gpvi.data.stream.StreamObjective` (a model and a stream of minibatches,
        :func:`gpvi.fit_stream`).
    batch_size : rows per minibatch B (default min(N, max(64, N // 100)), about the sizes of
        Izmailov & Kropotov's baseline).
    learning_rate : optimiser step (default 1.0 for AdaDelta, 0.01 for Adam).
    epochs : passes over the data; default 10, or as many as make 1000 minibatch steps when
        the data are small.
    max_iter : stop after this many minibatch steps (an iteration of a stochastic engine is one
        step, as ``iterations`` counts them; None: no limit but ``epochs`` and ``max_steps``).
    seed : seed of the per-epoch shuffles.
    optimizer : ``"adadelta"`` (default) or ``"adam"`` (optax).
    eval_every : record the full-data VLB every this many steps (default: after each epoch);
        evaluations are off the clock.
    max_steps : stop after this many minibatch steps (default: no limit).
    hyperparameters : dotted names of model parameters learned jointly (unconstrained), e.g.
        from ``fit(..., learn_hyperparameters=True)``; the learned model is returned in
        ``extras["model"]``.
    on_batch : ``on_batch(epoch, steps, rows_done, seconds)`` after every step (progress).
    on_state : ``on_state(model, state, progress)`` at every trace row (each epoch, or every
        ``eval_every`` steps; off the clock), e.g. for checkpoints or test metrics; returning True
        ends the run there.

    Notes
    -----
    A minibatch step that would make (m, L, θ) non-finite is not taken and the run stops.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    epochs = check_positive_int("epochs", epochs, allow_none=True)
    eval_every = check_positive_int("eval_every", eval_every, allow_none=True)
    max_steps = check_positive_int("max_steps", max_steps, allow_none=True)
    rate = DEFAULT_RATES[optimizer] if learning_rate is None else check_positive_float("learning_rate", learning_rate)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    model, stream, data, N, B = setup(objective, batch_size, "svi", lambda N: min(N, max(64, N // 100)))
    if epochs is None:
        epochs = max(10, -(-1000 * B // N))
    names = tuple(hyperparameters or ())
    blocks = num_blocks(state.mean.shape[0])
    opt = _optimizer(optimizer, rate)
    theta = flatten_params(model, list(names)) if names else {}
    params = (state.mean, state.chol, theta)
    opt_state = opt.init(params)
    prior = None if names else _prior_cache(model)
    box = {"params": params, "opt_state": opt_state}

    def current():
        mean, L, th = box["params"]
        mdl = unflatten_params(model, th) if names else model
        return mdl, State(mean, jnp.tril(L))

    def step(chunk, scale, t):
        new, ost, v, ok = _step(box["params"], box["opt_state"], model, names, chunk, scale, prior, opt, blocks)
        if not bool(ok):
            return None
        box["params"], box["opt_state"] = new, ost
        return v

    clock = EpochClock(callback)
    res = drive(stream=stream, batch_size=B, epochs=epochs, seed=seed, max_steps=step_limit(max_steps, max_iter),
                eval_every=eval_every, objective=data, clock=clock, step=step, current=current,
                likelihood=model.likelihood, tol=tol, tol_nats=tol_nats,
                extras={"optimizer": optimizer, "learning_rate": rate}, message="svi", on_batch=on_batch,
                on_state=on_state)
    if names:
        res.extras["model"] = current()[0]
    return res


ENGINE = Engine("svi", run, "minibatch AdaDelta/Adam on (m, chol V[, hyperparameters]) (Hensman et al. 2015)", data="minibatch", hyperparameters="joint", streams=True)
