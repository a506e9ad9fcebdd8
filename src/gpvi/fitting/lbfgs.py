"""What the fitting layer's L-BFGS-B searches share: why a SciPy run stopped, in words, and
how many correction pairs a search keeps.

The searches themselves (the profile bound of :mod:`gpvi.fitting.hyper`, the collapsed bound of
:mod:`gpvi.fitting.collapsed`, the mixture bound of :mod:`gpvi.fitting.mog`) differ in what one
evaluation costs and returns; their prior terms come from :class:`gpvi.priors.LogPrior`.
"""
from __future__ import annotations

__all__ = ["stop_message", "memory"]

# L-BFGS-B keeps one correction pair per MEMORY_PER_PAIR unknowns, at least SciPy's 10 (so up to
# 219 unknowns nothing changes) and at most MEMORY_MAX: a search over inducing inputs has
# thousands of unknowns, and 10 pairs summarise too little of their curvature.  kin40k's
# collapsed bound (10 000 rows, M = 512 inducing inputs in 8 dimensions: 4 106 unknowns;
# benchmarks/README.md, "kin40k: a longer L-BFGS-B memory"): after 100 iterations the bound was
# −1747 with 10 pairs, −1622 with 50 and −1581 with 200 (test nMSE 0.0427, 0.0408, 0.0401), and
# 200 iterations with 200 pairs reached −1447 (nMSE 0.0383) against −1559 (0.0397) with 10; at
# M = 256, 100 iterations gave −3480 with 10 pairs and −3303 with 100.  The iterations took no
# longer (the pairs cost O(m·n) a step, against 0.55 s for one value and gradient of the bound).
MEMORY_PER_PAIR, MEMORY_MAX = 20, 200


def memory(num_unknowns: int) -> int:
    """L-BFGS-B's ``maxcor`` (the correction pairs kept) for a search over ``num_unknowns``
    unknowns: one pair per 20 unknowns, at least 10 (SciPy's default) and at most 200."""
    return int(min(MEMORY_MAX, max(10, num_unknowns // MEMORY_PER_PAIR)))


def stop_message(out, max_rounds, limit: str = "max_rounds") -> str:
    """Why a SciPy L-BFGS-B run ``out`` (an ``OptimizeResult``) of at most ``max_rounds``
    iterations stopped: its message, prefixed ``"max_rounds reached"`` when it ran out of rounds
    (``limit`` names the limit in that prefix)."""
    msg = getattr(out, "message", "") or ""
    msg = msg.decode() if isinstance(msg, bytes) else str(msg)  # bytes: old SciPy versions
    if int(getattr(out, "nit", 0)) >= max_rounds:
        return f"{limit} reached ({max_rounds} L-BFGS-B iterations): {msg}" if msg else f"{limit} reached"
    return msg or "L-BFGS-B stopped (no message)"
