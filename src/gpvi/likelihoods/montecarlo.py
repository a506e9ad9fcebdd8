"""Monte Carlo expectations for likelihoods known only through ``log_prob`` (Nguyen & Bonilla 2014).

:class:`MonteCarlo` wraps any :class:`~gpvi.likelihoods.Likelihood` and replaces its Gaussian
expectation ``E = E_{N(f|m,v)}[log p(y|f)]`` and the derivatives ``ρ = ∂E/∂m``, ``λ = 2 ∂E/∂v``
by averages over ``S`` samples ``f_s = m + √v ε_s``:

- **common random numbers**: the base draws ``ε_s ~ N(0, 1)`` are fixed by ``seed`` (one set of
  ``S`` draws, shared by every row and every evaluation), so the objective is a deterministic,
  smooth function of ``(m, v)`` that L-BFGS and the fixed-point engines can work on, and a fit is
  reproducible;
- ``sampling="qmc"`` (default) takes the draws from a scrambled Sobol sequence mapped through
  ``Φ⁻¹`` (randomised quasi-Monte Carlo: every draw is still marginally N(0, 1), so the estimates
  stay unbiased, but their error falls nearly as 1/S instead of 1/√S).  Shared draws make the
  errors of different rows correlated, so the error of the *summed* objective does not average
  out over rows: with i.i.d. draws (``sampling="iid"``, the paper's) a logistic GP needed about
  10⁵ samples per row for a summed error of 1e-3 relative, with QMC a few hundred;
- ``estimator="reparam"`` (default): ``E_S = (1/S) Σ_s log p(y | m + √v ε_s)`` differentiated by
  autodiff (the "reparameterisation" gradient).  ρ, λ are then the exact derivatives of the
  objective actually maximised, which the gradient engine's line search and the fixed-point
  safeguards need.  It requires ``log_prob`` to be differentiable in ``f`` (any JAX expression
  is, almost everywhere);
- ``estimator="score"``: the paper's black-box estimator (its Eq. 9–10), which needs no
  derivative of ``log p``:
  ``ρ = E[ε/√v · log p]``, ``λ = 2 ∂E/∂v = E[(ε² − 1)/v · log p]``,
  with the control variates of Paisley et al. / Ranganath et al. (the paper's ref. [16]): the
  score ``h`` (``ε`` and ``ε² − 1``, mean zero under q) is subtracted with the per-row
  coefficient ``â = E[h²·log p] / E[h²]`` estimated from the other samples (leave one out, so
  the estimate stays unbiased), which removes most of the variance that comes from the level of
  ``log p`` (``control_variates=False`` turns
  it off, for comparison).  These ρ, λ are unbiased estimates of the exact derivatives but not
  the derivatives of the sampled ``E_S``; use them with the fixed-point engines (which re-check
  every step on the VLB) rather than L-BFGS.

Everything else (validation of ``y``, predictions, label decoding) is delegated to the wrapped
likelihood, whose parameters stay learnable under the path ``likelihood.likelihood.<name>``:
their gradient is the sample average of ``∇_θ log p`` (the paper's Eq. 12).
"""
from __future__ import annotations

import numbers
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._module import positional, static
from gpvi.likelihoods.base import Likelihood

__all__ = ["MonteCarlo", "ESTIMATORS", "base_samples"]

#: The values of :class:`MonteCarlo`'s ``estimator``: reparameterisation (default) or score function.
ESTIMATORS = ("reparam", "score")


def _check_samples(owner, name, s):
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int (the number of Monte Carlo samples S), got {s!r}")
    return int(s)


def _check_seed(owner, name, s):
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral) or s < 0:
        raise ValueError(f"{owner}: {name} must be a non-negative int, got {s!r}")
    return int(s)


def _check_estimator(owner, name, e):
    if not isinstance(e, str) or e not in ESTIMATORS:
        raise ValueError(f"{owner}: {name} must be one of {ESTIMATORS}, got {e!r}")
    return e


SAMPLING = ("qmc", "iid")


def _check_sampling(owner, name, e):
    if not isinstance(e, str) or e not in SAMPLING:
        raise ValueError(f"{owner}: {name} must be one of {SAMPLING}, got {e!r}")
    return e


def _check_flag(owner, name, b):
    if not isinstance(b, (bool, np.bool_)):
        raise ValueError(f"{owner}: {name} must be True or False, got {b!r}")
    return bool(b)


@lru_cache(maxsize=64)
def _draws(num_samples: int, num_latents: int, seed: int, sampling: str) -> np.ndarray:
    ss = np.random.SeedSequence([seed, 20141208])
    if sampling == "iid":
        return np.random.default_rng(ss).standard_normal((num_samples, num_latents))
    import warnings

    from scipy.special import ndtri
    from scipy.stats import qmc

    with warnings.catch_warnings():  # "balance properties" warning for S not a power of 2
        warnings.simplefilter("ignore")
        u = qmc.Sobol(d=num_latents, scramble=True, seed=np.random.default_rng(ss)).random(num_samples)
    return ndtri(np.clip(u, 1e-15, 1.0 - 1e-15))


def base_samples(num_samples: int, num_latents: int = 1, seed: int = 0, sampling: str = "qmc") -> np.ndarray:
    """The fixed standard-normal draws ``ε`` (S, Q) used for common random numbers (read-only)."""
    out = _draws(int(num_samples), int(num_latents), int(seed), sampling)
    out.flags.writeable = False
    return out


def _score_terms(h, lp, control_variates):
    """Score-function estimates of ``E[h_q·log p]`` per row, (…, Q), for scores ``h`` (S, Q) with
    ``E[h] = 0`` and log-densities ``lp`` (…, S).

    With control variates: ``(1/S) Σ_s (g_s − â_{−s} h_s)`` for ``g = h·lp``, where
    ``â_{−s} = Σ_{t≠s} g_t h_t / Σ_{t≠s} h_t²`` is the variance-minimising coefficient estimated
    without sample s (leave one out), so that for i.i.d. draws the estimate stays exactly
    unbiased (a coefficient from all S samples biases it by O(1/S)).
    """
    g = lp[..., :, None] * h
    if not control_variates:
        return jnp.mean(g, axis=-2)
    G = jnp.sum(g * h, axis=-2, keepdims=True)
    H = jnp.sum(h * h, axis=0)
    a = (G - g * h) / jnp.maximum(H - h * h, 1e-300)
    return jnp.mean(g - a * h, axis=-2)


class MonteCarlo(Likelihood):
    """Monte Carlo expectations of a wrapped likelihood (see the module docstring).

    Parameters
    ----------
    likelihood : the likelihood whose ``log_prob`` is sampled (any :class:`Likelihood`).
    num_samples : S > 0, the number of samples per row (the paper used 2000 for the objective
        and 200 for gradients; one set serves both here).
    seed : seed of the fixed base draws (common random numbers).
    estimator : ``"reparam"`` or ``"score"`` (the paper's; see the module docstring).
    sampling : ``"qmc"`` (scrambled Sobol, default) or ``"iid"`` base draws.
    control_variates : with ``estimator="score"``, subtract the score control variates.
    """

    likelihood: Likelihood = positional(kind=Likelihood)
    num_samples: int = static(1000, check=_check_samples)
    seed: int = static(0, check=_check_seed)
    estimator: str = static("reparam", check=_check_estimator)
    control_variates: bool = static(True, check=_check_flag)
    sampling: str = static("qmc", check=_check_sampling)

    def __post_init__(self):
        if self.likelihood is None:
            raise ValueError("MonteCarlo: likelihood must be a gpvi Likelihood to sample, got None")
        if isinstance(self.likelihood, MonteCarlo):
            raise ValueError("MonteCarlo: likelihood is already a MonteCarlo wrapper")

    # ---- delegated -------------------------------------------------------------------------
    def log_prob(self, y, f):
        return self.likelihood.log_prob(y, f)

    def validate(self, y):
        return self.likelihood.validate(y)

    def decode(self, codes):
        return self.likelihood.decode(codes)

    def conditional_mean(self, f):
        return self.likelihood.conditional_mean(f)

    def conditional_variance(self, f):
        return self.likelihood.conditional_variance(f)

    def predict_mean_and_var(self, m, v):
        return self.likelihood.predict_mean_and_var(m, v)

    def class_probabilities(self, m, v):
        return self.likelihood.class_probabilities(m, v)

    def predictive_log_density(self, y, m, v):
        return self.likelihood.predictive_log_density(y, m, v)

    def __getattr__(self, name):
        # Likelihood-specific helpers (Ordinal.level_probabilities, num_levels, ...) of the
        # wrapped likelihood; only reached for names the wrapper does not define.
        if name.startswith("__") or name == "likelihood":
            raise AttributeError(name)
        return getattr(self.likelihood, name)

    # ---- sampled expectations --------------------------------------------------------------
    @property
    def num_latents(self) -> int:
        return getattr(self.likelihood, "num_latents", 1)

    def _log_probs(self, y, m, v):
        """``log p(y | m + √v ε_s)`` (…, S) and the draws ε (S, Q).  With Q > 1 latents ``m, v``
        are (…, Q) and each row's Q latents are sampled jointly from ``N(m, diag v)``."""
        Q = self.num_latents
        eps = jnp.asarray(base_samples(self.num_samples, Q, self.seed, self.sampling), jnp.result_type(m, float))
        if Q == 1:
            f = m[..., None] + jnp.sqrt(v)[..., None] * eps[:, 0]
        else:
            f = m[..., None, :] + jnp.sqrt(v)[..., None, :] * eps
        yb = jnp.broadcast_to(y, jnp.shape(m)[:jnp.ndim(m) - (Q > 1)])
        return self.likelihood.log_prob(yb[..., None], f), eps

    def _score(self, lp, eps, v, cv):
        rho = _score_terms(eps, lp, cv)
        lam = _score_terms(eps * eps - 1.0, lp, cv)
        if self.num_latents == 1:
            rho, lam = rho[..., 0], lam[..., 0]
        return rho / jnp.sqrt(v), lam / v

    def score_moments(self, y, m, v, control_variates=None):
        """``(E, ρ, λ)`` by the score-function estimator (with control variates unless
        ``control_variates=False``); E of the rows' shape, ρ, λ of the shape of ``m``."""
        cv = self.control_variates if control_variates is None else control_variates
        lp, eps = self._log_probs(y, m, v)
        return (jnp.mean(lp, axis=-1),) + self._score(lp, eps, v, cv)

    def expected_log_prob(self, y, m, v):
        if self.estimator == "reparam":
            lp, _ = self._log_probs(y, m, v)
            return jnp.mean(lp, axis=-1)
        # The sampled value, with derivatives in (m, v) given by the score estimates: the
        # samples are taken at stop_gradient(m, v) (gradients still reach the likelihood's own
        # parameters through log p, the paper's Eq. 12) and first-order surrogate terms that
        # vanish in value carry ρ and λ/2 as ∂/∂m and ∂/∂v.
        ms, vs = jax.lax.stop_gradient(m), jax.lax.stop_gradient(v)
        lp, eps = self._log_probs(y, ms, vs)
        rho, lam = (jax.lax.stop_gradient(t) for t in self._score(lp, eps, vs, self.control_variates))
        lin = rho * (m - ms) + 0.5 * lam * (v - vs)
        return jnp.mean(lp, axis=-1) + (lin if self.num_latents == 1 else jnp.sum(lin, axis=-1))

    def variational_moments(self, y, m, v):
        if self.estimator == "score":
            return self.score_moments(y, m, v)
        return super().variational_moments(y, m, v)
