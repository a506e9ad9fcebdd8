"""Priors on hyperparameters: the search maximises ``VLB(θ) + log p(θ)`` instead of the VLB.

A hyperprior is a dict from parameter names to priors, given to :func:`gpvi.fit` as
``hyperprior=``; the names are the dotted names of :func:`gpvi.learnable_parameters`, and a
``*`` segment (``"latents.*.kernel.variance"``) gives every matching parameter the same prior.

Every prior is evaluated as a density on the parameter's *unconstrained* value ``u``, the
coordinate the search moves in (``u = log θ`` for positive parameters, ``u = θ`` for
unconstrained ones), and the search maximises ``VLB + Σ log p(u)`` over ``u``.  For a positive
parameter this includes the Jacobian of ``θ = e^u``: ``log p(u) = log p_θ(e^u) + u``, so the
maximiser is the mode of the posterior of ``log θ`` (not of ``θ``), and under the prior alone it is
the value given for each class below (the median ``exp(loc)`` for LogNormal, the mean ``α/β`` for
Gamma, ``σ`` for HalfNormal), not the mode of ``p_θ``.

- :class:`LogNormal` ``(loc, scale)`` for positive parameters (variances, lengthscales, noise
  scales): ``log θ ~ N(loc, scale²)``, i.e. ``log p(u) = log N(u | loc, scale²)``.
- :class:`Gamma` ``(concentration α, rate β)`` for positive parameters:
  ``p_θ(θ) = β^α θ^{α−1} e^{−βθ} / Γ(α)``, so ``log p(u) = α log β − log Γ(α) + α u − β e^u``.
- :class:`HalfNormal` ``(scale σ)`` for positive parameters:
  ``p_θ(θ) = √(2/π)/σ · exp(−θ²/(2σ²))``, so ``log p(u) = ½ log(2/π) − log σ + u − e^{2u}/(2σ²)``.
- :class:`Normal` ``(loc, scale)`` for unconstrained parameters (a constant prior mean, a slope).

Priors act only on the parameters being learned; the value a fit reports as its VLB (and its
trace) stays the VLB, and the prior's value at the end is ``FitResult.extras["log_prior"]`` (the
sum of the ``log p(u)`` above, Jacobians included), so the maximised objective is
``FitResult.vlb + extras["log_prior"]``.
:func:`weak` builds the front ends' default (see :mod:`gpvi.fitting.defaults`): weakly
informative log-normal priors on the kernel variances and lengthscales, and on a regression's
noise, scaled to standardised data.

The log densities and their gradients are closed forms evaluated in NumPy (no compiled program),
summed over a parameter's elements (and over the parameters a tied name stands for).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from gpvi._module import Module, matching_parameters, ravel_values

__all__ = ["Prior", "Normal", "LogNormal", "Gamma", "HalfNormal", "weak", "check_hyperprior", "LogPrior",
           "to_json", "from_json"]


def _check_number(owner, name, v, positive=False):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(v)):
        raise ValueError(f"{owner}: {name} must be a finite number, got {v!r}")
    if positive and float(v) <= 0:
        raise ValueError(f"{owner}: {name} must be positive, got {v!r}")


@dataclasses.dataclass(frozen=True)
class Prior:
    """A normal density ``N(loc, scale²)`` on a parameter's unconstrained value (the base of
    every prior: :class:`Normal` and :class:`LogNormal` are this density and differ in the
    transform they accept; :class:`Gamma` and :class:`HalfNormal` override
    :meth:`log_density` and their fields)."""

    loc: float = 0.0
    scale: float = 1.0
    #: the parameter transform (``Module.transforms()``) this prior is written for
    transform = "real"

    def __post_init__(self):
        for name in ("loc", "scale"):
            _check_number(type(self).__name__, name, getattr(self, name))
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
    ``exp(1.96·scale)`` either side of it holds 95 % of the prior mass.  The search maximises
    ``log N(u | loc, scale²)`` in ``u = log θ`` (the log-normal density of θ times the Jacobian θ),
    whose maximiser under the prior alone is ``θ = exp(loc)``."""

    transform = "positive"


@dataclasses.dataclass(frozen=True)
class Gamma(Prior):
    """``θ ~ Gamma(concentration α, rate β)`` for a positive parameter (mean ``α/β``, variance
    ``α/β²``; SciPy's ``gamma(a=α, scale=1/β)``).

    Evaluated in the search's coordinate ``u = log θ`` with the Jacobian of ``θ = e^u``:
    ``log p(u) = α log β − log Γ(α) + α u − β e^u`` (the Gamma log density at ``e^u`` plus ``u``),
    ``d log p/du = α − β e^u``.  This is what the search adds to the VLB and what
    ``extras["log_prior"]`` reports; under the prior alone its maximiser is ``θ = α/β`` (the
    mean), not the mode ``(α − 1)/β`` of the density over θ.  Both arguments are finite numbers > 0.
    """

    loc: float = dataclasses.field(default=None, init=False, repr=False, compare=False)
    scale: float = dataclasses.field(default=None, init=False, repr=False, compare=False)
    concentration: float = 1.0
    rate: float = 1.0
    transform = "positive"

    def __post_init__(self):
        for name in ("concentration", "rate"):
            _check_number(type(self).__name__, name, getattr(self, name), positive=True)

    def log_density(self, u):
        """``(Σ α log β − log Γ(α) + α u − β e^u, α − β e^u)`` for ``u = log θ``."""
        u = np.asarray(u, np.float64)
        a, b = float(self.concentration), float(self.rate)
        e = np.exp(u)
        const = a * math.log(b) - math.lgamma(a)
        return float(np.sum(const + a * u - b * e)), a - b * e


@dataclasses.dataclass(frozen=True)
class HalfNormal(Prior):
    """``θ ~ HalfNormal(scale σ)`` for a positive parameter: the density
    ``√(2/π)/σ · exp(−θ²/(2σ²))`` on θ > 0 (SciPy's ``halfnorm(scale=σ)``; mean ``σ√(2/π)``).

    Evaluated in the search's coordinate ``u = log θ`` with the Jacobian of ``θ = e^u``:
    ``log p(u) = ½ log(2/π) − log σ + u − e^{2u}/(2σ²)``, ``d log p/du = 1 − e^{2u}/σ²``.  This is
    what the search adds to the VLB and what ``extras["log_prior"]`` reports; under the prior alone
    its maximiser is ``θ = σ`` (the density over θ itself is largest at 0).  ``scale`` is a finite
    number > 0.
    """

    loc: float = dataclasses.field(default=None, init=False, repr=False, compare=False)
    scale: float = 1.0
    transform = "positive"

    def __post_init__(self):
        _check_number(type(self).__name__, "scale", self.scale, positive=True)

    def log_density(self, u):
        """``(Σ ½ log(2/π) − log σ + u − e^{2u}/(2σ²), 1 − e^{2u}/σ²)`` for ``u = log θ``."""
        u = np.asarray(u, np.float64)
        s = float(self.scale)
        e2 = np.exp(2.0 * u) / (s * s)
        const = 0.5 * math.log(2.0 / math.pi) - math.log(s)
        return float(np.sum(const + u - 0.5 * e2)), 1.0 - e2


def check_hyperprior(model: Module, hyperprior) -> dict:
    """``hyperprior`` (None or a dict of name → :class:`Prior`) checked against ``model``: a
    ``ValueError`` naming the entry for a name that matches no parameter, a value that is not a
    prior, or a prior on a parameter of another transform (a :class:`LogNormal` on an
    unconstrained parameter, a prior on ordinal bin edges).  Returns a plain dict (empty for None)."""
    if hyperprior is None:
        return {}
    if not isinstance(hyperprior, dict):
        raise ValueError("hyperprior must be None or a dict of parameter name -> prior (gpvi.priors.LogNormal, "
                         f"Gamma, HalfNormal or Normal), got {type(hyperprior).__name__}")
    trans = model.transforms()
    out = {}
    for name, prior in hyperprior.items():
        if not isinstance(name, str):
            raise ValueError(f"hyperprior: keys must be parameter names (str), got {name!r}")
        if not isinstance(prior, Prior):
            raise ValueError(f"hyperprior[{name!r}] must be a gpvi.priors.LogNormal, Gamma, HalfNormal or Normal, "
                             f"got {prior!r}")
        paths = matching_parameters(model, name)
        if not paths:
            raise ValueError(f"hyperprior: {name!r} names no parameter of {type(model).__name__}; "
                             f"known: {sorted(trans)}")
        for p in paths:
            if trans[p] != prior.transform:
                want = {"positive": "LogNormal, Gamma or HalfNormal", "real": "Normal"}.get(trans[p])
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
            paths = matching_parameters(model, n) or [n]  # (`*` segments and a trailing [*] stand for paths)
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

    def value(self, theta: dict) -> float:
        """``log p(θ)`` alone (0 without a prior term)."""
        return float(self(theta)[0]) if self.terms else 0.0

    def penalise(self, theta: dict, neg_bound: float, grad):
        """A search's objective and flat gradient with the prior: ``(−bound − log p(θ),
        grad − ∇log p(θ), log p(θ))``, from the negated bound and its gradient ``grad``
        (flattened as :func:`gpvi._module.ravel_values` flattens ``theta``: keys in sorted order); unchanged, with
        log p = 0, without a prior term."""
        if not self.terms:
            return float(neg_bound), grad, 0.0
        lp, lg = self(theta)
        return float(neg_bound) - lp, grad - ravel_values(lg), lp


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
      for a scale and ``LogNormal(2·log 0.1, 3)`` for a variance, median noise s.d. 0.1;
    - with ``noise=True`` and a likelihood whose noise is a latent function (its
      ``noise_latent``, e.g. :class:`gpvi.likelihoods.HeteroscedasticGaussian`'s log noise s.d.),
      that latent's GP instead: its constant mean ``Normal(log 0.1, 1.5)`` (median noise s.d.
      0.1 again) and its kernel variance ``LogNormal(log 0.25, 1)`` (the log noise s.d. varies
      by about ±0.5, a factor 1.6, over the inputs, and by a factor 7 at most within 95 %).

    Parameters the names do not fit (means, slopes, ordinal bin edges, warping, degrees of
    freedom, inducing inputs) get no prior.
    """
    D = max(1, int(dimensions))
    out = {}
    noise_latent = getattr(getattr(model, "likelihood", None), "noise_latent", None) if noise else None
    noise_prefix = None if noise_latent is None else f"latents.{int(noise_latent)}."
    for path, transform in model.transforms().items():
        parts = path.split(".")
        if noise_prefix is not None and path == noise_prefix + "mean":
            out[path] = Normal(math.log(0.1), 1.5)
            continue
        if transform != "positive":
            continue
        in_kernel = "kernel" in parts[:-1]
        if in_kernel and parts[-1] == "variance" and noise_prefix is not None and path.startswith(noise_prefix):
            out[path] = LogNormal(math.log(0.25), 1.0)
        elif in_kernel and parts[-1] == "variance":
            out[path] = LogNormal(0.0, 2.0)
        elif in_kernel and parts[-1] == "lengthscale":
            out[path] = LogNormal(0.5 * math.log(D), 1.5)
        elif noise and parts[-2:] == ["likelihood", "scale"]:
            out[path] = LogNormal(math.log(0.1), 1.5)
        elif noise and parts[-2:] == ["likelihood", "variance"]:
            out[path] = LogNormal(2.0 * math.log(0.1), 3.0)
    return out


_KINDS = {"Normal": Normal, "LogNormal": LogNormal, "Gamma": Gamma, "HalfNormal": HalfNormal}

#: the fields each prior is saved with (Normal and LogNormal as files have always had them)
_FIELDS = {Normal: ("loc", "scale"), LogNormal: ("loc", "scale"), Gamma: ("concentration", "rate"),
           HalfNormal: ("scale",)}


def to_json(hyperprior: dict) -> dict:
    """A hyperprior as JSON-ready values (for model files): name → ``{"prior", <its fields>}``
    (``loc``, ``scale`` for Normal and LogNormal; ``concentration``, ``rate`` for Gamma;
    ``scale`` for HalfNormal).  A ``ValueError`` for a prior of another class."""
    out = {}
    for name, p in hyperprior.items():
        fields = _FIELDS.get(type(p))
        if fields is None:
            raise ValueError(f"hyperprior[{name!r}]: cannot save a prior of class {type(p).__name__}; "
                             f"known: {sorted(_KINDS)}")
        out[name] = {"prior": type(p).__name__, **{f: float(getattr(p, f)) for f in fields}}
    return out


def from_json(spec: dict) -> dict:
    """Inverse of :func:`to_json`; a ``ValueError`` for an unknown prior or missing fields."""
    out = {}
    for name, entry in spec.items():
        kind = _KINDS.get(entry.get("prior") if isinstance(entry, dict) else None)
        if kind is None:
            raise ValueError(f"hyperprior[{name!r}]: unknown prior {entry!r}; known: {sorted(_KINDS)}")
        missing = [f for f in _FIELDS[kind] if f not in entry]
        if missing:
            raise ValueError(f"hyperprior[{name!r}]: {kind.__name__} needs {', '.join(_FIELDS[kind])}, "
                             f"missing {', '.join(missing)} in {entry!r}")
        out[name] = kind(*(entry[f] for f in _FIELDS[kind]))
    return out
