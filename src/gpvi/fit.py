"""The fit driver: validate data, run an engine, optionally learn hyperparameters.

Hyperparameters (kernel and likelihood parameters, the constant mean, ordinal bin edges and
optionally the inducing inputs) are learned by L-BFGS-B on the *profile* bound
``F(θ) = max_q VLB(θ, q)`` (DESIGN §3): every evaluation first runs the engine to
convergence, warm-started from the previous optimum, and then differentiates the VLB in the
unconstrained hyperparameters by autodiff with the whitened ``(m, V)`` held fixed.  At the
inner optimum that is the exact gradient of ``F`` (envelope theorem).  Because the
fixed-point engines converge in a handful of iterations, each evaluation is cheap; this is
much faster than alternating single steps, which zig-zags like EM.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
import threadpoolctl
from threadpoolctl import threadpool_limits

from . import collapsed, warmstart
from ._compile import strong_parameters
from ._module import flatten_params, unflatten_params, unknown_parameters
from .engines import ENGINES
from .engines.laplace import check_learned_hyperparameters, laplace_log_marginal_at
from .executors import BlockObjective, block_layout, resolve_executor
from .likelihoods import Bernoulli, Ordinal, _as_array, _is_real_dtype
from .models import GP, Model, _check_X
from .objective import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK, Objective, State, bucketable, make_chunks, \
    full_gp_latents, prior_inputs, prior_state, vlb_envelope, vlb_in_hyperparameters
from .predict import latent_moments, likelihood_call
from .sources import ArraySource, Source
from ._watchdog import paused, watched

__all__ = ["fit", "FitResult", "learnable_parameters"]


@dataclasses.dataclass
class FitResult:
    """A fitted variational posterior and how it was obtained.

    Attributes
    ----------
    model : the model with the hyperparameters (and inducing inputs) the fit ended with.
    state : ``State(mean, chol)`` of ``q(w)`` in whitened coordinates.
    vlb : final variational lower bound, nats summed over the data.
    iterations : engine iterations summed over every engine run of the fit, like
        ``evaluations`` (passes over the data) and the safeguard counts below.  Without learned
        hyperparameters that is the one run's count.  When they are learned by the profile
        L-BFGS-B search, the engine runs (warm-started) at every point the search evaluates and
        once more at the learned hyperparameters, and every one of those runs counts, so
        ``iterations ≥ hyperparameter_rounds`` (a search of 8 rounds that ends on a converged
        warm start does not read 0).  On the collapsed bound (Gaussian likelihood) each
        evaluation of the bound is the optimal ``q`` in closed form and counts as one iteration
        (and one pass in ``evaluations``), plus the final engine run at the learned θ.  Engines
        that learn the hyperparameters themselves report their own totals: ``jj``/``taylor``/
        ``jj-hybrid``/``jj-full`` their analytic rounds plus L-BFGS-B steps on the collapsed
        bound, the stochastic engines (``svi``, ``sfp``, ``ivsgpr``) their steps.
    converged, message : of the last engine run; ``message`` says why it stopped (and how many
        hyperparameter rounds ran).  ``converged`` means the engine certified its state: the
        estimated gap below was at most the tolerance (see :func:`fit`'s ``tol`` and ``tol_nats``).
    evaluations : passes over the data, summed over every engine run of the fit (see ``iterations``).
    hyperparameter_rounds : L-BFGS-B iterations of the hyperparameter search (the profile or the
        collapsed bound's; the L-BFGS-B steps of the jj/taylor drivers); 0 when none ran.
    gap : the estimated distance ``VLB* − VLB`` (nats) of the final state from the optimum at
        the final hyperparameters (:func:`gpvi.engines._common.estimated_gap`; for the dual
        engine the duality gap where strong duality holds; NaN for the Laplace engine, which
        does not maximise the VLB).
    trace : (K, 2) array of (seconds since the start of the fit, VLB) per iteration.
    backtracks, cycles, clipped : safeguard events of the fixed-point engines (0 for others),
        summed over every engine run of the fit: damped (VLB-lowering) steps, detected
        2-cycles, steps that clipped γ_i at 0.
    subset : indices of the training rows used (subset of data), or None for all rows.
    extras : engine-specific numbers of the last engine run (see ``EngineResult.extras``).
    """

    model: Model
    state: State
    vlb: float
    iterations: int
    converged: bool
    message: str
    trace: np.ndarray
    engine: str
    backtracks: int = 0
    cycles: int = 0
    evaluations: int = 0
    hyperparameter_rounds: int = 0
    seconds: float = 0.0
    prior: object = dataclasses.field(default=None, repr=False)
    chunk_size: int = DEFAULT_CHUNK
    input_dim: int | None = None  # columns of the training X, checked at predict time
    clipped: int = 0
    subset: np.ndarray | None = dataclasses.field(default=None, repr=False)
    extras: dict = dataclasses.field(default_factory=dict)
    gap: float = float("nan")

    @property
    def diagnostics(self) -> dict:
        """Whether the fixed-point iterates were damped, cycled or had γ clipped (Sheth &
        Khardon 2016, Theorem 1 and §4), with the counts."""
        return {"damped": self.backtracks > 0, "cycled": self.cycles > 0, "clipped": self.clipped > 0,
                "backtracks": self.backtracks, "cycles": self.cycles, "clipped_steps": self.clipped}

    # ---- predictions -------------------------------------------------------------------
    def _X(self, X, offset):
        X = _check_X(X, "X")
        D = self.model.input_dim()
        if D is None:
            D = self.input_dim
        if D is not None and X.shape[1] != D:
            raise ValueError(f"X has {X.shape[1]} columns but the model was fitted on {D}")
        return X, _check_offset(offset, X.shape[0])

    def predict_f(self, X, offset=None):
        """Latent mean and variance at ``X`` (N, D): two (N,) arrays."""
        X, offset = self._X(X, offset)
        m, v = latent_moments(self.model, self.prior, self.state, X, offset, self.chunk_size)
        return np.asarray(m), np.asarray(v)

    def predict_y(self, X, offset=None):
        """Predictive mean and variance of the observation at ``X``: two (N,) arrays.

        For Bernoulli the mean is ``P(y = 1)``; for ordinal it is the expected level.
        """
        m, v = self.predict_f(X, offset)
        mean, var = likelihood_call(self.model.likelihood, "predict_mean_and_var", m, v)
        return np.asarray(mean), np.asarray(var)

    def predict_proba(self, X, offset=None):
        """Class probabilities: (N, 2) for Bernoulli (columns: negative, positive class),
        (N, L) for ordinal levels 0..L−1."""
        lik = self.model.likelihood
        if hasattr(lik, "predict_proba"):  # several classes (Softmax): (N, C)
            m, v = self.predict_f(X, offset)
            return np.asarray(likelihood_call(lik, "predict_proba", m, v))
        from .montecarlo import MonteCarlo

        if isinstance(lik, MonteCarlo):  # predictions are the wrapped likelihood's
            lik = lik.likelihood
        if not isinstance(lik, (Bernoulli, Ordinal)):
            raise ValueError(f"predict_proba needs a Bernoulli or Ordinal likelihood, not {type(lik).__name__}")
        m, v = self.predict_f(X, offset)
        if isinstance(lik, Bernoulli):
            p, _ = likelihood_call(lik, "predict_mean_and_var", m, v)
            p = np.asarray(p)
            return np.stack([1.0 - p, p], axis=1)
        return np.asarray(likelihood_call(lik, "level_probabilities", m, v))

    def log_predictive_density(self, X, y, offset=None):
        """Per-point ``log p(y* | data)`` at inputs ``X``: an (N,) array."""
        X, offset = self._X(X, offset)
        y = self.model.likelihood.validate(y)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
        m, v = latent_moments(self.model, self.prior, self.state, X, offset, self.chunk_size)
        return np.asarray(likelihood_call(self.model.likelihood, "predictive_log_density", y, m, v))


def _check_offset(offset, N, name="offset"):
    if offset is None:
        return None
    off = _as_array(offset, name)
    if not _is_real_dtype(off.dtype):
        raise ValueError(f"{name} must be numeric (real), got dtype {off.dtype}")
    off = off.astype(np.float64)
    if off.ndim == 0:
        off = np.full(N, float(off))
    if off.shape != (N,):
        raise ValueError(f"{name} must have one entry per row ({N}), got shape {off.shape}")
    if not np.all(np.isfinite(off)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return off


def learnable_parameters(model: Model, learn_inducing: bool = False) -> list[str]:
    """Dotted names of the parameters :func:`fit` learns by default."""
    return [n for n, t in model.transforms().items()
            if t != "fixed" and (learn_inducing or n not in ("inducing", "kernel.inducing_lengthscale"))]


def _inducing_parameters(model: Model) -> list[str]:
    """Dotted names of the model's learnable inducing inputs (and inducing lengthscales of a
    multiscale kernel), at any depth (``inducing``, ``latents.0.inducing``): what
    ``learn_inducing=True`` adds to the learned parameters."""
    return [n for n, t in model.transforms().items()
            if t != "fixed" and n.rsplit(".", 1)[-1] in ("inducing", "inducing_lengthscale")]


def _covers(pattern: str, name: str) -> bool:
    """Whether ``pattern`` (a dotted name, ``*`` segments tying parameters) includes ``name``."""
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(a == "*" or a == b for a, b in zip(p, n))


def _learned_names(model: Model, learn, learn_inducing: bool) -> list[str]:
    """The names :func:`fit` learns for ``learn_hyperparameters=learn`` (True or a list of names)
    and ``learn_inducing``: with a list, ``learn_inducing=True`` adds the inducing inputs that the
    list does not already name."""
    if learn is True:
        return learnable_parameters(model, learn_inducing)
    names = list(learn)
    if learn_inducing:
        names += [n for n in _inducing_parameters(model) if not any(_covers(p, n) for p in names)]
    return names


def _check_learn_inducing(model: Model, learn_hyperparameters) -> None:
    """``learn_inducing=True`` must have something to act on: never ignore it silently."""
    if not learn_hyperparameters:
        raise ValueError("learn_inducing=True learns the inducing inputs together with the hyperparameters, "
                         "but learn_hyperparameters is False: pass learn_hyperparameters=True or a list of "
                         "names (learn_hyperparameters=['inducing'] learns the inducing inputs alone)")
    if not _inducing_parameters(model):
        raise ValueError(f"learn_inducing=True, but the {type(model).__name__} has no learnable inducing inputs "
                         f"(its parameters: {sorted(model.transforms())}); drop learn_inducing, or use a "
                         "SparseGP with learn_hyperparameters")


def _progress_callback(progress, engine):
    if not progress:
        return None
    from tqdm.auto import tqdm

    bar = tqdm(desc=f"gpvi {engine}", unit="it", file=sys.stderr, leave=False)

    def cb(iteration, vlb, seconds):
        bar.update(1)
        bar.set_postfix(vlb=f"{vlb:.6g}", seconds=f"{seconds:.2f}")

    cb.close = bar.close
    return cb


class _SharedBlasLimit:
    """One BLAS thread while any :func:`fit` runs, shared by all threads of the process.

    BLAS thread limits are process-wide (``openblas_set_num_threads``), and a per-call
    ``threadpool_limits`` made concurrent fits 5-30x slower than the same fits in a row
    (OpenBLAS's spinning threads then fight XLA for the cores), for two reasons:

    - each call saved and restored the process's limit, so the first fit to finish put
      OpenBLAS back on every core while the other was still running (and a fit that started
      inside another one saved the other's 1 as "the original");
    - threadpoolctl >= 3.8 lets only one thread at a time change the limits of a pthreads
      OpenBLAS (the first that calls it, for as long as it lives unless it lets go) and silently
      ignores the others; a bare ``threadpool_limits`` call never lets go, so after one fit in
      the main thread no fit in any other thread was limited at all.

    Here the first active fit sets the limit and the last one to finish restores the limits
    the first one found; a lock makes the count and the set/restore one step, and each
    set/restore lets go of threadpoolctl's control at once, so the next one can come from any
    thread.  (If another thread holds that control, e.g. inside the user's own
    ``with threadpool_limits(...)``, the limits are that thread's to decide and are left alone.)
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._limiter = None

    @staticmethod
    def _let_go():
        cls = getattr(threadpoolctl, "OpenBLASController", None)
        clear = getattr(cls, "clear_controlling_thread", None)  # threadpoolctl >= 3.8
        if clear is not None:
            clear()  # only if this thread holds the control

    def acquire(self):
        """Hold the limit; returns a zero-argument function that releases it (once)."""
        with self._lock:
            if self._active == 0:
                try:
                    self._limiter = threadpool_limits(limits=1, user_api="blas")
                finally:
                    self._let_go()
            self._active += 1
        released = []

        def release():
            with self._lock:
                if released:
                    return
                released.append(True)
                self._active -= 1
                if self._active == 0:
                    limiter, self._limiter = self._limiter, None
                    try:
                        limiter.restore_original_limits()
                    finally:
                        self._let_go()

        return release


_BLAS_LIMIT = _SharedBlasLimit()


@watched
def fit(model: Model, X, y=None, *, engine: str = "fpi", learn_hyperparameters=False,
        learn_inducing: bool = False, tol: float = 1e-6, tol_nats: float | None = None, max_iter: int = 500,
        offset=None, exposure=None, init: State | str | None = None, max_rounds: int = 100,
        chunk_size: int = DEFAULT_CHUNK,
        cache_bytes: int = DEFAULT_CACHE_BYTES, seed: int = 0, progress: bool = False,
        callback=None, engine_options: dict | None = None, subset=None, executor=None,
        posterior: str = "gaussian", components: int = 1) -> FitResult:
    """Fit a latent Gaussian model by variational inference.

    Parameters
    ----------
    model : ``gpvi.GLM``, ``gpvi.GP`` or ``gpvi.SparseGP``.
    X : (N, D) inputs; y : (N,) observations in the likelihood's support.
    engine : ``"fpi"`` (default), ``"fpb"``, ``"gradient"``, ``"dual"`` (Gaussian, Poisson and
        Bernoulli likelihoods) or ``"laplace"`` (see :mod:`gpvi.engines`).
    learn_hyperparameters : False, True (all learnable parameters, see
        :func:`learnable_parameters`), one dotted name such as ``"kernel.variance"`` or a list
        of them such as ``["kernel.lengthscale", "likelihood.variance"]``.  A ``*`` segment
        ties parameters: ``"latents.*.kernel.lengthscale"`` is one lengthscale shared by all
        latent functions of a :class:`~gpvi.multilatent.MultiLatent`.  With
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
    max_iter : iteration limit of each engine run.
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
    engine_options : extra keyword arguments for the engine's ``run`` (e.g.
        ``{"clip_gamma": "always"}`` for fpi/fpb, ``{"history": 50}`` for gradient).
    subset : subset of data (Sheth et al. 2015, §5): an int ``n`` (a random subset of ``n``
        rows, drawn with ``seed``) or an array of row indices; only those rows are used.
    executor : where the data pass runs (:mod:`gpvi.executors`): None (in this process, on
        in-memory chunks: the fastest path for data that fits), ``"local"`` (in this process,
        block by block, keeping at most ``cache_bytes`` of rows and projections in memory),
        ``"devices"`` (the same, blocks spread over every JAX device, e.g. several GPUs), an
        executor from :mod:`gpvi.executors` or a ``dask.distributed.Client`` (blocks kept on the
        cluster's workers).  ``X`` may also be a
        :class:`gpvi.sources.Source` (``NpySource``, ``ParquetSource``: files read block by block
        in every pass) with ``y=None``.  Every executor gives the same result; engines that keep
        per-row state (``dual``, ``laplace``, ``init="laplace"``) need the default.

    posterior : ``"gaussian"`` (default; the paper's FULL) or ``"mog"``: a mixture of
        ``components`` diagonal Gaussians (Nguyen & Bonilla 2014: MIX, MIX2 = 2 components) over
        a full GP's latents (or all latents of a ``MultiLatent`` of full GPs), fitted by L-BFGS (:func:`gpvi.mog.fit_mog`, which returns a
        :class:`gpvi.mog.MoGResult`; the engine options do not apply).

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
        from .mog import fit_mog

        return fit_mog(model, X, y, components=components, learn_hyperparameters=learn_hyperparameters,
                       seed=seed)
    t0 = time.perf_counter()
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gpvi GLM, GP or SparseGP, got {type(model).__name__}")
    if model.likelihood is None:
        raise ValueError("model has no likelihood")
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol}")
    if tol_nats is not None and not (isinstance(tol_nats, (int, float, np.number)) and tol_nats >= 0
                                     and np.isfinite(tol_nats)):
        raise ValueError(f"tol_nats must be a non-negative number of nats or None, got {tol_nats!r}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be at least 1, got {max_iter}")
    if isinstance(max_rounds, (bool, np.bool_)) or not isinstance(max_rounds, (int, np.integer)) \
            or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int ≥ 1 (L-BFGS-B iterations), got {max_rounds!r}")
    if not isinstance(learn_inducing, (bool, np.bool_)):
        raise ValueError(f"learn_inducing must be True or False, got {learn_inducing!r}")
    if isinstance(learn_hyperparameters, str):
        learn_hyperparameters = [learn_hyperparameters]  # one dotted name
    if learn_hyperparameters is None or isinstance(learn_hyperparameters, (bool, np.bool_)):
        learn_hyperparameters = bool(learn_hyperparameters)
    else:
        try:
            names = list(learn_hyperparameters)
        except TypeError:
            names = [None]
        if not all(isinstance(n, str) for n in names):
            raise ValueError("learn_hyperparameters must be True, False, a parameter name or a list of "
                             f"names such as ['kernel.lengthscale'], got {learn_hyperparameters!r}")
        unknown = unknown_parameters(model, names)
        if unknown:
            raise ValueError(f"learn_hyperparameters names unknown parameters {sorted(unknown)}; "
                             f"known: {sorted(model.transforms())}")
        learn_hyperparameters = names
    if learn_inducing:
        _check_learn_inducing(model, learn_hyperparameters)
    source = None
    blockwise = isinstance(X, Source) or executor is not None
    if blockwise:
        source, X, y = _block_source(X, y, model, offset, exposure, subset, init, engine, seed)
    X = _check_X(X, "X")
    if y is None:
        raise ValueError("y is required (it may be None only when X is a gpvi.sources Source)")
    y = _as_array(y, "y")
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array of observations, got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries: lengths must match")
    y = model.likelihood.validate(y)
    offset = _check_offset(offset, X.shape[0])
    if exposure is not None:
        expo = _check_offset(exposure, X.shape[0], "exposure")
        if np.any(expo <= 0):
            raise ValueError("exposure must be positive")
        offset = np.log(expo) + (0.0 if offset is None else offset)
    options = _check_engine_options(engine_options, ENGINES[engine])
    if blockwise:
        if source is None:
            source = ArraySource(X, y, offset)
        plan = resolve_executor(executor).open(source, block_layout(source, chunk_size), model.likelihood,
                                               cache_bytes)
    if subset is not None:
        subset = _check_subset(subset, X.shape[0], seed)
        X, y = X[subset], y[subset]
        offset = None if offset is None else offset[subset]
    model = strong_parameters(model.initialise(X, y, seed=seed))  # one compiled program per shape, not two
    D = model.input_dim()
    if D is not None and D != X.shape[1]:
        raise ValueError(f"X has {X.shape[1]} columns but the model's inputs have {D}")

    run = ENGINES[engine]
    prog = _progress_callback(progress, engine)
    t_offset = [0.0]

    def cb(iteration, vlb, seconds, shift=True):
        for f in (prog, callback):
            if f is not None:
                with paused():
                    f(iteration, vlb, seconds + (t_offset[0] if shift else 0.0))

    takes_gap = "tol_nats" in inspect.signature(run).parameters

    def infer(mdl, start, tol_, quiet=False, obj=None, **extra):
        if obj is None and source is not None:
            obj = BlockObjective(mdl, source, plan=plan, prior_X=X if isinstance(mdl, GP) else None)
            obj.check_prior()
        elif obj is None:
            obj = Objective(mdl, X, y, offset, chunk_size=chunk_size, cache_bytes=cache_bytes)
            obj.check_prior()
        t_offset[0] = time.perf_counter() - t0
        if callable(start):  # a warm start that depends on the new prior (gpvi.warmstart)
            start = start(obj)
        if takes_gap:
            # inner runs of the hyperparameter search use tol·1e-3, and so tol_nats·1e-3
            gap_kw = {"tol_nats": None if tol_nats is None else tol_nats * tol_ / tol}
        else:
            gap_kw = {}
        res = run(obj, start, tol=tol_, max_iter=max_iter, callback=None if quiet else cb, **gap_kw,
                  **options, **extra)
        trace = res.trace.copy()
        trace[:, 0] += t_offset[0]
        return obj, res, trace

    d = model.num_weights(X)
    Q = getattr(model, "num_latents", None)  # None: a single-latent model
    if Q is not None and (engine not in ("fpi", "gradient") or init == "laplace" or source is not None):
        raise ValueError(f"engine={engine!r}: a model with {Q} latent functions runs on engine 'fpi' or "
                         "'gradient', in memory, from init='prior' or a State")
    if not (init is None or isinstance(init, str)):
        init = _check_init(init, d, Q)
    elif init not in (None, "prior", "laplace"):
        raise ValueError(f"init must be 'prior', 'laplace' or a gpvi State, got {init!r}")
    # On the CPU, jaxlib's Cholesky and triangular solves call SciPy's OpenBLAS, whose idle
    # threads keep spinning after each small M×M step and steal the cores XLA needs for the
    # next O(N·M²) data pass (measured: an fpi iteration 76 → 40 ms at N = 20 000, M = 200).
    # One limit for the whole process while any fit runs (see _SharedBlasLimit).
    release_blas = _BLAS_LIMIT.acquire()
    obj = None  # the Laplace start's Objective is reused by the first engine run
    if init == "laplace":
        try:
            obj, init = _laplace_init(model, X, y, offset, chunk_size, cache_bytes)
        except BaseException:
            release_blas()
            raise
    state = prior_state(d, Q) if init in (None, "prior") else init
    own_learn = getattr(run, "learn", None) if learn_hyperparameters else None
    if own_learn is not None:
        # engines with their own hyperparameter driver (jj, taylor, jj-hybrid, jj-full: the
        # alternation of Izmailov & Kropotov 2017 instead of the profile L-BFGS-B below)
        return _fit_own_learn(own_learn, model, X, y, offset, state, obj, learn_hyperparameters, learn_inducing,
                              tol, tol_nats, max_iter, max_rounds, chunk_size, cache_bytes, subset, options,
                              engine, cb, t_offset, t0, release_blas, prog)
    # Engines that learn θ jointly with q (run.learns_hyperparameters: the stochastic engines)
    # take the names and return the learned model in extras["model"]; no profile search.
    joint = bool(learn_hyperparameters) and getattr(run, "learns_hyperparameters", False)
    learned = joint
    collapsed_fit = None
    try:
        if joint:
            names = _learned_names(model, learn_hyperparameters, learn_inducing)
            obj, res, trace = infer(model, state, tol, obj=obj, hyperparameters=names)
            model = res.extras.pop("model", model)
        else:
            if learn_hyperparameters and source is None and collapsed.applies(model, engine):
                # Gaussian likelihood: θ on the closed-form collapsed bound (gpvi.collapsed), one
                # factorisation per evaluation; the engine then runs once, at the learned θ, for q.
                names = _learned_names(model, learn_hyperparameters, learn_inducing)
                # (rounds, rows, evaluations of the bound)
                model, *collapsed_fit = collapsed.learn(model, names, X, y, offset, tol=tol, max_rounds=max_rounds,
                                                        chunk_size=chunk_size, t0=t0,
                                                        callback=lambda i, v, s: cb(i, v, s, shift=False))
                learn_hyperparameters, obj = False, None
            obj, res, trace = infer(model, state, tol, obj=obj)
            # ivsgpr learns θ and Z whatever learn_hyperparameters says (it is the algorithm)
            learned = "model" in res.extras
            model = res.extras.pop("model", model)
        traces = [trace]
        rounds = 0
        # backtracks, cycles, data passes, clipped steps, iterations: summed over every engine run
        counts = [res.backtracks, res.cycles, res.evaluations, res.clipped, res.iterations]
        if learn_hyperparameters and not joint:
            names = _learned_names(model, learn_hyperparameters, learn_inducing)
            unknown = unknown_parameters(model, names)
            if unknown:
                raise ValueError(f"learn_hyperparameters names unknown parameters {sorted(unknown)}; "
                                 f"known: {sorted(model.transforms())}")
            model, rounds, hyper_trace = _learn(model, names, X, y, offset, res.state, infer, tol,
                                                max_rounds, chunk_size, counts, t0, cb,
                                                laplace=engine == "laplace", blockwise=source is not None)
            obj, res, trace = infer(model, hyper_trace.pop("state"), tol)
            traces = [np.asarray(hyper_trace["rows"]).reshape(-1, 2)]
            counts[0] += res.backtracks
            counts[1] += res.cycles
            counts[2] += res.evaluations
            counts[3] += res.clipped
            counts[4] += res.iterations
        if collapsed_fit is not None:
            # each evaluation of the collapsed bound is the optimal q in closed form: one iteration
            # (and one pass over the data) of an inner run that converged at once
            counts[2] += collapsed_fit[2]
            counts[4] += collapsed_fit[2]
    finally:
        release_blas()
        if prog is not None:
            prog.close()
        if source is not None:
            plan.close()
    backtracks, cycles, evals, clipped, iterations = counts
    message = res.message
    if joint:
        message = f"{message}; hyperparameters learned jointly by the engine"
    elif learn_hyperparameters:
        message = f"{message}; hyperparameters: {rounds} L-BFGS-B iteration(s)"
    if collapsed_fit is not None:
        rounds, traces = collapsed_fit[0], [collapsed_fit[1], traces[0]]
        message = f"{message}; hyperparameters: {rounds} L-BFGS-B iteration(s) on the collapsed bound"
    return FitResult(model=model, state=res.state, vlb=res.vlb, iterations=iterations,
                     converged=bool(res.converged and np.isfinite(res.vlb)), message=message, trace=np.concatenate(traces),
                     engine=engine, backtracks=backtracks, cycles=cycles, evaluations=evals,
                     hyperparameter_rounds=rounds, seconds=time.perf_counter() - t0,
                     prior=_prior_cache(model, jnp.asarray(X)) if learned else obj.prior, chunk_size=chunk_size, input_dim=X.shape[1], clipped=clipped,
                     subset=subset, extras=dict(res.extras), gap=float(res.gap))


#: Engines that use only the data sums (Objective.sums/vlb), so they run on any executor.
_BLOCKWISE_ENGINES = frozenset({"fpi", "fpb", "gradient"})
#: Rows read for k-means placement of inducing inputs when the data come from a source.
_KMEANS_SAMPLE = 100_000


def _block_source(X, y, model, offset, exposure, subset, init, engine, seed):
    """``(source, X, y)`` for a block-wise fit.  With ``X`` a Source, the returned ``X``, ``y``
    are what ``model.initialise`` and fit's checks see: every row for a full GP (its prior needs
    them) or a small source, else a sample of at most 100 000 rows spread over all blocks (for
    k-means); with in-memory ``X`` the source is made after fit's checks (returned as None)."""
    if engine not in _BLOCKWISE_ENGINES or (isinstance(init, str) and init == "laplace"):
        what = f"engine={engine!r}" if engine not in _BLOCKWISE_ENGINES else "init='laplace'"
        raise ValueError(f"{what} needs the rows in memory (executor=None and array X); use engine="
                         f"{' or '.join(repr(e) for e in sorted(_BLOCKWISE_ENGINES))} with a source or an executor "
                         "(the stochastic engines read files through gpvi.fit_stream)")
    if subset is not None:
        raise ValueError("subset is not supported with a source or an executor: write the subset to its own file")
    if isinstance(X, Source):
        if y is not None:
            raise ValueError("y must be None when X is a gpvi.sources Source (the source holds the targets)")
        if offset is not None or exposure is not None:
            raise ValueError("offset/exposure must be columns of the source when X is a Source")
        source = X
        if isinstance(model, GP) or source.num_rows <= _KMEANS_SAMPLE:
            Xs, ys, _ = source.read_all()
        else:
            rng = np.random.default_rng(seed)
            frac = _KMEANS_SAMPLE / source.num_rows
            parts = []
            for j in range(source.num_blocks):
                Xb, yb, _ = source.read_block(j)
                keep = rng.random(Xb.shape[0]) < frac
                parts.append((Xb[keep], yb[keep]))
            Xs = np.concatenate([p[0] for p in parts])
            ys = np.concatenate([p[1] for p in parts])
        return source, Xs, ys
    return None, X, y


_prior_cache = jax.jit(lambda model, X: model.prior_cache(X))


def _fit_own_learn(own_learn, model, X, y, offset, state, obj, learn, learn_inducing, tol, tol_nats, max_iter,
                   max_rounds, chunk_size, cache_bytes, subset, options, engine, cb, t_offset, t0, release_blas,
                   prog):
    """:func:`fit` with hyperparameters learned by an engine's own driver (``run.learn``)."""
    try:
        names = _learned_names(model, learn, learn_inducing)
        if obj is None:
            obj = Objective(model, X, y, offset, chunk_size=chunk_size, cache_bytes=cache_bytes)
            obj.check_prior()
        t_offset[0] = time.perf_counter() - t0
        res, model, obj = own_learn(obj, state, names, tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                               max_rounds=max_rounds, callback=cb, **options)
        trace = res.trace.copy()
        trace[:, 0] += t_offset[0]
    finally:
        release_blas()
        if prog is not None:
            prog.close()
    return FitResult(model=model, state=res.state, vlb=res.vlb, iterations=res.iterations,
                     converged=bool(res.converged and np.isfinite(res.vlb)), message=res.message, trace=trace,
                     engine=engine, evaluations=res.evaluations,
                     hyperparameter_rounds=int(res.extras.get("lbfgsb_steps", 0)),
                     seconds=time.perf_counter() - t0, prior=obj.prior, chunk_size=chunk_size, input_dim=X.shape[1],
                     subset=subset, extras=dict(res.extras), gap=float(res.gap))


def _check_engine_options(options, run):
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"engine_options must be a dict of keyword arguments, got {type(options).__name__}")

    params = inspect.signature(run).parameters
    reserved = {"tol", "tol_nats", "max_iter", "callback", "hyperparameters"}
    bad = [k for k in options if k in reserved or k not in params]
    if bad:
        allowed = sorted(k for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in reserved)
        raise ValueError(f"engine_options {bad} not accepted by this engine; it takes {allowed} "
                         "(tol, tol_nats and max_iter are fit() arguments)")
    return dict(options)


def _check_subset(subset, N, seed):
    if np.ndim(subset) == 0:
        if isinstance(subset, (bool, np.bool_)) or int(subset) != subset or not (1 <= int(subset) <= N):
            raise ValueError(f"subset must be an int in [1, {N}] or an array of row indices, got {subset!r}")
        return np.sort(np.random.default_rng(seed).choice(N, int(subset), replace=False))
    idx = np.asarray(subset)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError("subset must be an int or a non-empty 1-D array of integer row indices")
    if idx.min() < -N or idx.max() >= N:
        raise ValueError(f"subset has row indices outside [0, {N})")
    idx = np.where(idx < 0, idx + N, idx)
    if np.unique(idx).size != idx.size:
        raise ValueError("subset has repeated row indices")
    return idx


def _laplace_init(model, X, y, offset, chunk_size, cache_bytes):
    """``(objective, state)``: the Laplace approximation as a starting state (Sheth et al.
    2015, §5), with the Objective it was computed on."""
    if "laplace" not in ENGINES:
        raise ValueError("init='laplace' needs the laplace engine, which is not available")
    obj = Objective(model, X, y, offset, chunk_size=chunk_size, cache_bytes=cache_bytes)
    obj.check_prior()
    return obj, ENGINES["laplace"](obj, prior_state(obj.dim)).state


def _check_init(init, d, Q=None):
    lead = () if Q is None else (Q,)
    if not isinstance(init, State) or init.mean.shape != lead + (d,) or init.chol.shape != lead + (d, d):
        shp = ", ".join(map(str, lead + (d,)))
        raise ValueError(f"init must be 'prior', 'laplace' or a gpvi State with mean ({shp}) and chol ({shp}, {d})")
    C = np.asarray(init.chol, np.float64)
    if not np.all(np.isfinite(C)) or not np.all(np.isfinite(np.asarray(init.mean))):
        raise ValueError("init contains NaN or infinite values")
    if np.any(np.triu(C, 1)):
        # The data passes need a lower-triangular factor: re-factorise V = C Cᵀ.
        try:
            C = np.linalg.cholesky(C @ np.swapaxes(C, -1, -2))
        except np.linalg.LinAlgError:
            raise ValueError("init.chol @ init.chol.T must be positive definite") from None
    return State(jnp.asarray(init.mean, jnp.float64), jnp.asarray(C))


def _neg_vlb(theta, model, X, chunks, state):
    return -vlb_in_hyperparameters(unflatten_params(model, theta), X, chunks, state)


_neg_vlb_and_grad = jax.jit(jax.value_and_grad(_neg_vlb))


def _neg_envelope(theta, model, prior, chunks, state, proj, blocks, likelihood):
    return -vlb_envelope(unflatten_params(model, theta), prior, chunks, state, blocks, proj, likelihood)


_neg_envelope_grad = jax.jit(jax.grad(_neg_envelope), static_argnames=("blocks", "likelihood"))


def _neg_laplace(theta, model, X, chunks, mode, clip=False):
    return -laplace_log_marginal_at(unflatten_params(model, theta), X, chunks, mode, clip)


_neg_laplace_and_grad = jax.jit(jax.value_and_grad(_neg_laplace), static_argnames=("clip",))


#: Loosest relative tolerance of the inner engine runs of the hyperparameter search (see
#: ``_learn``).  Capped at tol before, the early runs converged q to 1e-7 of the bound while
#: the rounds still gained tens of nats: USPS 4-7-9 with one learned kernel shared by three
#: softmax latents took 94 passes, 74 with this cap (same optimum to 1e-8 relative).  A looser
#: fraction of the gain (1e-2 instead of 1e-3) cost more L-BFGS-B rounds than it saved.
INNER_TOL_CAP = 1e-2


def _inner_tol(gain, vlb, tol, strict):
    """Relative tolerance of the inner runs when a round of the search gains ``gain`` nats at a
    bound of ``vlb``: a gap of 1e-3 of the gain, within [strict, max(tol, INNER_TOL_CAP)]."""
    return min(max(tol, INNER_TOL_CAP), max(strict, 1e-2 * gain / max(1.0, abs(vlb))))


def _learn(model, names, X, y, offset, state, infer, tol, max_rounds, chunk_size, counts, t0, cb,
           laplace=False, blockwise=False):
    """L-BFGS-B on the profile bound; returns (model, iterations, trace dict).

    ``counts`` (backtracks, cycles, passes over the data, clipped steps, engine iterations) is
    incremented by every inner engine run, so that the fit reports totals over the search.

    With ``laplace`` the objective is the Laplace log marginal likelihood, its gradient by the
    one-Newton-step construction of :func:`gpvi.engines.laplace.laplace_log_marginal_at`; the
    trace still records the VLB of each accepted point's Laplace posterior.
    """
    theta0 = flatten_params(model, names)
    flat0, unravel = jax.flatten_util.ravel_pytree(theta0)
    chunks = None if blockwise else make_chunks(X, y, offset, chunk_size, bucketed=bucketable(model))
    # padded rows share compiled programs (the block-wise path has its own fixed block shapes)
    Xj = jnp.asarray(X) if blockwise else prior_inputs(model, jnp.asarray(X), chunks)
    # Inner runs need only be as exact as the search's progress requires (issue 19): their gap
    # threshold is 1e-3 of the bound's last gain between L-BFGS-B iterations (of the gain the
    # first step predicts in the first round), with a relative tol between tol·1e-3 (near the
    # end) and INNER_TOL_CAP (early, while rounds gain many nats).  A fixed tol·1e-3 made fpi crawl
    # through hundreds of slowly contracting iterations per evaluation once the kernel variance
    # grew (banana, 1 300 rows, sparse logistic: 3 117 passes, two runs stopped at max_iter).
    strict = max(tol * 1e-3, 1e-13)
    # Full GPs: the hypergradient of the profile bound with q held fixed in function space
    # (gpvi.objective.vlb_envelope); the likelihood's parameters then need one pass of the data.
    envelope = not laplace and not blockwise and full_gp_latents(model)
    lik_learned = any(n.split(".")[0] == "likelihood" for n in names)
    inner = {"tol": tol}
    memo = {"state": state, "best": (-np.inf, None, state)}
    rows = []
    vlbs = {}  # VLB of the Laplace posterior at each evaluated point (laplace only)

    def fun(x):
        theta = unravel(jnp.asarray(x))
        mdl = unflatten_params(model, theta)
        try:
            prev = memo.get("obj")
            start = memo["state"] if prev is None else lambda o: warmstart.carry(prev, o, memo["state"])
            new_obj, res, _ = infer(mdl, start, inner["tol"], quiet=True)
        except np.linalg.LinAlgError:
            return np.inf, np.zeros_like(x)
        counts[0] += res.backtracks
        counts[1] += res.cycles
        counts[2] += res.evaluations
        counts[3] += res.clipped
        counts[4] += res.iterations
        if not np.isfinite(res.vlb):
            return np.inf, np.zeros_like(x)
        if laplace:
            val, g = _neg_laplace_and_grad(theta, model, Xj, chunks, res.state.mean,
                                           clip=res.extras.get("hessian") == "clipped")
            vlbs[np.asarray(x).tobytes()] = res.vlb
        elif blockwise:  # the same value and gradient, block by block on the fit's executor
            val, g = new_obj.neg_vlb_and_grad(theta, model, res.state)
        elif envelope:  # full GPs: q held fixed over the training latents (no Cholesky derivative)
            val = -res.vlb
            g = _neg_envelope_grad(theta, model, new_obj.prior, new_obj.chunks, res.state, new_obj.proj,
                                   new_obj.blocks, lik_learned)
        else:
            val, g = _neg_vlb_and_grad(theta, model, Xj, chunks, res.state)
        g = np.asarray(jax.flatten_util.ravel_pytree(g)[0])
        if not np.isfinite(float(val)) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)
        memo["state"], memo["obj"] = res.state, new_obj  # warm start for the next evaluation
        score = -float(val) if laplace else res.vlb
        if score > memo["best"][0]:
            memo["best"] = (score, np.array(x), res.state)
        return float(val), g

    def traced(x, f):
        return vlbs.get(np.asarray(x).tobytes(), -f) if laplace else -f

    def record(intermediate_result):
        rows.append((time.perf_counter() - t0, traced(intermediate_result.x, float(intermediate_result.fun))))
        inner["tol"] = _inner_tol(abs(rows[-1][1] - rows[-2][1]), rows[-1][1], tol, strict)
        cb(len(rows) - 1, rows[-1][1], rows[-1][0], shift=False)

    x0 = np.asarray(flat0)
    f0, g0 = fun(x0)
    first = {"x": x0.copy(), "out": (f0, g0)}
    if np.isfinite(f0):
        # L-BFGS-B's first trial step has unit length along −g: it predicts a gain of |g| nats,
        # the scale for the inner runs of the first round (as the last gain is for later ones)
        inner["tol"] = _inner_tol(float(np.linalg.norm(g0)), -f0, tol, strict)

    def fun_once(x):
        # L-BFGS-B's first call is at x0, which was just evaluated (an inner fit and a
        # hypergradient: ~10 s on USPS, three coupled 1233-point latents): answer it from there.
        if first["x"] is not None and np.array_equal(x, first["x"]):
            first["x"] = None
            return first["out"][0], np.array(first["out"][1])
        return fun(x)

    if not np.isfinite(f0):
        # Nothing to start the search from; returning the start with "converged" would hide it.
        raise ValueError("the bound or its gradient in the hyperparameters is not finite at the starting "
                         f"hyperparameters {names}; check their values (or fit without learning them)")
    rows.append((time.perf_counter() - t0, traced(x0, f0)))
    out = scipy.optimize.minimize(fun_once, x0, jac=True, method="L-BFGS-B", callback=record,
                                  options=dict(maxiter=max_rounds, ftol=tol, gtol=1e-9))
    best_vlb, best_x, best_state = memo["best"]
    if best_x is None:
        return model, int(out.nit), {"rows": rows, "state": state}
    learned = unflatten_params(model, unravel(jnp.asarray(best_x)))
    if laplace:
        # On (nearly) separable data the Laplace evidence is largest where the approximation is
        # useless (a huge latent scale, probabilities near 0.5): refuse such a maximum.
        check_learned_hyperparameters(learned, names, best_vlb, vlbs[best_x.tobytes()], X.shape[0])
    return learned, int(out.nit), {"rows": rows, "state": best_state}


import jax.flatten_util  # noqa: E402  (registers jax.flatten_util)
