"""Log-Gaussian Cox processes (Møller et al. 1998) as a Poisson GP on binned event times.

Recipe (Nguyen & Bonilla 2014, §4.5, coal-mining disasters)::

    centres, counts, exposure = gpvi.pointprocess.bin_events(times, start=0, stop=T, num_bins=B)
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=ell), gpvi.likelihoods.Poisson(),
                    mean=np.log(len(times) / T))            # log events per unit time
    res = gpvi.fit(model, centres[:, None], counts, exposure=exposure)
    m, v = res.predict_f(grid[:, None])                      # log intensity per unit time
    mean, var = gpvi.pointprocess.intensity_moments(m, v)   # E and Var of λ(x) = e^{f(x)}

The count in bin k is ``Poisson(|bin_k| · λ(x_k))`` with the intensity taken constant over the
bin, i.e. the Poisson likelihood with offset ``log |bin_k|`` (the ``exposure``), so ``f`` is the
log intensity per unit of the event times and does not depend on the binning.  (The paper
instead puts the bin width into the prior mean, ``log(191/811)`` per bin, which is the same
model when all bins are equal: pass ``exposure=None`` and a per-bin mean to reproduce it.)
"""
from __future__ import annotations

import numbers

import jax.numpy as jnp
import numpy as np
from gpvi._compile import jit

__all__ = ["bin_events", "intensity_moments"]


def bin_events(times, *, start=None, stop=None, num_bins: int | None = None, bin_width=None):
    """Counts of events in equal bins of ``[start, stop)``.

    Parameters
    ----------
    times : (E,) finite event times.
    start, stop : the observation window (default: the smallest and largest time, ``stop``
        then including the last event).
    num_bins : number of bins B; or ``bin_width`` (the last bin is then shorter when the
        window is not a whole number of widths, and its exposure says so).

    Returns
    -------
    centres : (B,) bin midpoints; counts : (B,) float event counts; exposure : (B,) bin
    lengths (pass as ``exposure=`` to :func:`gpvi.fit`).
    """
    t = np.asarray(times, dtype=np.float64).reshape(-1)
    if t.size == 0 or not np.all(np.isfinite(t)):
        raise ValueError("times must be a non-empty 1-D array of finite event times")
    lo = float(t.min()) if start is None else float(start)
    hi = float(t.max()) if stop is None else float(stop)
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise ValueError(f"start and stop must be finite with start < stop, got start={lo}, stop={hi}")
    if np.any((t < lo) | (t > hi)) or (stop is not None and np.any(t == hi)):
        raise ValueError(f"times has events outside the window [start, stop) = [{lo}, {hi})")
    if (num_bins is None) == (bin_width is None):
        raise ValueError("give exactly one of num_bins (a positive int) and bin_width (a positive number)")
    if num_bins is not None:
        if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral) or num_bins < 1:
            raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")
        edges = np.linspace(lo, hi, int(num_bins) + 1)
    else:
        if not isinstance(bin_width, numbers.Real) or not np.isfinite(bin_width) or bin_width <= 0:
            raise ValueError(f"bin_width must be a positive number, got {bin_width!r}")
        k = int(np.ceil((hi - lo) / bin_width - 1e-12))
        edges = np.minimum(lo + bin_width * np.arange(k + 1), hi)
        edges[-1] = hi
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2)
    counts = np.bincount(idx, minlength=edges.size - 1).astype(np.float64)
    return 0.5 * (edges[:-1] + edges[1:]), counts, np.diff(edges)


@jit
def intensity_moments(m, v):
    """Mean and variance of the intensity ``λ = e^f`` for ``f ~ N(m, v)`` (lognormal), as JAX
    arrays of the shape of ``m`` and ``v`` (one compiled program per shape)."""
    m, v = jnp.asarray(m), jnp.asarray(v)
    mean = jnp.exp(m + 0.5 * v)
    return mean, jnp.expm1(v) * mean**2
