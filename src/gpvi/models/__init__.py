"""Latent Gaussian models ``f ~ prior, y | f ~ likelihood``: the prior side of the variational problem.

- :mod:`~gpvi.models.base`: :class:`Model`, the Bayesian GLM, the full :class:`GP` and the
  inducing-point :class:`SparseGP`, with the jittered Cholesky and the KL divergence they share;
- :mod:`~gpvi.models.multilatent`: :class:`MultiLatent`, several latent functions under one
  likelihood (softmax, heteroscedastic, ...).
"""
from gpvi.models.base import GLM, GP, Model, SparseGP, check_input_range, cholesky, kl_standard_normal
from gpvi.models.multilatent import MultiLatent

__all__ = ["Model", "GLM", "GP", "SparseGP", "MultiLatent", "check_input_range", "cholesky", "kl_standard_normal"]
