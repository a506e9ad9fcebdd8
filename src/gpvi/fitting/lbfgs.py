"""What the fitting layer's L-BFGS-B searches share: why a SciPy run stopped, in words.

The searches themselves (the profile bound of :mod:`gpvi.fitting.hyper`, the collapsed bound of
:mod:`gpvi.fitting.collapsed`, the mixture bound of :mod:`gpvi.fitting.mog`) differ in what one
evaluation costs and returns; their prior terms come from :class:`gpvi.priors.LogPrior`.
"""
from __future__ import annotations

__all__ = ["stop_message"]


def stop_message(out, max_rounds, limit: str = "max_rounds") -> str:
    """Why a SciPy L-BFGS-B run ``out`` (an ``OptimizeResult``) of at most ``max_rounds``
    iterations stopped: its message, prefixed ``"max_rounds reached"`` when it ran out of rounds
    (``limit`` names the limit in that prefix)."""
    msg = getattr(out, "message", "") or ""
    msg = msg.decode() if isinstance(msg, bytes) else str(msg)  # bytes: old SciPy versions
    if int(getattr(out, "nit", 0)) >= max_rounds:
        return f"{limit} reached ({max_rounds} L-BFGS-B iterations): {msg}" if msg else f"{limit} reached"
    return msg or "L-BFGS-B stopped (no message)"
