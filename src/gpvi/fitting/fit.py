"""The fit driver, :func:`fit`: validate, run the engine, learn the hyperparameters.

:func:`fit` checks its arguments into a :class:`~gpvi.fitting.problem.Problem`
(:func:`gpvi.fitting.problem.validate`), makes the :class:`~gpvi.fitting.runner.Runner` that runs
the engine on it (objective, tolerances, callbacks, the counts summed over the runs, one BLAS
thread while it runs) and the starting state (:func:`gpvi.fitting.runner.start`), and hands over
to the hyperparameter strategy that :func:`gpvi.fitting.hyper.choose` reads off the engine record
and the model: none, the profile L-BFGS-B search, the collapsed bound of Gaussian likelihoods,
joint learning by the engine or the engine's own driver (see :mod:`gpvi.fitting.hyper`).  The
strategy's :class:`~gpvi.fitting.hyper.Outcome` becomes the :class:`FitResult`.  The mixture
posterior (``posterior="mog"``) is :func:`gpvi.fitting.mog.fit_mog`.
"""
from __future__ import annotations

import time

import numpy as np

from gpvi.fitting import hyper
from gpvi.fitting.posterior import FitResult, effective_jitter
from gpvi.fitting.problem import Problem, learnable_parameters, validate
from gpvi.fitting.runner import Runner, start
from gpvi.models.base import Model
from gpvi.objective import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK, State, as_device_array
from gpvi.priors import LogPrior
from gpvi._module import flatten_params
from gpvi._watchdog import watched
from gpvi._compile import jit

__all__ = ["fit", "FitResult", "learnable_parameters"]


@watched
def fit(model: Model, X, y=None, *, engine: str = "fpi", learn_hyperparameters=False,
        learn_inducing: bool = False, tol: float = 1e-6, tol_nats: float | None = None, max_iter: int | None = None,
        offset=None, exposure=None, init: State | str | None = None, max_rounds: int = 100,
        chunk_size: int = DEFAULT_CHUNK,
        cache_bytes: int = DEFAULT_CACHE_BYTES, seed: int = 0, progress: bool = False,
        callback=None, on_state=None, engine_options: dict | None = None, subset=None, executor=None,
        posterior: str = "gaussian", components: int = 1, hyperprior: dict | None = None) -> FitResult:
    """Fit a latent Gaussian model by variational inference.

    Parameters
    ----------
    model : ``gpvi.GLM``, ``gpvi.GP`` or ``gpvi.SparseGP``.
    X : (N, D) inputs; y : (N,) observations in the likelihood's support.
    engine : the name of a registered engine (:func:`gpvi.engines.names`): ``"fpi"`` (default),
        ``"fpb"``, ``"gradient"``, ``"dual"`` (Gaussian, Poisson and Bernoulli likelihoods),
        ``"laplace"``, the Jaakkola-Jordan/Taylor engines ``"jj"``, ``"taylor"``, ``"jj-hybrid"``,
        ``"jj-full"`` or the stochastic ``"svi"``, ``"sfp"``, ``"ivsgpr"`` (see :mod:`gpvi.engines`;
        its record decides how the hyperparameters are learned, see :mod:`gpvi.fitting.hyper`),
        or ``"auto"``: the certified engine measured fastest for the model's kind
        (:func:`gpvi.engines.auto.choose`; today ``fpi`` for every kind), named in
        ``FitResult.engine`` with the reason in ``FitResult.extras["engine_choice"]``.
    learn_hyperparameters : False, True (all learnable parameters, see
        :func:`learnable_parameters`), one dotted name such as ``"kernel.variance"`` or a list
        of them such as ``["kernel.lengthscale", "likelihood.variance"]``.  A ``*`` segment
        ties parameters: ``"latents.*.kernel.lengthscale"`` is one lengthscale shared by all
        latent functions of a :class:`~gpvi.models.multilatent.MultiLatent`.  A trailing ``[*]``
        ties the elements of an array: ``"kernel.lengthscale[*]"`` learns one lengthscale for
        every feature of an ARD kernel, which keeps its shape (the default estimators' first,
        isotropic stage, which then runs the same compiled programs as their ARD stage).  With
        ``engine="laplace"`` the Laplace approximate log marginal likelihood is maximised
        instead of the VLB (as in Sheth et al. 2015); it is in
        ``FitResult.extras["log_marginal"]``, and a maximum where the Laplace evidence exceeds
        the VLB of its own Gaussian by more than 0.1 nats per observation (separable data: the
        latent scale runs off and the probabilities go to 0.5) raises a ``ValueError``.
    learn_inducing : also learn the inducing inputs (sparse GP; and the inducing lengthscales of
        a multiscale kernel) with the hyperparameters, whether ``learn_hyperparameters`` is True
        or a list of names (they are added to the list).  A ``ValueError`` if there is nothing
        for it to do: ``learn_hyperparameters=False`` (use ``["inducing"]`` to learn only the
        inducing inputs) or a model without inducing inputs.
    tol : relative tolerance.  Every engine stops, and reports ``converged=True``, only when
        its estimate of the distance to the optimum, ``VLB* − VLB`` in nats (``FitResult.gap``),
        is at most ``0.1 · tol · max(1, |VLB|)``, so that any two engines agree to ``tol``
        relative; the hyperparameter L-BFGS-B stops when the bound changes by at most
        ``tol · max(1, |VLB|)`` between rounds.
    tol_nats : an absolute threshold (nats) for the engines' estimated gap instead.
    max_iter : the most iterations of each engine run, counted as the run reports them
        (``FitResult.iterations``): steps of the deterministic engines, minibatch steps of the
        stochastic ones (sfp, svi, ivsgpr).  None (the default): the engine's own limit, 500
        steps for the deterministic engines and ivsgpr; sfp and svi end after their ``epochs``.
    offset : (N,) values added to every latent (e.g. ``log`` exposure); ``exposure``:
        (N,) positive exposures for count models, turned into ``offset = log(exposure)``.
    init : starting ``State``, ``"prior"`` (the default, ``N(0, I)``) or ``"laplace"`` (the
        Laplace approximation, the initialiser of Sheth et al. 2015).
    max_rounds : iteration limit of the hyperparameter L-BFGS-B (each iteration runs the
        engine to convergence, warm-started, at every point it evaluates).
    chunk_size, cache_bytes : most rows per chunk of the data sums (the chunks are made equal,
        see :func:`gpvi.objective.make_chunks`); memory allowed for caching the projections of
        all rows.
    seed : for k-means placement of inducing inputs.
    progress : show a progress bar (iteration, VLB, elapsed) on stderr.
    callback : called as ``callback(iteration, vlb, seconds)`` after every iteration.
    on_state : called as ``on_state(model, state, progress)`` with every state the fit traces, to
        watch it (a checkpoint, a test error) or to stop it: each iterate of the engine runs the
        trace shows, and after every round of the hyperparameter search the model at that
        round and the engine's optimum there (``state`` is None in the rounds of the collapsed
        bound, which forms no q until the search ends).  ``progress`` is a
        :class:`gpvi.engines.Progress` (``iteration``, ``vlb``, ``seconds`` since the fit
        started, ``round``: the search round, or None inside an engine run).  Returning True
        stops the fit there: an engine run ends at that iterate; a hyperparameter search ends
        at that round and keeps the best hyperparameters it evaluated, at which q is then
        fitted (unwatched, from the state the search had), so the result is a usable
        posterior.  The search's or the engine's message then says "stopped by on_state"; a
        fit stopped inside an engine run is not ``converged``.
    engine_options : extra keyword arguments for the engine's ``run`` (e.g.
        ``{"clip_gamma": "always"}`` for fpi/fpb, ``{"history": 50}`` for gradient).
    subset : subset of data (Sheth et al. 2015, §5): an int ``n`` (a random subset of ``n``
        rows, drawn with ``seed``) or an array of row indices; only those rows are used.
    executor : where the data pass runs (:mod:`gpvi.data.executors`): None (in this process, on
        in-memory chunks: the fastest path for data that fits), ``"local"`` (in this process,
        block by block, keeping at most ``cache_bytes`` of rows and projections in memory),
        ``"devices"`` (the same, blocks spread over every JAX device, e.g. several GPUs), an
        executor from :mod:`gpvi.data.executors` or a ``dask.distributed.Client`` (blocks kept on the
        cluster's workers).  ``X`` may also be a
        :class:`gpvi.data.sources.Source` (``NpySource``, ``ParquetSource``: files read block by block
        in every pass) with ``y=None``.  Every executor gives the same result; engines that keep
        per-row state (``dual``, ``laplace``, ``init="laplace"``) need the default.

    posterior : ``"gaussian"`` (default; the paper's FULL) or ``"mog"``: a mixture of
        ``components`` diagonal Gaussians (Nguyen & Bonilla 2014: MIX, MIX2 = 2 components) over
        a full GP's latents (or all latents of a ``MultiLatent`` of full GPs), fitted by L-BFGS-B
        on the mixture bound (:func:`gpvi.fitting.mog.fit_mog`).  The result is a
        :class:`gpvi.fitting.mog.MoGResult`, a ``FitResult`` with the same predictions (of the
        mixture), trace, ``callback``, ``progress`` and model files.  ``model``, ``X``, ``y``,
        ``learn_hyperparameters``, ``seed``, ``progress``, ``callback`` and ``components`` apply
        to it; any other option set to other than its default is a ``ValueError`` (call
        :func:`~gpvi.fitting.mog.fit_mog` for the L-BFGS-B's ``max_iter`` and ``tol``).

    hyperprior : None (default: maximum likelihood-II, the bound alone) or a dict of parameter
        name → prior (:mod:`gpvi.priors`: ``LogNormal`` for positive parameters, ``Normal`` for
        unconstrained ones; ``*`` segments as in ``learn_hyperparameters``): the search then
        maximises ``VLB + log p(θ)`` over the learned parameters (the profile search and the
        collapsed bound; engines that learn θ their own way refuse it).  ``gpvi.priors.weak(model,
        dimensions=D)`` is the front ends' weakly informative default for standardised data.
        ``FitResult.vlb`` and the trace stay the VLB; ``extras["log_prior"]`` is ``log p(θ)`` at
        the learned θ.

    Returns
    -------
    FitResult
    """
    if posterior != "gaussian":
        # Nguyen & Bonilla's mixture of diagonal Gaussians (MIX: components=1, MIX2: 2), by L-BFGS
        if posterior != "mog":
            raise ValueError(f"posterior must be 'gaussian' or 'mog', got {posterior!r}")
        if not isinstance(learn_inducing, (bool, np.bool_)) or learn_inducing:
            raise ValueError("learn_inducing must be False with posterior='mog' (a mixture posterior over full "
                             "GPs, which have no inducing inputs)")
        import inspect
        import numbers

        # the options of the Gaussian path: each must keep its default (or say the same thing)
        given = {"engine": engine, "tol": tol, "tol_nats": tol_nats, "max_iter": max_iter, "offset": offset,
                 "exposure": exposure, "init": init, "max_rounds": max_rounds, "chunk_size": chunk_size,
                 "cache_bytes": cache_bytes, "engine_options": engine_options, "subset": subset,
                 "executor": executor, "hyperprior": hyperprior, "on_state": on_state}
        defaults = inspect.signature(fit).parameters
        same = {"init": ("prior",), "engine_options": ({},)}  # spelled otherwise, the default
        unused = [name for name, value in given.items()
                  if not (value is None and defaults[name].default is None
                          or isinstance(value, (str, numbers.Real, dict)) and not isinstance(value, bool)
                          and (value == defaults[name].default or value in same.get(name, ())))]
        if unused:
            raise ValueError(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply with "
                             "posterior='mog' (L-BFGS-B on the mixture bound of a full GP, on all rows, without "
                             "an offset); gpvi.fitting.mog.fit_mog takes the L-BFGS-B's max_iter and tol")
        from gpvi.fitting.mog import fit_mog

        return fit_mog(model, X, y, components=components, learn_hyperparameters=learn_hyperparameters,
                       seed=seed, callback=callback, progress=progress)
    if not (isinstance(components, (int, np.integer)) and not isinstance(components, bool) and components == 1):
        raise ValueError(f"components={components!r} applies only with posterior='mog' (a mixture of that many "
                         "Gaussians); the default Gaussian posterior is one component")
    t0 = time.perf_counter()
    problem = validate(model, X, y, engine=engine, learn_hyperparameters=learn_hyperparameters,
                       learn_inducing=learn_inducing, tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                       offset=offset, exposure=exposure, init=init, max_rounds=max_rounds, chunk_size=chunk_size,
                       cache_bytes=cache_bytes, seed=seed, engine_options=engine_options, subset=subset,
                       executor=executor, hyperprior=hyperprior)
    with Runner(problem, t0, progress, callback, on_state) as runner:
        state, obj = start(problem)  # obj: the Laplace start's Objective, reused by the first run
        outcome = hyper.choose(problem)(problem, runner, state, obj)
    return _result(problem, runner, outcome)


_prior_cache = jit(lambda model, X: model.prior_cache(X))


def _result(problem: Problem, runner: Runner, outcome: hyper.Outcome) -> FitResult:
    """The :class:`FitResult` of a strategy's outcome, with the runner's counts."""
    res, counts = outcome.res, runner.counts
    seconds = time.perf_counter() - runner.t0
    prior = _prior_cache(outcome.model, as_device_array(problem.X)) if outcome.prior is None else outcome.prior
    return FitResult(model=outcome.model, state=res.state, vlb=res.vlb, iterations=counts.iterations,
                     converged=bool(res.converged and np.isfinite(res.vlb)), message=outcome.message,
                     trace=outcome.trace, engine=problem.engine.name, backtracks=counts.backtracks,
                     cycles=counts.cycles, evaluations=counts.evaluations, hyperparameter_rounds=outcome.rounds,
                     seconds=seconds, prior=prior, chunk_size=problem.chunk_size, input_dim=problem.X.shape[1],
                     clipped=counts.clipped, subset=problem.subset, extras=_extras(problem, outcome), gap=float(res.gap),
                     search_message=outcome.search or hyper.NOT_LEARNED, jitter=_jitter(outcome.model, prior),
                     learned=tuple(problem.learned_names(outcome.model)) if problem.learn else ())


def _jitter(model, prior) -> float:
    """The relative jitter the prior's factorisation used (:func:`effective_jitter`); NaN for a
    prior cache of a form it does not know (a model of the user's own), which the fit does not fail on."""
    try:
        return effective_jitter(model, prior)
    except (TypeError, ValueError, AttributeError, IndexError):
        return float("nan")


def _extras(problem: Problem, outcome: hyper.Outcome) -> dict:
    """The last engine run's extras, with ``log_prior`` (log p(θ) at the learned θ) under a hyperprior."""
    extras = dict(outcome.res.extras)
    if problem.engine_choice:
        extras["engine_choice"] = problem.engine_choice
    if problem.hyperprior and problem.learn is not False:
        names = problem.learned_names(outcome.model)
        extras["log_prior"] = LogPrior(outcome.model, names, problem.hyperprior)(
            flatten_params(outcome.model, names))[0]
    return extras
