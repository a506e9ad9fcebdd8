"""Evaluation metrics used in the papers (all take 1-D arrays of equal length).

``mfe`` is the mean fractional error of count predictions used by Sheth et al. (2015):
``mean(|y − ŷ| / max(y, 1))`` (the ``max`` keeps zero counts finite).
"""
from __future__ import annotations

import numpy as np

__all__ = ["error_rate", "mze", "mfe", "mae", "rmse", "nmse", "sse", "nlpd"]


def _pair(y, yhat):
    y, yhat = np.asarray(y, dtype=np.float64), np.asarray(yhat, dtype=np.float64)
    if y.shape != yhat.shape or y.ndim != 1:
        raise ValueError(f"y and prediction must be 1-D of one length, got {y.shape} and {yhat.shape}")
    if y.size == 0:
        raise ValueError("y is empty")
    return y, yhat


def error_rate(y, yhat) -> float:
    """Fraction of labels predicted wrongly (mean zero-one error)."""
    y, yhat = _pair(y, yhat)
    return float(np.mean(y != yhat))


#: Mean zero-one error: :func:`error_rate` under the name ordinal-regression papers use.
mze = error_rate


def mfe(y, yhat) -> float:
    """Mean fractional error ``mean(|y − ŷ| / max(y, 1))`` for counts."""
    y, yhat = _pair(y, yhat)
    return float(np.mean(np.abs(y - yhat) / np.maximum(np.abs(y), 1.0)))


def mae(y, yhat) -> float:
    """Mean absolute error."""
    y, yhat = _pair(y, yhat)
    return float(np.mean(np.abs(y - yhat)))


def rmse(y, yhat) -> float:
    """Root mean squared error."""
    y, yhat = _pair(y, yhat)
    return float(np.sqrt(np.mean((y - yhat) ** 2)))


def sse(y, yhat) -> float:
    """Sum of squared errors."""
    y, yhat = _pair(y, yhat)
    return float(np.sum((y - yhat) ** 2))


def nmse(y, yhat) -> float:
    """Mean squared error divided by the variance of ``y`` (1 = predicting the mean)."""
    y, yhat = _pair(y, yhat)
    var = np.var(y)
    if var == 0:
        raise ValueError("nmse is undefined when y is constant")
    return float(np.mean((y - yhat) ** 2) / var)


def nlpd(log_predictive_density) -> float:
    """Negative log predictive density averaged over points, from per-point log densities."""
    lpd = np.asarray(log_predictive_density, dtype=np.float64)
    if lpd.ndim != 1 or lpd.size == 0:
        raise ValueError("log_predictive_density must be a non-empty 1-D array")
    return float(-np.mean(lpd))
