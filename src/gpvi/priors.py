"""Priors on hyperparameters: the search maximises ``VLB(θ) + log p(θ)`` instead of the VLB.

A hyperprior is a dict from parameter names to priors, given to :func:`gpvi.fit` as
``hyperprior=``; the names are the dotted names of :func:`gpvi.learnable_parameters`, and a
``*`` segment (``"latents.*.kernel.variance"``) gives every matching parameter the same prior.
Each prior is a normal density on the parameter's *unconstrained* value ``u``, the coordinate
the search moves in (``u = log θ`` for positive parameters, ``u = θ`` for unconstrained ones):

- :class:`LogNormal` ``(loc, scale)`` for positive parameters (variances, lengthscales, noise
  scales): ``log θ ~ N(loc, scale²)``.  As a density over ``θ`` this is the log-normal; because
  the search moves in ``log θ``, the maximum it finds is the mode of ``log θ``'s posterior
  (the Jacobian of ``θ = exp u`` is included), which is ``exp(loc)`` under the prior alone.
- :class:`Normal` ``(loc, scale)`` for unconstrained parameters (a constant prior mean, a slope).

Priors act only on the parameters being learned; the value a fit reports as its VLB (and its
trace) stays the VLB, and the prior's value at the end is ``FitResult.extras["log_prior"]``.
:func:`weak` builds the front ends' default (see :mod:`gpvi.fitting.defaults`): weakly
informative log-normal priors on the kernel variances and lengthscales, and on a regression's
noise, scaled to standardised data.

The log density and its gradient are closed forms evaluated in NumPy (no compiled program):
``log p(u) = −½((u − loc)/scale)² − log(scale·√(2π))`` summed over a parameter's elements
(and over the parameters a tied name stands for).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from gpvi._module import Module, matching_parameters

__all__ = ["Prior", "Normal", "LogNormal", "weak", "check_hyperprior", "LogPrior", "to_json", "from_json"]


@dataclasses.dataclass(frozen=True)
class Prior:
    """A normal density ``N(loc, scale²)`` on a parameter's unconstrained value (the base of
    :class:`Normal` and :class:`LogNormal`, which differ in the transform they accept)."""

    loc: float = 0.0
    scale: float = 1.0
    #: the parameter transform (``Module.transforms()``) this prior is written for
    transform = "real"

    def __post_init__(self):
        for name in ("loc", "scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(float(v)):
                raise ValueError(f"{type(self).__name__}: {name} must be a finite number, got {v!r}")
        if float(self.scale) <= 0:
            raise ValueError(f"{type(self).__name__}: scale must be positive, got {self.scale!r}")

    def log_density(self, u):
        """``(log p(u) summed over the elements of u, d log p / du)`` for unconstrained ``u``."""
        u = np.asarray(u, np.float64)
        z = (u - self.loc) / self.scale
        const = math.log(self.scale * math.sqrt(2.0 * math.pi))
        return float(np.sum(-0.5 * z * z - const)), -z / self.scale


class Normal(Prior):
    """``θ ~ N(loc, scale²)`` for a parameter without a constraint (e.g. a constant prior mean)."""


class LogNormal(Prior):
    """``log θ ~ N(loc, scale²)`` for a positive parameter: median ``exp(loc)``, and a factor
    ``exp(1.96·scale)`` either side of it holds 95 % of the prior mass."""

    transform = "positive"


def check_hyperprior(model: Module, hyperprior) -> dict:
    """``hyperprior`` (None or a dict of name → :class:`Prior`) checked against ``model``: a
    ``ValueError`` naming the entry for a name that matches no parameter, a value that is not a
    prior, or a prior on a parameter of another transform (a :class:`LogNormal` on an
    unconstrained parameter, a prior on ordinal bin edges).  Returns a plain dict (empty for None)."""
    if hyperprior is None:
        return {}
    if not isinstance(hyperprior, dict):
        raise ValueError("hyperprior must be None or a dict of parameter name -> prior (gpvi.priors.LogNormal, "
                         f"gpvi.priors.Normal), got {type(hyperprior).__name__}")
    trans = model.transforms()
    out = {}
    for name, prior in hyperprior.items():
        if not isinstance(name, str):
            raise ValueError(f"hyperprior: keys must be parameter names (str), got {name!r}")
        if not isinstance(prior, Prior):
            raise ValueError(f"hyperprior[{name!r}] must be a gpvi.priors.LogNormal or Normal, got {prior!r}")
        paths = matching_parameters(model, name)
        if not paths:
            raise ValueError(f"hyperprior: {name!r} names no parameter of {type(model).__name__}; "
                             f"known: {sorted(trans)}")
        for p in paths:
            if trans[p] != prior.transform:
                want = {"positive": "LogNormal", "real": "Normal"}.get(trans[p])
                hint = f"use gpvi.priors.{want}" if want else "no prior is available for it"
                raise ValueError(f"hyperprior[{name!r}]: {type(prior).__name__} does not fit parameter {p!r} "
                                 f"(transform {trans[p]!r}); {hint}")
        out[name] = prior
    return out


class LogPrior:
    """``log p(θ)`` of the learned parameters, in the search's coordinates.

    ``LogPrior(model, names, hyperprior)``: ``names`` the learned names (``*`` segments tie, as
    in :func:`gpvi.fitting.problem.learnable_parameters`), ``hyperprior`` checked by
    :func:`check_hyperprior`.  Called on the dict of unconstrained values that
    :func:`gpvi._module.flatten_params` gives (name → array), it returns ``(value, gradient)``,
    the gradient a dict of the same shapes.  A tied name carries the distinct priors of the
    parameters it stands for (each once: ``weak`` gives every latent the same prior, so a tied
    lengthscale has that one prior).  ``bool(log_prior)`` is False when no learned parameter has a prior.
    """

    def __init__(self, model: Module, names, hyperprior: dict):
        # for each learned name, the priors of the parameters it moves
        by_path = {}
        for key, prior in hyperprior.items():
            for p in matching_parameters(model, key):
                by_path[p] = prior  # a later, more specific entry overrides an earlier pattern
        self.terms = {}
        for n in names:
            paths = matching_parameters(model, n) if "*" in n.split(".") else [n]
            # a tied name is one parameter: each distinct prior of its matches counts once
            priors = list(dict.fromkeys(by_path[p] for p in paths if p in by_path))
            if priors:
                self.terms[n] = priors

    def __bool__(self):
        return bool(self.terms)

    def __call__(self, theta: dict):
        total, grad = 0.0, {}
        for n, u in theta.items():
            g = np.zeros(np.shape(u))
            for prior in self.terms.get(n, ()):
                v, dv = prior.log_density(u)
                total += v
                g = g + dv
            grad[n] = g
        return total, grad


def weak(model: Module, *, noise: bool = False, dimensions: int = 1) -> dict:
    """The front ends' default hyperprior for ``model`` on standardised inputs (and targets):

    - every kernel variance: ``LogNormal(0, 2)``, median 1 with 95 % of the mass in
      [0.02, 50] — the prior variance of a latent function on the scale of the standardised
      targets (regression) or of the link (log-odds, log-rates), where a variance of 1 000 means
      log-odds of ±60 that no finite data support.  (A scale of 1 kept the variance nearer 10
      but cost test NLPD on the easy multiclass sets: iris 0.049 → 0.081 against 0.061 with
      2; ``benchmarks/hyperprior.py``);
    - every kernel lengthscale: ``LogNormal(log √D, 1.5)`` for ``dimensions = D`` standardised
      features: median √D, the typical distance between rows, 95 % within a factor 19 of it, so
      that a lengthscale far beyond the spread of the data (a constant function of that input) or
      far below the distance between neighbours costs a few nats per lengthscale;
    - with ``noise=True`` (identity-link regression on standardised targets) the likelihood's
      ``variance`` (Gaussian) or ``scale`` (Laplace, Student-t): ``LogNormal(log 0.1, 1.5)``
      for a scale and ``LogNormal(2·log 0.1, 3)`` for a variance, median noise s.d. 0.1.

    Parameters the names do not fit (means, slopes, ordinal bin edges, warping, degrees of
    freedom, inducing inputs) get no prior.
    """
    D = max(1, int(dimensions))
    out = {}
    for path, transform in model.transforms().items():
        parts = path.split(".")
        if transform != "positive":
            continue
        in_kernel = "kernel" in parts[:-1]
        if in_kernel and parts[-1] == "variance":
            out[path] = LogNormal(0.0, 2.0)
        elif in_kernel and parts[-1] == "lengthscale":
            out[path] = LogNormal(0.5 * math.log(D), 1.5)
        elif noise and parts[-2:] == ["likelihood", "scale"]:
            out[path] = LogNormal(math.log(0.1), 1.5)
        elif noise and parts[-2:] == ["likelihood", "variance"]:
            out[path] = LogNormal(2.0 * math.log(0.1), 3.0)
    return out


_KINDS = {"Normal": Normal, "LogNormal": LogNormal}


def to_json(hyperprior: dict) -> dict:
    """A hyperprior as JSON-ready values (for model files): name → ``{"prior", "loc", "scale"}``."""
    return {name: {"prior": type(p).__name__, "loc": float(p.loc), "scale": float(p.scale)}
            for name, p in hyperprior.items()}


def from_json(spec: dict) -> dict:
    """Inverse of :func:`to_json`; a ``ValueError`` for an unknown prior."""
    out = {}
    for name, entry in spec.items():
        kind = _KINDS.get(entry.get("prior") if isinstance(entry, dict) else None)
        if kind is None:
            raise ValueError(f"hyperprior[{name!r}]: unknown prior {entry!r}; known: {sorted(_KINDS)}")
        out[name] = kind(entry["loc"], entry["scale"])
    return out
