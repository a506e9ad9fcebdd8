"""The default model and fit, shared by the estimators (:mod:`gpvi.sklearn`) and ``gpvi fit``.

Both front ends build the same model from the same data and fit it the same way; what each
adds is its own input handling (label coding, column names, the model file).  The policy:

* **standardisation** (:func:`standardise_inputs`, :func:`standardise_target`): every input
  column is centred and scaled to unit (population) standard deviation, a constant column only
  centred; the targets of identity-link regression (Gaussian, Laplace, Student-t noise) are
  standardised the same way for the fit.
* **full or sparse** (:func:`model_kind`): under ``"auto"`` a full GP for at most
  :func:`full_max` rows — :data:`FULL_MAX_REGRESSION` (1 000) for identity-link regression,
  whose hyperparameters are searched on the closed-form collapsed bound, :data:`FULL_MAX`
  (500) for the other likelihoods, where every evaluation runs the engine on an N×N problem —
  and a sparse GP beyond, with :func:`inducing_count` k-means inducing inputs
  (:data:`INDUCING`, at most the number of distinct rows).
* **likelihood and mean start** (:func:`likelihood_start`): noise scale :data:`NOISE_SCALE` (of
  the standardised targets); Bernoulli's constant prior mean at the link of the base rate;
  Poisson's and the exponential's at the log of the overall rate; ordinal bin edges where the
  empirical cumulative level proportions put them under a zero latent; softmax means at the
  log base rate of each class.
* **kernel** (:func:`default_kernel_start`): an RBF kernel with one lengthscale per feature
  (ARD), variance 1 and every lengthscale at the median distance between (standardised)
  training rows (:func:`median_distance`, on at most 1 000 rows).
* **what is learned** (:func:`learned_parameters`): every learnable parameter (kernel, constant
  mean, likelihood) except the inducing inputs, and for the ordinal likelihood except the mean
  and the slope, which the bin edges and the kernel variance make redundant.
* **hyperprior** (:func:`hyperprior`): weakly informative log-normal priors on the kernel
  variance, the lengthscales and a regression's noise (:func:`gpvi.priors.weak`), added to the
  bound that the search maximises, when the inputs are standardised and the engine learns θ by
  the profile search or the collapsed bound.
* **two stages** (:func:`uses_two_stages`, :func:`fit_default`): with the default kernel, all
  parameters learned, several features and a likelihood other than Gaussian, the search runs
  twice.  First **isotropic**: one lengthscale shared by all features, started at the median
  distance and learned with the kernel variance, the mean and the likelihood's parameters — a
  few parameters, so L-BFGS-B converges in a few rounds, and the start is sensible in any
  dimension (lengthscales of 1 in many standardised dimensions make ``K ≈ I``).  Then **ARD**:
  every lengthscale starts at the isotropic value and the search continues from the first
  stage's parameters and variational state (``init=``) for at most :data:`ARD_ROUNDS`
  L-BFGS-B rounds (``max_rounds`` if smaller).  The first stage, only a start, stops at the
  looser relative tolerance :data:`FIRST_STAGE_TOL`; the second stops at the fit's ``tol``.
  The first stage's kernel already has the ARD shape, its lengthscales tied into one learned
  value (``kernel.lengthscale[*]``, :func:`isotropic_names`), so both stages run the same
  compiled programs.  A Gaussian likelihood's collapsed bound is cheap to search directly, so
  Gaussian noise goes straight to ARD.

The engine (``fpi``), tolerances (``tol=1e-6``, ``max_iter=500``, ``max_rounds=100``) and seed
(0) are the front ends' own parameters, with these defaults in both.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special

from gpvi import kernels, likelihoods, priors
from gpvi._module import ELEMENTS
from gpvi.likelihoods.scalar import QuasiPoisson
from gpvi.likelihoods.softmax import Softmax
from gpvi.likelihoods.warped import Warped
from gpvi.models.base import GP, SparseGP
from gpvi.models.multilatent import MultiLatent

__all__ = ["ARD_ROUNDS", "FIRST_STAGE_TOL", "FULL_MAX", "FULL_MAX_REGRESSION", "INDUCING", "NOISE_SCALE", "STUDENT_T_DF",
           "ORDINAL_FIXED", "median_distance", "isotropic_start", "ard_from", "standardise_inputs",
           "standardise_target", "full_max", "model_kind", "inducing_count", "likelihood_start",
           "default_kernel_start", "uses_two_stages", "build_model", "learned_parameters", "isotropic_names",
           "fit_default"]

#: L-BFGS-B rounds of the ARD stage
ARD_ROUNDS = 30
#: Loosest relative tolerance of the isotropic stage (the fit's ``tol`` if larger): that stage
#: only supplies the start of the ARD stage, which learns all of its parameters again.  At the
#: fit's 1e-6 the isotropic search spent most of its rounds on gains of thousandths of a nat
#: (iris, three classes: 31 rounds, the last 20 gaining 0.02 nats in all); at 1e-3 the two
#: stages end at the same test NLPD (iris, wine, breast cancer, digits 0/1; benchmarks/README.md).
FIRST_STAGE_TOL = 1e-3
#: largest training set fitted by a full GP under "auto" (likelihoods other than identity-link noise)
FULL_MAX = 500
#: the same for identity-link regression (Gaussian, Laplace, Student-t, warped Gaussian noise)
FULL_MAX_REGRESSION = 1000
#: inducing inputs of a sparse GP (at most the number of distinct training rows)
INDUCING = 200
#: starting noise standard deviation (Gaussian) or scale (Laplace, Student-t), standardised units
NOISE_SCALE = 0.1
#: degrees of freedom of Student-t noise (fixed)
STUDENT_T_DF = 3.0
#: parameters of an ordinal model that are never learned (redundant with the edges and kernel variance)
ORDINAL_FIXED = ("mean", "likelihood.shape")

_REGRESSION_NAMES = ("gaussian", "laplace", "studentt", "warped", "heteroscedastic")
_REGRESSION_TYPES = (likelihoods.Gaussian, likelihoods.Laplace, likelihoods.StudentT, Warped,
                     likelihoods.HeteroscedasticGaussian)
_KINDS = ("auto", "full", "sparse")


# --- standardisation --------------------------------------------------------------------------
def standardise_inputs(X):
    """``(mean, scale)`` of the columns of ``X`` (N, D): the column means and population
    standard deviations, a zero deviation replaced by 1 (a constant column is only centred).
    The standardised inputs are ``(X - mean) / scale``."""
    X = np.asarray(X, np.float64)
    mean = X.mean(axis=0)
    sd = X.std(axis=0)
    return mean, np.where(sd > 0, sd, 1.0)


def standardise_target(y):
    """``(mean, scale)`` of the targets ``y`` (N,) as floats: their mean and population standard
    deviation (1 when all targets are equal)."""
    y = np.asarray(y, np.float64)
    sd = float(np.std(y))
    return float(np.mean(y)), (sd if sd > 0 else 1.0)


# --- full or sparse ---------------------------------------------------------------------------
def _is_regression(likelihood) -> bool:
    if isinstance(likelihood, str):
        return likelihood.lower() in _REGRESSION_NAMES
    return isinstance(likelihood, _REGRESSION_TYPES)


def full_max(likelihood) -> int:
    """Largest training set fitted by a full GP under ``"auto"`` for ``likelihood`` (an object or
    a command-line name such as ``"bernoulli"``): :data:`FULL_MAX_REGRESSION` for Gaussian,
    Laplace, Student-t and warped Gaussian noise, :data:`FULL_MAX` for the others."""
    return FULL_MAX_REGRESSION if _is_regression(likelihood) else FULL_MAX


def model_kind(n: int, likelihood, requested: str = "auto", full_max_rows: int | None = None) -> str:
    """``"full"`` or ``"sparse"``: ``requested`` when it is one of them; for ``"auto"`` a full GP
    when the ``n`` training rows are at most ``full_max_rows`` (default :func:`full_max` of
    ``likelihood``), a sparse GP otherwise."""
    if requested not in _KINDS:
        raise ValueError(f"model kind must be one of {_KINDS}, got {requested!r}")
    if requested != "auto":
        return requested
    limit = full_max(likelihood) if full_max_rows is None else full_max_rows
    return "full" if n <= limit else "sparse"


def inducing_count(Xs, requested: int | None = None) -> int:
    """Inducing inputs of the default sparse GP on inputs ``Xs``: ``requested`` (default
    :data:`INDUCING`), at most the number of distinct rows of ``Xs``."""
    M = INDUCING if requested is None else int(requested)
    return int(min(M, np.unique(np.asarray(Xs), axis=0).shape[0]))


# --- likelihood and mean start ----------------------------------------------------------------
def _base_rate_logit(y, link: str) -> float:
    """The link of the base rate of the codes ``y`` ∈ {0, 1} (clipped half a row from 0 and 1)."""
    n = len(y)
    p = float(np.clip(np.mean(y), 0.5 / n, 1.0 - 0.5 / n))
    return float(scipy.special.logit(p) if link == "logit" else scipy.special.ndtri(p))


def _log_rate(y, offset, counts: bool) -> float:
    """The log of the overall rate ``Σy / Σ exp(offset)``: for counts the sum is at least half a
    count (all-zero counts), for other positive data the rate at least 1e-3."""
    y = np.asarray(y, np.float64)
    expo = float(np.sum(np.exp(offset))) if offset is not None else float(y.shape[0])
    if counts:
        return float(np.log(max(float(np.sum(y)), 0.5) / expo))
    return float(np.log(max(float(np.sum(y)) / expo, 1e-3)))


def likelihood_start(name: str, y, *, levels: int | None = None, offset=None, noise_scale: float = NOISE_SCALE,
                     df: float = STUDENT_T_DF, link: str | None = None):
    """``(likelihood, mean)``: the default likelihood ``name`` and the constant prior mean to start
    from, for the coded targets ``y`` (standardised for identity-link noise; class or level codes
    0..L−1 for ``"bernoulli"``, ``"probit"``, ``"softmax"`` and ``"ordinal"``, whose number of
    classes or levels ``levels`` gives) and the log-exposure ``offset`` (or None).

    ``name``: ``"gaussian"``, ``"laplace"``, ``"studentt"`` (noise ``noise_scale``; Student-t with
    ``df`` degrees of freedom), ``"warped"`` (Gaussian noise on a tanh-sum warping that starts
    near the identity), ``"bernoulli"`` (``link``, default logit), ``"probit"`` (Bernoulli with the
    probit link), ``"softmax"`` (the mean is an array,
    one per class), ``"poisson"``, ``"quasipoisson"`` (Poisson that accepts non-integer counts),
    ``"exponential"``, ``"ordinal"`` or ``"heteroscedastic"`` (Gaussian noise whose log standard
    deviation is a second latent function, starting at ``log noise_scale``; the mean is an
    array, one per latent).
    """
    y = np.asarray(y, np.float64)
    s = float(noise_scale)
    if name == "gaussian":
        return likelihoods.Gaussian(variance=s**2), 0.0
    if name == "laplace":
        return likelihoods.Laplace(scale=s), 0.0
    if name == "studentt":
        return likelihoods.StudentT(scale=s, df=float(df)), 0.0
    if name == "warped":
        # near the identity map, the three terms spread over the standardised range
        return Warped(likelihoods.Gaussian(variance=s**2), a=[0.3, 0.3, 0.3], b=[1.0, 1.0, 1.0],
                      c=[1.0, 0.0, -1.0]), 0.0
    if name in ("bernoulli", "probit"):
        lik = likelihoods.Bernoulli(link=link or ("probit" if name == "probit" else "logit"))
        return lik, _base_rate_logit(y, lik.link)
    if name == "heteroscedastic":
        return likelihoods.HeteroscedasticGaussian(), np.array([0.0, math.log(s)])
    if name == "softmax":
        freq = np.bincount(y.astype(int), minlength=levels) / len(y)
        return Softmax(num_classes=levels), np.log(np.clip(freq, 0.5 / len(y), None))
    if name in ("poisson", "quasipoisson"):
        lik = likelihoods.Poisson() if name == "poisson" else QuasiPoisson()
        return lik, _log_rate(y, offset, counts=True)
    if name == "exponential":
        return likelihoods.Exponential(), _log_rate(y, offset, counts=False)
    if name == "ordinal":
        counts = np.bincount(y.astype(int), minlength=levels).astype(np.float64)
        counts[counts == 0] = 0.5  # a level absent from y: half a row, so that the edges are distinct
        cum = np.cumsum(counts)[:-1] / counts.sum()
        return likelihoods.Ordinal(edges=scipy.special.logit(cum), shape=1.0), 0.0
    raise ValueError(f"no default for likelihood {name!r}")


# --- kernel -----------------------------------------------------------------------------------
def median_distance(X, rows: int = 1000, seed: int = 0) -> float:
    """Median Euclidean distance between distinct rows of ``X`` (N, D) (on a subset of at most
    ``rows`` rows); 1 when all rows coincide."""
    X = np.asarray(X, np.float64)
    if X.shape[0] > rows:
        X = X[np.random.default_rng(seed).choice(X.shape[0], rows, replace=False)]
    sq = np.sum(X * X, axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * X @ X.T
    iu = np.triu_indices(X.shape[0], 1)
    d = np.sqrt(np.maximum(d2[iu], 0.0))
    d = d[d > 1e-12 * max(1.0, float(np.max(d, initial=0.0)))]
    return float(np.median(d)) if d.size else 1.0


def isotropic_start(X) -> kernels.RBF:
    """An isotropic RBF kernel: variance 1, one lengthscale = the median distance."""
    return kernels.RBF(variance=1.0, lengthscale=median_distance(X))


def ard_from(kernel: kernels.RBF, D: int) -> kernels.RBF:
    """An ARD RBF over ``D`` features starting at ``kernel``'s (isotropic) parameters."""
    ls = float(np.asarray(kernel.lengthscale).reshape(-1)[0])
    return kernels.RBF(variance=float(np.asarray(kernel.variance)), lengthscale=np.full(D, ls))


def default_kernel_start(Xs, isotropic: bool = False) -> kernels.RBF:
    """The default kernel on the standardised inputs ``Xs`` (N, D): an RBF of variance 1 with
    every lengthscale at the median distance between rows, one per feature (ARD), or one shared
    lengthscale with ``isotropic=True`` (the first of two stages)."""
    kernel = isotropic_start(Xs)
    return kernel if isotropic else ard_from(kernel, np.shape(Xs)[1])


def uses_two_stages(likelihood, D: int, *, default_kernel: bool, learn_all: bool) -> bool:
    """Whether the fit learns an isotropic kernel first and then ARD (see the module's
    docstring): with the default kernel, every learnable parameter learned, ``D > 1`` features
    and a likelihood other than Gaussian."""
    return bool(default_kernel and learn_all and D > 1 and type(likelihood) is not likelihoods.Gaussian)


# --- model ------------------------------------------------------------------------------------
def build_model(kind: str, likelihood, mean, Xs, *, kernel=None, inducing: int | None = None):
    """The model to fit: a full GP (``kind="full"``) or a sparse GP with ``inducing`` k-means
    inducing inputs (default :func:`inducing_count`) on the standardised inputs ``Xs``, with
    ``likelihood`` and constant prior ``mean``; one latent GP per class (:class:`MultiLatent`)
    when the likelihood has several latents, each with its own mean (``mean`` an array) and
    kernel (``kernel`` one kernel or a list of one per latent).  ``kernel=None``: the default
    kernel (:func:`default_kernel_start`, one lengthscale per feature; a two-stage fit ties them
    in its first stage, :func:`fit_default`)."""
    if kind not in ("full", "sparse"):
        raise ValueError(f"kind must be 'full' or 'sparse', got {kind!r}")
    if kernel is None:
        kernel = default_kernel_start(Xs)  # ARD-shaped even for two stages (see fit_default)
    Q = getattr(likelihood, "num_latents", 1)
    if isinstance(kernel, (list, tuple)):
        if len(kernel) not in (1, Q):
            raise ValueError(f"kernel: got a list of {len(kernel)} kernels but the problem has {Q} latent "
                             f"function(s) (one per class): give one kernel or {Q}")
        kernel = kernel[0] if Q == 1 else list(kernel)
    M = (inducing_count(Xs) if inducing is None else int(inducing)) if kind == "sparse" else None
    if Q > 1:
        if kind == "full":
            return MultiLatent.full(kernel, likelihood, mean=mean)
        return MultiLatent.sparse(kernel, likelihood, inducing=M, mean=mean)
    if kind == "full":
        return GP(kernel=kernel, likelihood=likelihood, mean=float(mean))
    return SparseGP(kernel=kernel, likelihood=likelihood, mean=float(mean), inducing=M)


def learned_parameters(model) -> list[str]:
    """The dotted names learned by default: :func:`gpvi.learnable_parameters` of ``model`` (the
    inducing inputs excluded), less :data:`ORDINAL_FIXED` for an ordinal likelihood."""
    from gpvi.fitting.problem import learnable_parameters

    fixed = ORDINAL_FIXED if isinstance(getattr(model, "likelihood", None), likelihoods.Ordinal) else ()
    return [p for p in learnable_parameters(model) if p not in fixed]


def isotropic_names(names) -> list[str]:
    """The first stage's learned names: every kernel lengthscale among ``names`` with its
    elements tied (``kernel.lengthscale[*]``, :data:`gpvi._module.ELEMENTS`) — one lengthscale
    for all features, kept in the ARD kernel's shape so that both stages run the same compiled
    programs (an isotropic kernel's scalar lengthscale made every program of the fit compile,
    or load from the disk cache, twice: iris's warm-cache first fit spent 0.7 s on its second
    stage's programs)."""
    return [n + ELEMENTS if n.split(".")[-2:] == ["kernel", "lengthscale"] else n for n in names]


# --- hyperprior -------------------------------------------------------------------------------
#: The front ends' default ``hyperprior``: weakly informative priors (:func:`gpvi.priors.weak`).
HYPERPRIOR = "weak"


def check_hyperprior_spec(spec) -> None:
    """A ``ValueError`` unless ``spec`` is ``"weak"``, ``"none"``, None or a dict of priors."""
    if spec is None or (isinstance(spec, str) and spec in ("weak", "none")):
        return
    if isinstance(spec, dict) and all(isinstance(k, str) and isinstance(v, priors.Prior) for k, v in spec.items()):
        return
    raise ValueError("hyperprior must be 'weak' (weakly informative priors for standardised data), 'none' or None "
                     f"(no prior), or a dict of parameter name -> gpvi.priors.LogNormal/Normal, got {spec!r}")


def hyperprior(spec, model, likelihood, D: int, *, engine: str = "fpi", learn=True, standardised: bool = True):
    """The ``hyperprior`` the front ends give :func:`gpvi.fit` for ``spec``:

    - ``"weak"`` (the default, :data:`HYPERPRIOR`): :func:`gpvi.priors.weak` for ``model`` on
      ``D`` standardised features, with the noise prior for identity-link regression (whose
      targets are standardised too) — when hyperparameters are learned, the inputs are
      standardised and the engine learns them by the profile search or the collapsed bound
      (``Engine.hyperparameters == "profile"``); otherwise None, since the prior's scales assume
      standardised data and the other engines learn θ their own way;
    - ``"none"`` or None: None (maximum likelihood-II);
    - a dict of priors: itself.
    Without it, the default classifier's kernel variance ran to 1 918 and its lengthscales to
    3.6e10 on scikit-learn's breast cancer set, with hundreds of damped steps."""
    from gpvi import engines as _engines

    check_hyperprior_spec(spec)
    if spec is None or spec == "none" or learn is False:
        return None
    if isinstance(spec, dict):
        return spec
    eng = _engines.auto.choose(model).engine if engine == _engines.auto.AUTO else _engines.get(engine)
    if not standardised or eng.hyperparameters != "profile":
        return None
    return priors.weak(model, noise=_is_regression(likelihood), dimensions=D)


# --- fit --------------------------------------------------------------------------------------
def fit_default(model, Xs, y, *, learn, two_stage: bool, fit=None, max_rounds: int = 100, **options):
    """Fit ``model`` to ``(Xs, y)`` as the front ends do by default; returns ``(FitResult, damped)``,
    ``damped`` the damped fixed-point steps over the whole fit.

    One call of ``fit`` (default :func:`gpvi.fit`; a front end may pass the function it calls)
    with ``learn_hyperparameters=learn``, ``max_rounds`` and ``options`` (engine, tolerances,
    offset, seed, progress, …); with ``two_stage`` (``model``'s kernel the default ARD RBF) that
    first one with the lengthscales tied into one (:func:`isotropic_names`) to the relative
    tolerance ``max(tol, FIRST_STAGE_TOL)``, then a second one from its optimum with every
    lengthscale its own (ARD), warm-started from its variational state, for at most
    :data:`ARD_ROUNDS` rounds.  The second result is returned, its ``seconds`` counting both
    stages.
    """
    if fit is None:
        from gpvi.fitting.fit import fit
    first_options, first_learn = dict(options), learn
    if two_stage:  # the isotropic stage is a start: a looser tolerance (FIRST_STAGE_TOL)
        first_options["tol"] = max(float(options.get("tol", 1e-6)), FIRST_STAGE_TOL)
        first_learn = isotropic_names(learned_parameters(model) if learn is True else learn)
    result = fit(model, Xs, y, learn_hyperparameters=first_learn, max_rounds=max_rounds, **first_options)
    damped = int(result.backtracks)
    if two_stage:
        first = result
        result = fit(first.model, Xs, y, learn_hyperparameters=learn,
                     max_rounds=min(max_rounds, ARD_ROUNDS), init=first.state, **options)
        result.seconds += first.seconds
        damped += int(result.backtracks)
    return result, damped
