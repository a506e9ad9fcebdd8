"""Engines as data: one :class:`Engine` record per engine, in one registry.

Everything that needs to know which engines exist or what one can do reads this registry:
:func:`gpvi.fit` (which data an engine needs, whether it takes several latent functions, how the
hyperparameters are learned with it), :func:`gpvi.fit_stream` (which engines run on a stream),
the command line's ``--engine`` choices, the documentation and the test sweep over engines.
Adding an engine is one module with a ``run`` function and one :func:`register` call::

    from gpvi.engines import Engine, register

    register(Engine("my-engine", my_run, "one line for --help and the docs", data="sums"))

after which ``gpvi.fit(model, X, y, engine="my-engine")`` and ``gpvi fit ... --engine my-engine``
use it.

The engine contract
-------------------
``run(objective, state, *, tol, tol_nats=None, max_iter, callback, on_state, **options)`` →
:class:`~gpvi.engines._common.EngineResult`, maximising the VLB of ``objective``
(:class:`~gpvi.objective.Objective`, or a :class:`~gpvi.objective.StreamObjective` for an engine
whose ``data`` is ``"minibatch"`` run by :func:`gpvi.fit_stream`) from ``state``;
``callback(iteration, vlb, seconds)`` after each iteration, and ``on_state(model, state,
progress)`` (:class:`~gpvi.engines._common.Progress`) with each iterate the engine traces: the
run ends with the message :data:`~gpvi.engines._common.STOPPED` when the hook returns True
(:class:`~gpvi.engines._common.Clock` does both).  ``tol_nats`` is optional (engines without a certificate leave it out);
``options`` are the engine's own keyword arguments, passed by ``gpvi.fit(engine_options=...)``
and listed by :attr:`Engine.options`.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

__all__ = ["Engine", "register", "unregister", "get", "names", "REGISTRY", "DATA_KINDS", "HYPERPARAMETER_KINDS"]

#: What an engine reads: ``"sums"`` only the data sums of the objective (so it runs on any
#: executor and on sources read block by block), ``"rows"`` the rows in memory, ``"minibatch"``
#: random minibatches (the stochastic engines).
DATA_KINDS = ("sums", "rows", "minibatch")
#: How hyperparameters are learned with an engine: ``"profile"`` by L-BFGS-B on the VLB at the
#: engine's optimum (or on the collapsed bound for Gaussian likelihoods), ``"joint"`` by the
#: engine itself together with q (its ``run`` takes ``hyperparameters=``), ``"own"`` by the
#: engine's own driver :attr:`Engine.learn`.
HYPERPARAMETER_KINDS = ("profile", "joint", "own")
#: Keyword arguments every ``run`` takes; the rest of its keywords are its options.
COMMON_ARGUMENTS = ("objective", "state", "tol", "tol_nats", "max_iter", "callback", "on_state", "hyperparameters")


@dataclasses.dataclass(frozen=True)
class Engine:
    """What gpvi knows about one inference engine.

    Parameters
    ----------
    name : the name users pass as ``engine=`` and ``--engine``.
    run : the engine (see the module docstring for its signature).
    summary : one line: the algorithm and its source, for ``--help`` and the docs.
    data : one of :data:`DATA_KINDS`.
    latents : whether it fits models with several latent functions (:class:`~gpvi.MultiLatent`).
    hyperparameters : one of :data:`HYPERPARAMETER_KINDS`.
    learn : the engine's own hyperparameter driver (``hyperparameters="own"`` only):
        ``learn(objective, state, names, *, tol, tol_nats, max_iter, max_rounds, callback,
        on_state, **options) -> (EngineResult, model, objective)``.
    streams : whether :func:`gpvi.fit_stream` can drive it over a stream of minibatches.
    evidence : what the profile hyperparameter search maximises with this engine: ``"vlb"``
        (the variational bound; Gaussian likelihoods use the collapsed bound, the same optimum)
        or ``"laplace"`` (the Laplace approximation to the marginal likelihood).
    """

    name: str
    run: Callable
    summary: str
    data: str = "rows"
    latents: bool = False
    hyperparameters: str = "profile"
    learn: Callable | None = None
    streams: bool = False
    evidence: str = "vlb"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or self.name.strip() != self.name:
            raise ValueError(f"Engine: name must be a non-empty string without surrounding spaces, got {self.name!r}")
        if not callable(self.run):
            raise ValueError(f"Engine {self.name!r}: run must be callable, got {type(self.run).__name__}")
        if self.data not in DATA_KINDS:
            raise ValueError(f"Engine {self.name!r}: data must be one of {DATA_KINDS}, got {self.data!r}")
        if self.hyperparameters not in HYPERPARAMETER_KINDS:
            raise ValueError(f"Engine {self.name!r}: hyperparameters must be one of {HYPERPARAMETER_KINDS}, "
                             f"got {self.hyperparameters!r}")
        if (self.learn is not None) != (self.hyperparameters == "own"):
            raise ValueError(f"Engine {self.name!r}: learn= is given exactly when hyperparameters='own'")
        if self.evidence not in ("vlb", "laplace"):
            raise ValueError(f"Engine {self.name!r}: evidence must be 'vlb' or 'laplace', got {self.evidence!r}")
        params = inspect.signature(self.run).parameters
        missing = [p for p in ("tol", "max_iter", "callback", "on_state") if p not in params]
        if missing:
            raise ValueError(f"Engine {self.name!r}: run must take the keyword arguments {missing} "
                             "(see gpvi.engines.registry)")
        if self.hyperparameters == "joint" and "hyperparameters" not in params:
            raise ValueError(f"Engine {self.name!r}: an engine that learns hyperparameters jointly takes "
                             "hyperparameters= (the dotted names to learn)")

    def __call__(self, objective, state, **kwargs):
        """Run the engine: ``engine(objective, state, ...)`` is ``engine.run(objective, state, ...)``."""
        return self.run(objective, state, **kwargs)

    @property
    def options(self) -> tuple[str, ...]:
        """The engine's own keyword arguments (what ``engine_options`` may hold)."""
        return tuple(n for n, p in inspect.signature(self.run).parameters.items()
                     if n not in COMMON_ARGUMENTS and p.kind is p.KEYWORD_ONLY)

    @property
    def default_max_iter(self) -> int | None:
        """The iteration limit of a run given ``max_iter=None``: the default of ``run``'s
        ``max_iter`` (``None`` for the stochastic engines: no cap, their epochs stop them), 500
        where ``run`` gives none."""
        p = inspect.signature(self.run).parameters["max_iter"]
        return 500 if p.default is inspect.Parameter.empty else p.default

    @property
    def certifies(self) -> bool:
        """Whether the engine stops on an estimated gap to the optimum (takes ``tol_nats``)."""
        return "tol_nats" in inspect.signature(self.run).parameters


#: name → :class:`Engine`, in registration order.
REGISTRY: dict[str, Engine] = {}


def register(engine: Engine, *, replace: bool = False) -> Engine:
    """Add ``engine`` to the registry (``replace=True`` to overwrite one of the same name)."""
    if not isinstance(engine, Engine):
        raise ValueError(f"register takes a gpvi.engines.Engine, got {type(engine).__name__}")
    if engine.name in REGISTRY and not replace:
        raise ValueError(f"an engine named {engine.name!r} is already registered (pass replace=True)")
    REGISTRY[engine.name] = engine
    return engine


def unregister(name: str) -> Engine:
    """Remove and return the engine called ``name``."""
    return REGISTRY.pop(get(name).name)


def get(name) -> Engine:
    """The engine called ``name``; a ``ValueError`` listing the registered names otherwise."""
    if isinstance(name, Engine):
        return name
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"engine must be one of {sorted(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def names(**where) -> list[str]:
    """Registered engine names, in registration order, whose attributes equal ``where``
    (e.g. ``names(streams=True)``, ``names(data="sums")``)."""
    for key in where:
        if key not in {f.name for f in dataclasses.fields(Engine)}:
            raise ValueError(f"names: Engine has no attribute {key!r}")
    return [n for n, e in REGISTRY.items() if all(getattr(e, k) == v for k, v in where.items())]
