"""Fitting from a data stream: :func:`fit_stream` (the stochastic engines over a
:class:`gpvi.stream.Stream`) and :func:`update` (online, assumed-density updates of a fitted
posterior by new rows; what the estimators' ``partial_fit`` uses)."""
from __future__ import annotations

import sys
import time

import jax
import numpy as np

from gpvi._module import unknown_parameters
from gpvi import engines as _engines
from gpvi.engines._common import state_S
from gpvi.engines._stochastic import StreamError, check_model
from gpvi.fitting.posterior import FitResult
from gpvi.fitting.problem import check_init as _check_init, learned_names as _learned_names
from gpvi.fitting.runner import BLAS_LIMIT as _BLAS_LIMIT
from gpvi.models.base import Model, check_X
from gpvi.models.multilatent import MultiLatent
from gpvi.objective import Chunks, Objective, State, minibatch_sums, num_blocks, prior_state
from gpvi.data.stream import StreamObjective, as_stream
from gpvi._watchdog import watched
from gpvi._compile import jit

__all__ = ["fit_stream", "update", "as_sparse", "stream_engines"]


def stream_engines() -> list[str]:
    """The registered engines that :func:`fit_stream` can drive (``Engine.streams``)."""
    return _engines.names(streams=True)

_prior_cache = jit(lambda model, X: model.prior_cache(X))


def _stream_progress(total_rows):
    from tqdm.auto import tqdm

    bar = tqdm(total=total_rows, desc="gpvi stream", unit="rows", unit_scale=True, file=sys.stderr, leave=False)
    state = {"done": 0}

    def on_batch(epoch, steps, rows_done, seconds):
        bar.update(rows_done - state["done"])
        state["done"] = rows_done
        bar.set_postfix(epoch=epoch + 1, rows_per_s=f"{rows_done / max(seconds, 1e-9):.3g}")

    on_batch.close = bar.close
    return on_batch


@watched
def fit_stream(model: Model, source, y=None, *, engine: str = "sfp", batch_size: int | None = None,
               epochs: int | None = 2, learn_hyperparameters=False, learn_inducing: bool = False,
               init: State | None = None, init_rows: int = 100_000, seed: int = 0, tol: float = 1e-6,
               max_iter: int | None = None, progress: bool = False, callback=None, on_state=None,
               engine_options: dict | None = None) -> FitResult:
    """Fit ``model`` by a stochastic engine reading minibatches from a stream.

    Parameters
    ----------
    model : ``gpvi.GLM`` or ``gpvi.SparseGP`` (an int ``inducing`` is placed by k-means on the
        first ``init_rows`` rows of the stream, in file order).
    source : a :class:`gpvi.stream.Stream`, in-memory ``X`` (N, D) with ``y`` (N,), or a
        ``.parquet`` / ``.csv`` / ``.npy`` path with ``y`` naming the target column (or y file);
        see :func:`gpvi.stream.as_stream`.  ``y`` values are checked batch by batch.
    engine : ``"sfp"`` (default) or ``"svi"``.
    batch_size, epochs : rows per minibatch (default min(N, 1024)) and passes over the data.
    max_iter : the most minibatch steps (None, the default: as many as ``epochs`` take).
    learn_hyperparameters, learn_inducing : as in :func:`gpvi.fit`, learned inside the engine
        (Adam for sfp, the svi optimiser for svi).
    init : starting :class:`State` (default the prior).
    engine_options : further engine options (``schedule``, ``learning_rate``, ``optimizer``,
        ``eval_every``, ``max_steps``, ``hyper_rate``, …; see the engines).
    progress : a progress bar on stderr with epochs and rows/s.
    callback : ``callback(iteration, vlb, seconds)`` at every trace row (each epoch, or every
        ``eval_every`` steps).
    on_state : ``on_state(model, state, progress)`` at the same points (the model learned so
        far; :class:`gpvi.engines.Progress`), e.g. for checkpoints or test metrics; the fit
        stops there, keeping that state, when it returns True.

    Returns
    -------
    FitResult, with ``vlb`` the mean minibatch estimate of the VLB over the last epoch (there is
    no full pass over a stream) and ``gap`` NaN.  Ctrl-C returns the state of the last
    completed step (``extras["interrupted"]``); a stream that fails part-way raises a
    :class:`~gpvi.engines._stochastic.StreamError` (a ValueError) whose ``result`` is the
    FitResult at the last completed step.
    """
    t0 = time.perf_counter()
    if engine not in stream_engines():
        raise ValueError(f"engine must be one of {stream_engines()} for a stream, got {engine!r}")
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gpvi GLM or SparseGP, got {type(model).__name__}")
    check_model(model, engine)
    stream = as_stream(source, y)
    N = stream.count_rows()
    options = dict(engine_options or {})
    bad = sorted(set(options) & {"hyperparameters", "on_batch", "on_state", "batch_size", "epochs", "seed"})
    if bad:
        raise ValueError(f"engine_options {bad} are fit_stream arguments")
    if isinstance(init_rows, bool) or not isinstance(init_rows, (int, np.integer)) or init_rows < 1:
        raise ValueError(f"init_rows must be a positive int, got {init_rows!r}")
    # Only k-means placement needs many rows; otherwise read just enough to check the model
    # (M ≤ N for given inducing inputs), so a stream is not read twice.
    Z = getattr(model, "inducing", None)
    need = int(init_rows) if Z is not None and np.ndim(Z) == 0 else (1 if Z is None else int(np.shape(Z)[0]))
    Xh, yh, _ = stream.head(min(need, N))
    model = model.initialise(check_X(Xh), model.likelihood.validate(yh), seed=seed)
    D = model.input_dim()
    if D is not None and stream.num_features is not None and D != stream.num_features:
        raise ValueError(f"the stream has {stream.num_features} feature columns but the model's inputs have {D}")
    d = model.num_weights(Xh)
    state = prior_state(d) if init is None else _check_init(init, d)
    names = []
    if learn_hyperparameters:
        learn = [learn_hyperparameters] if isinstance(learn_hyperparameters, str) else learn_hyperparameters
        names = _learned_names(model, learn, learn_inducing)
        unknown = unknown_parameters(model, names)
        if unknown:
            raise ValueError(f"learn_hyperparameters names unknown parameters {sorted(unknown)}")
    bar = _stream_progress(N * epochs if epochs else None) if progress else None
    release = _BLAS_LIMIT.acquire()
    run = _engines.get(engine).run

    def result(res):
        mdl = res.extras.pop("model", model)
        return FitResult(model=mdl, state=res.state, vlb=res.vlb, iterations=res.iterations,
                         converged=False, message=res.message, trace=res.trace, engine=engine,
                         evaluations=0, seconds=time.perf_counter() - t0,
                         prior=_prior_cache(mdl, np.asarray(Xh[:1], np.float64)), input_dim=stream.num_features,
                         backtracks=res.backtracks, clipped=res.clipped, extras=dict(res.extras), gap=float("nan"))

    try:
        res = run(StreamObjective(model, stream), state, tol=tol, max_iter=max_iter, callback=callback,
                  on_state=on_state, batch_size=batch_size, epochs=epochs, seed=seed,
                  hyperparameters=names or None, on_batch=bar, **options)
    except StreamError as err:
        if err.result is not None:
            err.result = result(err.result)
        raise
    finally:
        release()
        if bar is not None:
            bar.close()
    return result(res)


def as_sparse(fit: FitResult) -> FitResult:
    """A full-GP fit as the same posterior of a sparse GP whose inducing inputs are the training
    inputs (the whitened state carries over: both whiten by the Cholesky factor of K(X, X) with
    the same jitter); other fits unchanged."""
    import dataclasses

    from gpvi.models.base import GP, SparseGP
    from gpvi.models.multilatent import MultiLatent

    m = fit.model
    if isinstance(m, MultiLatent) and all(type(lat) is GP for lat in m.latents):
        # latent by latent (every latent of a MultiLatent.full has the training inputs)
        Z = np.asarray(fit.prior[0][0])
        sparse = MultiLatent(tuple(SparseGP(lat.kernel, None, inducing=Z, mean=lat.mean, jitter=lat.jitter)
                                   for lat in m.latents), m.likelihood)
        return dataclasses.replace(fit, model=sparse, prior=_prior_cache(sparse, Z))
    if not isinstance(m, GP):
        return fit
    Z = np.asarray(fit.prior[0])
    sparse = SparseGP(m.kernel, m.likelihood, inducing=Z, mean=m.mean, jitter=m.jitter)
    return dataclasses.replace(fit, model=sparse, prior=_prior_cache(sparse, Z))


def update(fit: FitResult, X, y, offset=None, *, batch_size: int = 4096) -> FitResult:
    """The posterior of ``fit`` updated by new rows ``(X, y)`` (online learning).

    Each minibatch of at most ``batch_size`` rows makes one assumed-density step
    (:func:`gpvi.engines.sfp.assumed_density_step`): the current ``q`` acts as the prior and the
    batch's data sums are added to its natural parameters (γ_i clipped at 0).  Hyperparameters
    stay fixed.  With a Gaussian likelihood the result is exact: the posterior given all rows
    seen so far.  ``y`` is in the likelihood's support (as for :func:`gpvi.fit`); ``vlb`` of the
    result is NaN (no full pass) and ``extras["rows_seen"]`` counts the rows added.

    With several latent functions (a :class:`~gpvi.models.multilatent.MultiLatent` of sparse
    GPs, e.g. softmax) the step is taken in every latent's block from the batch's per-latent
    sums (the diagonal blocks of the likelihood's curvature: a likelihood that couples the
    latents is linearised latent by latent, as in fpi's per-latent step).
    """
    from gpvi.engines.sfp import assumed_density_step

    model = fit.model
    check_model(model, "update")
    if isinstance(model, MultiLatent) and any(type(lat).__name__ == "GP" for lat in model.latents):
        raise ValueError("update needs sparse latents (a full GP has one weight per training row): convert the fit "
                         "with gpvi.fitting.stream.as_sparse first")
    X = check_X(X, "X")
    y = model.likelihood.validate(y)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
    D = model.input_dim() or fit.input_dim
    if D is not None and X.shape[1] != D:
        raise ValueError(f"X has {X.shape[1]} columns but the model was fitted on {D}")
    off = np.zeros(X.shape[0]) if offset is None else np.asarray(offset, dtype=np.float64)
    if off.shape != y.shape or not np.all(np.isfinite(off)):
        raise ValueError(f"offset must be a finite (N,) array matching X's {X.shape[0]} rows")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    state, blocks = fit.state, num_blocks(fit.state.mean.shape[-1])
    n = X.shape[0]
    B = min(int(batch_size), n)
    if isinstance(model, MultiLatent):
        state = _update_blocks(model, state, X, y, off, B)
    else:
        # V⁻¹ = I − S_state, carried from batch to batch (each step adds its S): one triangular
        # inverse of the fit's factor, not one per batch
        S_state = state_S(state.chol)
        for s in range(0, n, B):
            # fixed batch shape (padded, masked) so that one compiled program serves every batch
            idx = np.arange(s, s + B) % n
            mask = (np.arange(s, s + B) < n).astype(float)
            ch = Chunks(*jax.device_put((X[idx], y[idx], off[idx], mask)))  # (no staging programs)
            sums = minibatch_sums(model, fit.prior, ch, state, 1.0, blocks, clip_gamma=True)
            new = assumed_density_step(state, sums.grad, sums.S, S_state)
            if not (np.all(np.isfinite(np.asarray(new.mean))) and np.all(np.isfinite(np.asarray(new.chol)))):
                raise ValueError(f"the online update by rows {s}..{min(s + B, n) - 1} gave a non-finite posterior")
            state, S_state = new, S_state + sums.S
    extras = dict(fit.extras)
    extras["rows_seen"] = extras.get("rows_seen", 0) + n
    import dataclasses

    return dataclasses.replace(fit, state=state, vlb=float("nan"), converged=False, gap=float("nan"),
                               message=f"online update by {n} row(s) (assumed-density steps)", extras=extras)


def _update_blocks(model, state: State, X, y, off, B: int) -> State:
    """:func:`update`'s steps latent block by latent block: each batch's unscaled sums at the
    current state from an :class:`~gpvi.objective.Objective` on the batch (which pads the rows
    to a size bucket, so batches share compiled programs), then
    :func:`gpvi.engines.sfp.assumed_density_step` in every block."""
    from gpvi._batching import map_latents
    from gpvi.engines.sfp import assumed_density_step

    n = X.shape[0]
    S_state = state_S(state.chol if state.mean.ndim == 2 else state.chol[None])  # (Q, d, d), carried
    for s in range(0, n, B):
        sl = slice(s, min(s + B, n))
        sums = Objective(model, X[sl], y[sl], off[sl]).sums(state, clip_gamma=True)
        grad, S = (sums.grad, sums.S) if sums.grad.ndim == 2 else (sums.grad[None], sums.S[None])
        stacked = state if state.mean.ndim == 2 else State(state.mean[None], state.chol[None])
        new = map_latents(assumed_density_step, stacked, grad, S, S_state)
        if state.mean.ndim == 1:
            new = State(new.mean[0], new.chol[0])
        if not (np.all(np.isfinite(np.asarray(new.mean))) and np.all(np.isfinite(np.asarray(new.chol)))):
            raise ValueError(f"the online update by rows {s}..{sl.stop - 1} gave a non-finite posterior")
        state, S_state = new, S_state + S
    return state
