"""Observation models ``p(y | f)``: every likelihood gpvi ships, in one package.

- :mod:`~gpvi.likelihoods.base`: the :class:`Likelihood` base class (write ``log_prob``; the
  Gaussian expectations default to quadrature and automatic differentiation);
- :mod:`~gpvi.likelihoods.scalar`: one latent value per row (Gaussian, Bernoulli, Poisson,
  QuasiPoisson, Ordinal, Laplace, StudentT, Exponential, StochasticVolatility);
- :mod:`~gpvi.likelihoods.softmax`: multiclass labels over several latent functions;
- :mod:`~gpvi.likelihoods.heteroscedastic`: a Gaussian whose log noise scale is a second latent
  function (two latents per row, closed-form expectations);
- :mod:`~gpvi.likelihoods.warped`: the warped Gaussian of Snelson et al.;
- :mod:`~gpvi.likelihoods.montecarlo`: a wrapper that estimates the expectations by sampling;
- :mod:`~gpvi.likelihoods.surrogates`: the Jaakkola–Jordan and Taylor bounds of the logistic
  likelihood used by the ``jj``/``taylor`` engines;
- :mod:`~gpvi.likelihoods.quadrature`: Gauss–Hermite rules.
"""
from gpvi.likelihoods.base import Likelihood
from gpvi.likelihoods.scalar import (Bernoulli, Exponential, Gaussian, Laplace, Ordinal, Poisson,
                                     QuasiPoisson, StochasticVolatility, StudentT)
from gpvi.likelihoods.montecarlo import MonteCarlo
from gpvi.likelihoods.softmax import Softmax
from gpvi.likelihoods.heteroscedastic import HeteroscedasticGaussian
from gpvi.likelihoods.warped import Warped

__all__ = ["Likelihood", "Gaussian", "Bernoulli", "Poisson", "QuasiPoisson", "Ordinal", "Laplace", "StudentT",
           "Exponential", "StochasticVolatility", "Softmax", "HeteroscedasticGaussian", "Warped", "MonteCarlo"]
