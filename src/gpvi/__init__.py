"""gpvi: variational inference for latent Gaussian models with any likelihood.

Importing gpvi switches JAX to float64 (``jax_enable_x64``): the fixed-point and Newton
updates rely on double-precision Cholesky factorisations.  This is the one place where it
is set.

It also turns off XLA:CPU's concurrency-optimised scheduler (``XLA_FLAGS``), unless the
variable already names that flag: with it, programs that run independent loops side by side
(a batched triangular solve next to another, as in the warm start of several latents) stopped
for good now and then, every thread idle (jax 0.10.2, 2 cores: a loop of 300 such calls hung
within seconds in 3 of 3 runs, and finished in 3 of 3 with the flag off).  The flag takes
effect only if gpvi is imported before JAX first runs a computation; a warning says so when
it was imported later.
"""
import os
import warnings

_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if _SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_SCHEDULER_FLAG}=false").strip()
    _flag_set_here = True
else:
    _flag_set_here = False

import jax  # noqa: E402
from jax._src import xla_bridge as _xb  # noqa: E402

if _flag_set_here and _xb.backends_are_initialized():
    warnings.warn("gpvi was imported after JAX had started its backend, so XLA_FLAGS could not turn off "
                  "XLA:CPU's concurrency-optimised scheduler, with which a fit can hang now and then "
                  f"(see gpvi's module docstring); import gpvi first or set XLA_FLAGS='{_SCHEDULER_FLAG}=false'",
                  RuntimeWarning, stacklevel=2)

jax.config.update("jax_enable_x64", True)

from ._compile import enable_persistent_cache  # noqa: E402

# Compiled programs are kept on disk (~/.cache/gpvi/jax; GPVI_COMPILATION_CACHE=0 turns it off):
# a new process loads instead of compiling (see gpvi._compile).
enable_persistent_cache()

from . import diagnostics, engines, io, kernels, likelihoods, metrics  # noqa: E402
from ._module import Module, param, static  # noqa: E402
from .fit import FitResult, fit, learnable_parameters  # noqa: E402
from .models import GLM, GP, Model, SparseGP  # noqa: E402
from .objective import Objective, State, prior_state  # noqa: E402
from . import montecarlo  # noqa: E402
from .montecarlo import MonteCarlo  # noqa: E402
from . import multilatent, pointprocess, softmax, warped  # noqa: E402
from .multilatent import MultiLatent  # noqa: E402
from .softmax import Softmax  # noqa: E402
from .warped import Warped  # noqa: E402

from . import stream  # noqa: E402
from .streaming import fit_stream  # noqa: E402

for _cls in (MonteCarlo, Warped, Softmax, MultiLatent):  # components outside likelihoods.py/models.py, saved in model files too
    io.register(_cls)

__version__ = "0.1.0"

_ESTIMATORS = ("GPClassifier", "GPRegressor", "GPCountRegressor", "GPOrdinalRegressor")


def __getattr__(name):
    # The scikit-learn estimators are imported on first use: importing sklearn.base costs
    # about 0.5 s, which ``import gpvi`` alone should not pay.
    if name in _ESTIMATORS or name == "estimators":
        import importlib

        estimators = importlib.import_module(f"{__name__}.estimators")
        return estimators if name == "estimators" else getattr(estimators, name)
    raise AttributeError(f"module 'gpvi' has no attribute {name!r}")

__all__ = [
    "GLM", "GP", "SparseGP", "Model", "fit", "FitResult", "State", "Objective", "prior_state",
    "kernels", "likelihoods", "engines", "metrics", "learnable_parameters", "Module", "param",
    "static", "io", "diagnostics", "stream", "fit_stream", "GPClassifier", "GPRegressor", "GPCountRegressor", "GPOrdinalRegressor",
    "montecarlo", "MonteCarlo", "warped", "Warped", "pointprocess", "multilatent", "MultiLatent",
    "softmax", "Softmax",
]
