"""gpvi: variational inference for latent Gaussian models with any likelihood.

Importing gpvi switches JAX to float64 (``jax_enable_x64``): the fixed-point and Newton
updates rely on double-precision Cholesky factorisations.  This is the one place where it
is set.
"""
import jax

jax.config.update("jax_enable_x64", True)

from . import engines, io, kernels, likelihoods, metrics  # noqa: E402
from ._module import Module, param, static  # noqa: E402
from .fit import FitResult, fit, learnable_parameters  # noqa: E402
from .models import GLM, GP, Model, SparseGP  # noqa: E402
from .objective import Objective, State, prior_state  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "GLM", "GP", "SparseGP", "Model", "fit", "FitResult", "State", "Objective", "prior_state",
    "kernels", "likelihoods", "engines", "metrics", "learnable_parameters", "Module", "param",
    "static",
]
