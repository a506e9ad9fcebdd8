"""Inference engines, one :class:`Engine` record each in one registry (:mod:`gpvi.engines.registry`).

Every engine maximises the same VLB: ``run(objective, state, *, tol, max_iter, callback, on_state,
...)`` → :class:`~gpvi.engines._common.EngineResult`; ``on_state(model, state, progress)``
(:class:`Progress`) sees every iterate and stops the run by returning True.  ``ENGINES`` maps each name to its record (a record
is callable like its ``run``); :func:`register` adds one.  The engines gpvi ships:

=============  ==================================================================
``fpi``        incremental fixed point: Newton on m + FP on V per step (default)
``fpb``        batch fixed point: Newton on m to convergence, then FP on V
``gradient``   L-BFGS on (m, chol V) jointly
``laplace``    Laplace approx.: Newton on the mode, V = (−∇²Ψ)⁻¹ (not a VLB maximiser)
``dual``       L-BFGS-B on the dual (Khan et al. 2013; Gaussian, Poisson, Bernoulli only)
``ivsgpr``     minibatch stochastic mirror ascent learning θ and Z online (Cheng & Boots 2016;
               sparse GP, Gaussian likelihood)
``jj``         Jaakkola–Jordan bound, analytic ξ, μ, Σ (Izmailov & Kropotov 2017; Bernoulli logit)
``taylor``     Taylor expansion at the marginal means, analytic μ, Σ (same paper)
``jj-hybrid``  JJ rounds alternating with L-BFGS-B on ξ (and θ)
``jj-full``    L-BFGS-B on ξ (and θ), μ, Σ analytic
``sfp``        stochastic fixed point: natural-parameter averaging over minibatches
``svi``        minibatch AdaDelta/Adam on (m, chol V[, θ]) (Hensman et al. 2015)
=============  ==================================================================

``engine="auto"`` (:func:`gpvi.engines.auto.choose`) picks the certified engine measured fastest
for the model's kind and says why in ``FitResult.extras["engine_choice"]``.
"""
from gpvi.engines import auto, dual, fpb, fpi, gradient, ivsgpr, jj, laplace, sfp, svi
from gpvi.engines._common import STOPPED, EngineResult, Progress
from gpvi.engines.registry import REGISTRY, Engine, get, names, register, unregister

for _module in (fpi, fpb, gradient, laplace, dual, sfp, svi, ivsgpr):
    register(_module.ENGINE)
for _engine in jj.ENGINES:
    register(_engine)

#: name → :class:`Engine` (the registry itself: engines registered later appear here too).
ENGINES = REGISTRY

__all__ = ["ENGINES", "Engine", "EngineResult", "Progress", "STOPPED", "register", "unregister", "get", "names",
           "auto", "dual", "fpb", "fpi", "gradient", "ivsgpr", "jj", "laplace", "sfp", "svi"]
