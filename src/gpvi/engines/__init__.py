"""Inference engines: each is ``run(objective, state, *, tol, max_iter, callback)`` →
:class:`~gpvi.engines._common.EngineResult`, all maximising the same VLB.

=============  ==================================================================
``fpi``        incremental fixed point: Newton on m + FP on V per step (default)
``fpb``        batch fixed point: Newton on m to convergence, then FP on V
``gradient``   L-BFGS on (m, chol V) jointly
``laplace``    Laplace approx.: Newton on the mode, V = (−∇²Ψ)⁻¹ (not a VLB maximiser)
``dual``       L-BFGS-B on the dual (Khan et al. 2013; Gaussian, Poisson, Bernoulli only)
``ivsgpr``     minibatch stochastic mirror ascent learning θ and Z online (Cheng & Boots 2016;
               sparse GP, Gaussian likelihood)
``sfp``        stochastic fixed point: natural-parameter averaging over minibatches
``svi``        minibatch AdaDelta/Adam on (m, chol V[, θ]) (Hensman et al. 2015)
=============  ==================================================================
"""
from . import dual, fpb, fpi, gradient, ivsgpr, laplace, sfp, svi
from ._common import EngineResult

ENGINES = {"fpi": fpi.run, "fpb": fpb.run, "gradient": gradient.run, "laplace": laplace.run,
           "dual": dual.run, "svi": svi.run, "sfp": sfp.run, "ivsgpr": ivsgpr.run}

__all__ = ["ENGINES", "EngineResult", "fpb", "fpi", "gradient", "laplace"]
