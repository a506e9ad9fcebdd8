"""``engine="auto"``: the engine gpvi expects to reach a certified optimum fastest for a model.

:func:`choose` goes through :data:`PREFERENCE`, the certified engines (those that stop on an
estimated gap to the optimum of the VLB, :attr:`~gpvi.engines.Engine.certifies`) in the order of
their measured time to that certificate, and takes the first that can run the problem: one that
fits several latent functions for a :class:`~gpvi.MultiLatent` model, one that needs only the
data sums when the data are read block by block (``executor=`` or a source).  The reason it gives
names the model's kind, so a fit says why it ran the engine it ran
(``FitResult.extras["engine_choice"]``).

The order comes from ``benchmarks/auto.py``: every certified engine on GLMs, full GPs and sparse
GPs with Gaussian, Bernoulli, Poisson, Laplace and Student-t likelihoods and on a three-class
softmax GP, at the default tolerance, timed from a compiled start.  ``fpi`` was the fastest, or
within the timing noise (×1.25) of the fastest, in 15 of the 16 cells, including most outside the
fixed-point conditions of Sheth & Khardon (2016) (Laplace, Student-t), where its safeguards
(damping, the clipped γ, the L-BFGS rescue) keep it certified.  The exception: on the sparse
Student-t GP ``fpb`` was 1.8× faster (0.22 against 0.39 s), but on the Student-t GLM 3× slower
and on the full Student-t GP within the noise, so no rule by likelihood would have picked better
everywhere; ``gradient`` was 2–170× slower on the GP cells.  The jj/Taylor engines certify only
their own surrogate bound and the stochastic engines certify nothing, so ``auto`` never picks
them.  Gaussian likelihoods learn θ on the collapsed bound with whichever of these engines runs
(see :mod:`gpvi.fitting.hyper`).
"""
from __future__ import annotations

import dataclasses

from gpvi.engines.registry import REGISTRY, Engine

__all__ = ["AUTO", "PREFERENCE", "Choice", "choose"]

#: The name that asks for the choice.
AUTO = "auto"

#: Certified engines, fastest first (measured by ``benchmarks/auto.py``; see the module docstring).
PREFERENCE = ("fpi", "fpb", "gradient")


@dataclasses.dataclass(frozen=True)
class Choice:
    """The engine :func:`choose` picked, and why (one line)."""

    engine: Engine
    reason: str


def _kind(model) -> str:
    lik = getattr(model, "likelihood", None)
    Q = getattr(model, "num_latents", None)
    what = type(model).__name__ + (f" with {Q} latent functions" if Q else "")
    return f"{what}, {type(lik).__name__} likelihood"


def _why(name: str, model, blockwise: bool) -> str:
    lik = type(getattr(model, "likelihood", None)).__name__
    if name != PREFERENCE[0]:
        return f"the fastest certified engine that can run a {_kind(model)}{' read block by block' if blockwise else ''}"
    if lik == "Gaussian":
        return ("Gaussian likelihood: fpi's first Newton and fixed-point step is the exact posterior, and "
                "learned hyperparameters take the collapsed bound")
    if getattr(model, "num_latents", None):
        return (f"{_kind(model)}: fpi takes one natural step per latent block, with the joint Newton direction "
                "where the likelihood couples the latents")
    return (f"{_kind(model)}: fpi reached a certified optimum fastest (or within the timing noise) on every "
            "model kind and likelihood measured (benchmarks/auto.py)")


def choose(model, *, blockwise: bool = False) -> Choice:
    """The engine for ``model`` (see the module docstring); ``blockwise``: the data are read block
    by block (an executor or a source), so the engine must need only the data sums."""
    Q = getattr(model, "num_latents", None)
    refused = []
    for name in PREFERENCE:
        eng = REGISTRY.get(name)
        if eng is None:
            continue
        if Q is not None and not eng.latents:
            refused.append(f"{name} (one latent function only)")
            continue
        if blockwise and eng.data != "sums":
            refused.append(f"{name} (needs the rows in memory)")
            continue
        return Choice(eng, f"engine='auto' chose {name!r}: {_why(name, model, blockwise)}")
    raise ValueError(f"engine='auto': no certified engine can run a {_kind(model)}"
                     f"{' read block by block' if blockwise else ''}"
                     + (f" ({'; '.join(refused)})" if refused else "") + "; name an engine")
