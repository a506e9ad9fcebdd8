"""The checked problem of a :func:`gpvi.fit`: :func:`validate` turns fit's arguments into a
:class:`Problem` (or raises the ``ValueError`` that says which argument is wrong), and the
checks it is made of, which :func:`gpvi.fit_stream` and the estimators share."""
from __future__ import annotations

import dataclasses

import numpy as np

from gpvi import engines as _engines
from gpvi._compile import strong_parameters
from gpvi._module import unknown_parameters
from gpvi.data.executors import block_layout, resolve_executor
from gpvi.data.sources import ArraySource, Source
from gpvi.engines.registry import Engine
from gpvi.likelihoods.base import as_array, is_real_dtype
from gpvi.models.base import GP, Model, check_X
from gpvi.objective import State, as_device_array
from gpvi.priors import check_hyperprior

__all__ = ["Problem", "validate", "check_offset", "check_init", "learnable_parameters", "learned_names"]

#: Rows read for k-means placement of inducing inputs when the data come from a source.
KMEANS_SAMPLE = 100_000


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """What :func:`gpvi.fit` fits, checked.

    ``model`` is initialised on the rows used (``X``, ``y``, ``offset``: after ``subset``, and for
    a source the rows read to initialise it, see :func:`block_source`).  ``learn`` is False or
    the normalised ``learn_hyperparameters`` (True or a list of dotted names).  ``init`` is None,
    ``"prior"``, ``"laplace"`` or a checked :class:`~gpvi.objective.State` of ``d`` weights
    (``Q`` latents, None for a single-latent model).  With a source or an executor, ``source`` and
    its opened ``plan`` (which the fit closes); both None for an in-memory fit.
    """

    model: Model
    X: np.ndarray
    y: np.ndarray
    offset: np.ndarray | None
    engine: Engine
    learn: bool | list
    learn_inducing: bool
    init: State | str | None
    d: int
    Q: int | None
    options: dict
    subset: np.ndarray | None
    source: Source | None
    plan: object | None
    tol: float
    tol_nats: float | None
    max_iter: int | None  # None: the engine ends its run itself (sfp, svi: after their epochs)
    max_rounds: int
    chunk_size: int
    cache_bytes: int
    hyperprior: dict = dataclasses.field(default_factory=dict)
    #: why ``engine="auto"`` chose :attr:`engine` (empty when the engine was named)
    engine_choice: str = ""

    def learned_names(self, model: Model | None = None) -> list[str]:
        """The dotted names learned for ``model`` (default: the problem's)."""
        return learned_names(self.model if model is None else model, self.learn, self.learn_inducing)


def validate(model, X, y, *, engine, learn_hyperparameters, learn_inducing, tol, tol_nats, max_iter,
             offset, exposure, init, max_rounds, chunk_size, cache_bytes, seed, engine_options, subset,
             executor, hyperprior=None) -> Problem:
    """Check :func:`gpvi.fit`'s arguments (all but ``posterior``, ``components``, ``progress`` and
    ``callback``) and initialise the model on the data; a ``ValueError`` for the first wrong one."""
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gpvi GLM, GP or SparseGP, got {type(model).__name__}")
    if model.likelihood is None:
        raise ValueError("model has no likelihood")
    choice = ""
    if isinstance(engine, str) and engine == _engines.auto.AUTO:
        picked = _engines.auto.choose(model, blockwise=isinstance(X, Source) or executor is not None)
        eng, choice = picked.engine, picked.reason
    else:
        eng = _engines.get(engine)  # a ValueError listing the registered engines
    engine = eng.name
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol}")
    if tol_nats is not None and not (isinstance(tol_nats, (int, float, np.number)) and tol_nats >= 0
                                     and np.isfinite(tol_nats)):
        raise ValueError(f"tol_nats must be a non-negative number of nats or None, got {tol_nats!r}")
    if max_iter is None:  # the engine's own limit (its run's default)
        max_iter = eng.default_max_iter
    elif isinstance(max_iter, (bool, np.bool_)) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be an int ≥ 1 (or None: the engine's own limit), got {max_iter!r}")
    max_iter = None if max_iter is None else int(max_iter)
    if isinstance(max_rounds, (bool, np.bool_)) or not isinstance(max_rounds, (int, np.integer)) \
            or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int ≥ 1 (L-BFGS-B iterations), got {max_rounds!r}")
    if not isinstance(learn_inducing, (bool, np.bool_)):
        raise ValueError(f"learn_inducing must be True or False, got {learn_inducing!r}")
    learn = check_learn(model, learn_hyperparameters)
    if learn_inducing:
        check_learn_inducing(model, learn)
    source = plan = None
    blockwise = isinstance(X, Source) or executor is not None
    if blockwise:
        source, X, y = block_source(X, y, model, offset, exposure, subset, init, eng, seed)
    X = check_X(X, "X")
    if y is None:
        raise ValueError("y is required (it may be None only when X is a gpvi.data.sources Source)")
    y = as_array(y, "y")
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D array of observations, got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries: lengths must match")
    y = model.likelihood.validate(y)
    offset = check_offset(offset, X.shape[0])
    if exposure is not None:
        expo = check_offset(exposure, X.shape[0], "exposure")
        if np.any(expo <= 0):
            raise ValueError("exposure must be positive")
        offset = np.log(expo) + (0.0 if offset is None else offset)
    options = check_engine_options(engine_options, eng)
    if blockwise:
        if source is None:
            source = ArraySource(X, y, offset)
        plan = resolve_executor(executor).open(source, block_layout(source, chunk_size), model.likelihood,
                                               cache_bytes)
    try:  # the checks below close the plan they make useless
        if subset is not None:
            subset = check_subset(subset, X.shape[0], seed)
            X, y = X[subset], y[subset]
            offset = None if offset is None else offset[subset]
        model = strong_parameters(model.initialise(X, y, seed=seed))  # one compiled program per shape, not two
        D = model.input_dim()
        if D is not None and D != X.shape[1]:
            raise ValueError(f"X has {X.shape[1]} columns but the model's inputs have {D}")
        d = model.num_weights(X)
        Q = getattr(model, "num_latents", None)  # None: a single-latent model
        if Q is not None and (not eng.latents or init == "laplace" or source is not None):
            raise ValueError(f"engine={engine!r}: a model with {Q} latent functions runs on engine "
                             f"{' or '.join(map(repr, _engines.names(latents=True)))}, in memory, from "
                             "init='prior' or a State")
        if not (init is None or isinstance(init, str)):
            init = check_init(init, d, Q)
        elif init not in (None, "prior", "laplace"):
            raise ValueError(f"init must be 'prior', 'laplace' or a gpvi State, got {init!r}")
        hyperprior = check_hyperprior(model, hyperprior)
        if hyperprior and learn is False:
            raise ValueError("hyperprior applies only to hyperparameters being learned: pass "
                             "learn_hyperparameters=True (or a list of names), or hyperprior=None")
        if hyperprior and learn is not False and eng.hyperparameters != "profile":
            raise ValueError(f"hyperprior: engine={engine!r} learns the hyperparameters its own way "
                             f"({'jointly with q' if eng.hyperparameters == 'joint' else 'by its own driver'}), "
                             "without priors; use a profile-search engine ("
                             f"{', '.join(map(repr, _engines.names(hyperparameters='profile')))}) or hyperprior=None")
    except BaseException:
        if plan is not None:
            plan.close()
        raise
    return Problem(model=model, X=X, y=y, offset=offset, engine=eng, learn=learn, learn_inducing=bool(learn_inducing),
                   init=init, d=d, Q=Q, options=options, subset=subset, source=source, plan=plan, tol=tol,
                   tol_nats=tol_nats, max_iter=max_iter, max_rounds=max_rounds, chunk_size=chunk_size,
                   cache_bytes=cache_bytes, hyperprior=hyperprior, engine_choice=choice)


def check_learn(model: Model, learn_hyperparameters):
    """``learn_hyperparameters`` normalised: a bool, or a list of dotted names the model has."""
    if isinstance(learn_hyperparameters, str):
        learn_hyperparameters = [learn_hyperparameters]  # one dotted name
    if learn_hyperparameters is None or isinstance(learn_hyperparameters, (bool, np.bool_)):
        return bool(learn_hyperparameters)
    try:
        names = list(learn_hyperparameters)
    except TypeError:
        names = [None]
    if not all(isinstance(n, str) for n in names):
        raise ValueError("learn_hyperparameters must be True, False, a parameter name or a list of "
                         f"names such as ['kernel.lengthscale'], got {learn_hyperparameters!r}")
    check_known(model, names)
    return names


def check_known(model: Model, names) -> None:
    """A ``ValueError`` if ``learn_hyperparameters`` names parameters the model does not have."""
    unknown = unknown_parameters(model, names)
    if unknown:
        raise ValueError(f"learn_hyperparameters names unknown parameters {sorted(unknown)}; "
                         f"known: {sorted(model.transforms())}")


def check_offset(offset, N, name="offset"):
    """``offset`` (or ``exposure``, by ``name``) as an (N,) float array, or None; a scalar is
    repeated for every row."""
    if offset is None:
        return None
    off = as_array(offset, name)
    if not is_real_dtype(off.dtype):
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
    """Dotted names of the parameters :func:`gpvi.fit` learns by default: every parameter that is
    not fixed, less the inducing inputs and inducing lengthscales at any depth (``inducing``,
    ``latents.0.inducing``, ``kernel.kernel.inducing_lengthscale``) unless ``learn_inducing``.
    (Before, only the top-level names were left out, so a sparse ``MultiLatent`` learned its
    inducing inputs whatever ``learn_inducing`` said.)"""
    return [n for n, t in model.transforms().items()
            if t != "fixed" and (learn_inducing or n.rsplit(".", 1)[-1] not in ("inducing", "inducing_lengthscale"))]


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


def learned_names(model: Model, learn, learn_inducing: bool) -> list[str]:
    """The names :func:`gpvi.fit` learns for ``learn_hyperparameters=learn`` (True or a list of
    names) and ``learn_inducing``: with a list, ``learn_inducing=True`` adds the inducing inputs
    that the list does not already name."""
    if learn is True:
        return learnable_parameters(model, learn_inducing)
    names = list(learn)
    if learn_inducing:
        names += [n for n in _inducing_parameters(model) if not any(_covers(p, n) for p in names)]
    return names


def check_learn_inducing(model: Model, learn_hyperparameters) -> None:
    """``learn_inducing=True`` must have something to act on: never ignore it silently."""
    if not learn_hyperparameters:
        raise ValueError("learn_inducing=True learns the inducing inputs together with the hyperparameters, "
                         "but learn_hyperparameters is False: pass learn_hyperparameters=True or a list of "
                         "names (learn_hyperparameters=['inducing'] learns the inducing inputs alone)")
    if not _inducing_parameters(model):
        raise ValueError(f"learn_inducing=True, but the {type(model).__name__} has no learnable inducing inputs "
                         f"(its parameters: {sorted(model.transforms())}); drop learn_inducing, or use a "
                         "SparseGP with learn_hyperparameters")


def block_source(X, y, model, offset, exposure, subset, init, engine, seed):
    """``(source, X, y)`` for a block-wise fit.  With ``X`` a Source, the returned ``X``, ``y``
    are what ``model.initialise`` and fit's checks see: every row for a full GP (its prior needs
    them) or a small source, else a sample of at most :data:`KMEANS_SAMPLE` rows spread over all
    blocks (for k-means); with in-memory ``X`` the source is made after fit's checks (returned as
    None)."""
    engine = _engines.get(engine).name
    blockwise = _engines.names(data="sums")
    if engine not in blockwise or (isinstance(init, str) and init == "laplace"):
        what = f"engine={engine!r}" if engine not in blockwise else "init='laplace'"
        raise ValueError(f"{what} needs the rows in memory (executor=None and array X); use engine="
                         f"{' or '.join(repr(e) for e in blockwise)} with a source or an executor "
                         "(the stochastic engines read files through gpvi.fit_stream)")
    if subset is not None:
        raise ValueError("subset is not supported with a source or an executor: write the subset to its own file")
    if isinstance(X, Source):
        if y is not None:
            raise ValueError("y must be None when X is a gpvi.data.sources Source (the source holds the targets)")
        if offset is not None or exposure is not None:
            raise ValueError("offset/exposure must be columns of the source when X is a Source")
        source = X
        if isinstance(model, GP) or source.num_rows <= KMEANS_SAMPLE:
            Xs, ys, _ = source.read_all()
        else:
            rng = np.random.default_rng(seed)
            frac = KMEANS_SAMPLE / source.num_rows
            parts = []
            for j in range(source.num_blocks):
                Xb, yb, _ = source.read_block(j)
                keep = rng.random(Xb.shape[0]) < frac
                parts.append((Xb[keep], yb[keep]))
            Xs = np.concatenate([p[0] for p in parts])
            ys = np.concatenate([p[1] for p in parts])
        return source, Xs, ys
    return None, X, y


def check_engine_options(options, eng: Engine) -> dict:
    """``engine_options`` as a dict of keyword arguments the engine takes."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"engine_options must be a dict of keyword arguments, got {type(options).__name__}")
    bad = [k for k in options if k not in eng.options]
    if bad:
        raise ValueError(f"engine_options {bad} not accepted by engine {eng.name!r}; it takes {sorted(eng.options)} "
                         "(tol, tol_nats and max_iter are fit() arguments)")
    return dict(options)


def check_subset(subset, N, seed) -> np.ndarray:
    """The row indices of ``subset`` (an int: that many rows drawn with ``seed``; or indices)."""
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


def check_init(init, d, Q=None) -> State:
    """A starting ``State`` of ``d`` weights (``Q`` latents) checked and with a lower-triangular
    ``chol``."""
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
    return State(as_device_array(init.mean), as_device_array(C))
