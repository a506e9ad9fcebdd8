"""Plots of fits (needs matplotlib: ``pip install "gpvi[plot]"``).

- :func:`plot_traces` — VLB against wall-clock time of several fits on one axis, e.g. the
  same model fitted by different engines;
- :func:`plot_posterior_1d` — the posterior of a model with one input: the predictive mean
  with a 95 % band, the data, and the inducing inputs of a sparse GP;
- :func:`plot_condition_map` — the sign of ∂γ/∂v over (m, v) from
  :func:`gpvi.diagnostics.check_conditions` (Sheth & Khardon 2016, Fig. 1).

All draw on ``ax`` (a new figure when ``None``) and return the axis.  matplotlib is
imported only when a plot is drawn, so ``import gpvi.plots`` works without it.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["plot_traces", "plot_posterior_1d", "plot_condition_map", "require_matplotlib"]

_Z95 = 1.959963984540054


def require_matplotlib():
    """Import and return ``matplotlib.pyplot``, or raise ImportError saying which extra to install."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError('gpvi plots need matplotlib, which is not installed: pip install "gpvi[plot]"') from None
    return plt


def _axis(ax):
    if ax is None:
        plt = require_matplotlib()
        _, ax = plt.subplots(figsize=(6, 4))
    return ax


def plot_traces(fits, ax=None, *, gap: bool = False, markers: bool = True):
    """VLB against time of each fit in ``fits`` (a dict ``{name: FitResult}``), one line each.

    Each line is the fit's ``trace`` (seconds since the start of the fit, VLB): one point per
    engine iteration, or per hyperparameter round when hyperparameters were learned.  With
    ``gap=True`` the y-axis is the distance to the best VLB of all fits, ``max VLB − VLB``, on
    a log scale (points at the best value are dropped), which shows convergence better when
    the first iterations are far below the optimum.
    """
    if not isinstance(fits, dict) or not fits:
        raise ValueError("fits must be a non-empty dict {name: FitResult}")
    traces = {}
    for name, fit in fits.items():
        tr = np.asarray(getattr(fit, "trace", None), dtype=np.float64)
        if tr.ndim != 2 or tr.shape[1] != 2 or tr.shape[0] == 0:
            raise ValueError(f"fits[{name!r}] has no (seconds, VLB) trace: expected a gpvi FitResult")
        traces[name] = tr
    ax = _axis(ax)
    best = max(float(np.max(tr[:, 1])) for tr in traces.values())
    for name, tr in traces.items():
        t, v = tr[:, 0], tr[:, 1]
        if gap:
            v = best - v
            keep = v > 0
            t, v = t[keep], v[keep]
        ax.plot(t, v, marker="o" if markers else None, markersize=3, label=str(name))
    ax.set_xlabel("seconds")
    if gap:
        ax.set_yscale("log")
        ax.set_ylabel("best VLB − VLB (nats)")
    else:
        ax.set_ylabel("VLB (nats)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return ax


def plot_posterior_1d(fit, X, y=None, ax=None, *, grid=None, scale: str = "data", offset=None):
    """The posterior of a model with one input column.

    ``scale="data"`` (default) draws the predictive mean ``E[y]`` on a grid with a band where
    the conditional mean ``E[y | f]`` lies with 95 % posterior probability (``f`` at the latent
    mean ± 1.96 sd, mapped through the likelihood's mean function), and the data ``(X, y)`` as
    points (Bernoulli labels as 0/1, ordinal levels as 0…L−1).  ``scale="latent"`` draws the
    latent mean ± 1.96 sd instead (data are then not drawn).  The inducing inputs of a sparse
    GP are marked along the bottom of the axis.  ``grid`` defaults to 300 points spanning
    ``X`` (plus 5 % each side); ``offset`` is a constant added to the latent (e.g. log exposure).
    """
    if scale not in ("data", "latent"):
        raise ValueError(f"scale must be 'data' or 'latent', got {scale!r}")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 2 and X.shape[1] == 1:
        X = X[:, 0]
    if X.ndim != 1 or X.size == 0:
        raise ValueError(f"plot_posterior_1d needs one input column, got X of shape {np.shape(X)}")
    if grid is None:
        lo, hi = float(np.min(X)), float(np.max(X))
        pad = 0.05 * (hi - lo) if hi > lo else 1.0
        grid = np.linspace(lo - pad, hi + pad, 300)
    grid = np.asarray(grid, dtype=np.float64).reshape(-1)
    off = None if offset is None else np.full(grid.size, float(offset))
    m, v = fit.predict_f(grid[:, None], off)
    sd = np.sqrt(np.maximum(v, 0.0))
    ax = _axis(ax)
    lik = fit.model.likelihood
    if scale == "latent":
        line, lo_b, hi_b = m, m - _Z95 * sd, m + _Z95 * sd
        ax.set_ylabel("latent f")
        label_line, label_band = "latent mean", "95% band"
    else:
        line, _ = fit.predict_y(grid[:, None], off)

        def cond_mean(f):  # E[y | f]: the predictive mean with zero latent variance
            mean, _ = lik.predict_mean_and_var(jnp.asarray(f), jnp.zeros_like(jnp.asarray(f)))
            return np.asarray(mean)

        lo_b, hi_b = cond_mean(m - _Z95 * sd), cond_mean(m + _Z95 * sd)
        lo_b, hi_b = np.minimum(lo_b, hi_b), np.maximum(lo_b, hi_b)
        ax.set_ylabel("y")
        label_line, label_band = "predictive mean", "95% band of E[y | f]"
    (ln,) = ax.plot(grid, line, label=label_line)
    ax.fill_between(grid, lo_b, hi_b, color=ln.get_color(), alpha=0.25, label=label_band)
    if y is not None and scale == "data":
        y = np.asarray(y)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
        y_plot = np.asarray(lik.decode(lik.validate(y)), dtype=np.float64)
        ax.plot(X, y_plot, "k.", markersize=4, label="data")
    Z = getattr(fit.model, "inducing", None)
    if Z is not None and np.ndim(Z) == 2:
        ax.plot(np.asarray(Z)[:, 0], np.zeros(np.shape(Z)[0]), "|", color="tab:red", markersize=12,
                markeredgewidth=1.5, transform=ax.get_xaxis_transform(), clip_on=False,
                label="inducing inputs")
    ax.set_xlabel("x")
    ax.legend()
    return ax


# ---- convergence conditions (Sheth & Khardon 2016, Fig. 1) --------------------------------
_SIGN_COLOURS = {-1: "#4477aa", 0: "#dddddd", 1: "#ee9933", 2: "#aa3377"}
_SIGN_LABELS = {-1: "γ decreasing in v", 0: "γ flat in v (≈ 0)", 1: "γ increasing in v",
                2: "sign depends on y"}


def plot_condition_map(report, points=None, ax=None, *, y_index=None, point_size: float = 6.0,
                       legend: bool = True):
    """The sign of ∂γ/∂v over the ``(m, v)`` grid of a :class:`gpvi.diagnostics.ConditionReport`,
    like Figure 1a of Sheth & Khardon (2016), optionally with ``(m_i, v_i)`` points over it
    (Figure 1b/c).

    Colours: γ decreasing in v (blue), increasing (orange), flat up to rounding (grey) and,
    when the report holds several y values and ``y_index`` is None, purple where the sign
    differs between them (:attr:`ConditionReport.combined_sign`).  ``y_index`` picks the map
    of one y value (``report.y_values[y_index]``).  ``points``: a
    :class:`gpvi.diagnostics.FitConditions`, a pair ``(m, v)`` of (N,) arrays or an (N, 2)
    array; drawn as small black dots.  The x-axis is m, the y-axis v.
    """
    for attr in ("sign", "m", "v", "y_values"):
        if not hasattr(report, attr):
            raise ValueError("report must be a gpvi.diagnostics.ConditionReport (from check_conditions)")
    if y_index is None:
        sign = report.combined_sign if report.sign.shape[0] > 1 else report.sign[0]
    else:
        K = len(report.y_values)
        if isinstance(y_index, bool) or int(y_index) != y_index or not (-K <= y_index < K):
            raise ValueError(f"y_index must index report.y_values (length {len(report.y_values)}), got {y_index!r}")
        sign = report.sign[int(y_index)]
    pm = pv = None
    if points is not None:
        if hasattr(points, "m") and hasattr(points, "v"):
            pm, pv = points.m, points.v
        elif isinstance(points, tuple) and len(points) == 2:
            pm, pv = points
        else:
            arr = np.asarray(points, dtype=np.float64)
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise ValueError("points must be a FitConditions, a pair (m, v) of arrays or an (N, 2) array")
            pm, pv = arr[:, 0], arr[:, 1]
        pm, pv = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (pm, pv))
        if pm.shape != pv.shape:
            raise ValueError(f"points: m has {pm.size} entries but v has {pv.size}")
    ax = _axis(ax)
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    keys = [-1, 0, 1, 2]
    cmap = ListedColormap([_SIGN_COLOURS[k] for k in keys])
    norm = BoundaryNorm([-1.5, -0.5, 0.5, 1.5, 2.5], cmap.N)
    ax.pcolormesh(np.asarray(report.m), np.asarray(report.v), np.asarray(sign).T, cmap=cmap, norm=norm,
                  shading="nearest", rasterized=True)
    if pm is not None:
        ax.scatter(pm, pv, s=point_size, c="k", linewidths=0, label="(m_i, v_i)")
    ax.set_xlabel("m")
    ax.set_ylabel("v")
    ax.set_xlim(float(report.m[0]), float(report.m[-1]))
    ax.set_ylim(float(report.v[0]), float(report.v[-1]))
    if legend:
        present = [k for k in keys if np.any(np.asarray(sign) == k)]
        handles = [Patch(color=_SIGN_COLOURS[k], label=_SIGN_LABELS[k]) for k in present]
        if pm is not None:
            handles.append(ax.collections[-1])
        ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.85)
    return ax
