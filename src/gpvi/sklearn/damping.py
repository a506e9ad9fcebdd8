"""Telling the user when the fixed-point engines' safeguard dominated a fit.

fpi and fpb damp a step that would lower the VLB (backtracking on the natural-gradient step
size; :class:`gpvi.engines._common.SafeguardedAscent`).  A few damped steps are normal; a fit
in which a large share of the passes over the data went into damped steps was slow for a reason
the user can act on (an ill-conditioned posterior: a huge kernel variance, duplicated inputs,
near-separable classes), yet it still reports ``converged=True`` when it got there.
:func:`warn_if_dominated` raises a :class:`sklearn.exceptions.ConvergenceWarning`-like
``UserWarning`` subclass in that case.
"""
from __future__ import annotations

import warnings

__all__ = ["DampingWarning", "damped_share", "warn_if_dominated", "DOMINATED_SHARE", "DOMINATED_MIN_STEPS"]

# A fit is "dominated by damping" when at least this share of its passes over the data went into
# damped (rejected) steps, and there were at least this many of them.
#: Share of a fit's passes over the data spent in damped steps from which it is "dominated by damping".
DOMINATED_SHARE = 0.25
#: Fewest damped steps for a fit to count as dominated by damping.
DOMINATED_MIN_STEPS = 50


class DampingWarning(UserWarning):
    """Most of a fit's work went into damped fixed-point steps."""


def damped_share(result) -> float:
    """Damped steps per pass over the data of a :class:`gpvi.FitResult` (0 when no passes)."""
    return result.backtracks / result.evaluations if result.evaluations else 0.0


def warn_if_dominated(result, stacklevel: int = 3) -> bool:
    """Warn (:class:`DampingWarning`) when ``result`` was dominated by damped steps; returns
    whether it warned."""
    share = damped_share(result)
    if result.backtracks < DOMINATED_MIN_STEPS or share < DOMINATED_SHARE:
        return False
    warnings.warn(
        f"the {result.engine} engine damped {result.backtracks} steps ({share:.0%} of its "
        f"{result.evaluations} passes over the data) during this fit: the posterior is ill-conditioned "
        "(e.g. a very large kernel variance, duplicated inputs or separable classes), so the fit was slow "
        "even though it reports converged=True; consider engine='gradient', fixing the kernel variance "
        "or removing duplicated rows", DampingWarning, stacklevel=stacklevel)
    return True
