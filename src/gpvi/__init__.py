"""gpvi: variational inference for latent Gaussian models with any likelihood.

Importing gpvi switches JAX to float64 (``jax_enable_x64``): the fixed-point and Newton
updates rely on double-precision Cholesky factorisations.  This is the one place where it
is set.
"""
import jax

jax.config.update("jax_enable_x64", True)

from gpvi._compile import clear_cache as clear_compilation_cache  # noqa: E402
from gpvi._compile import enable_persistent_cache  # noqa: E402

# Compiled programs are kept on disk (~/.cache/gpvi/jax; GPVI_COMPILATION_CACHE=0 turns it off):
# a new process loads instead of compiling (see gpvi._compile; clear_compilation_cache() empties it).
enable_persistent_cache()

from gpvi import diagnostics, engines, io, kernels, metrics, priors
from gpvi import likelihoods  # noqa: E402
from gpvi._module import Module, param, static  # noqa: E402
from gpvi._watchdog import HangError, set_watchdog  # noqa: E402
from gpvi.fitting.fit import FitResult, fit, learnable_parameters  # noqa: E402
from gpvi.models.base import GLM, GP, Model, SparseGP  # noqa: E402
from gpvi.objective import Objective, State, prior_state  # noqa: E402
from gpvi.likelihoods import montecarlo  # noqa: E402
from gpvi.likelihoods.montecarlo import MonteCarlo  # noqa: E402
from gpvi.models import multilatent
from gpvi import pointprocess
from gpvi.likelihoods import softmax, warped  # noqa: E402
from gpvi.models.multilatent import MultiLatent  # noqa: E402
from gpvi.likelihoods.softmax import Softmax  # noqa: E402
from gpvi.likelihoods.warped import Warped  # noqa: E402
from gpvi.likelihoods.heteroscedastic import HeteroscedasticGaussian  # noqa: E402

from gpvi.data import stream  # noqa: E402
from gpvi.fitting.stream import fit_stream  # noqa: E402


__version__ = "0.1.0"

_ESTIMATORS = ("GPClassifier", "GPRegressor", "GPCountRegressor", "GPOrdinalRegressor")
_LAZY_MODULES = ("plots", "datasets")


def __getattr__(name):
    # The scikit-learn estimators are imported on first use: importing sklearn.base costs
    # about 0.5 s, which ``import gpvi`` alone should not pay.
    if name in _ESTIMATORS or name == "estimators":
        import importlib

        estimators = importlib.import_module("gpvi.sklearn.estimators")
        return estimators if name == "estimators" else getattr(estimators, name)
    if name in _LAZY_MODULES:  # gpvi.plots needs matplotlib (the plot extra): imported when first used
        import importlib

        return importlib.import_module(f"gpvi.{name}")
    raise AttributeError(f"module 'gpvi' has no attribute {name!r}")

__all__ = [
    "GLM", "GP", "SparseGP", "Model", "fit", "FitResult", "State", "Objective", "prior_state",
    "kernels", "priors", "likelihoods", "engines", "metrics", "learnable_parameters", "Module", "param",
    "static", "io", "diagnostics", "stream", "fit_stream", "GPClassifier", "GPRegressor", "GPCountRegressor", "GPOrdinalRegressor",
    "montecarlo", "MonteCarlo", "warped", "Warped", "pointprocess", "multilatent", "MultiLatent",
    "softmax", "Softmax", "HeteroscedasticGaussian", "HangError", "set_watchdog", "clear_compilation_cache",
]
