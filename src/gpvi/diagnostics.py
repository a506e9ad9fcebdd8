"""Convergence conditions of the fixed-point update (Sheth & Khardon 2016, §3).

The fixed-point (FP) update of the covariance is ``V ← (Σ⁻¹ + Σ_i γ_i d_i d_iᵀ)⁻¹`` with

``γ(m, v) = −2 ∂E/∂v``,  ``E(m, v) = E_{N(f|m,v)}[log p(y|f)]``

(``= E[−∂²_f log p]`` for twice-differentiable likelihoods; gpvi's
:meth:`~gpvi.likelihoods.Likelihood.variational_moments` returns ``λ = 2∂E/∂v = −γ``).
Theorem 1 of the paper gives sufficient conditions for the FP iteration to converge:

- **Condition 1**: ``γ(m, v) ≥ 0`` for all ``(m, v)`` (log-concave likelihoods);
- **Condition 2a**: ``γ`` non-decreasing in ``v`` for every fixed ``m``;
- **Condition 2b**: ``γ`` non-increasing in ``v`` for every fixed ``m``;
- C1 + 2a ⇒ FP converges to ``V*`` or to a 2-cycle; C1 + 2b ⇒ FP converges to ``V*``.

This module evaluates ``γ`` and ``∂γ/∂v`` for any gpvi likelihood and checks the conditions

- on a grid of ``(m, v)`` (:func:`check_conditions`, the paper's Figure 1a), and
- at the latent marginals ``(m_i, v_i)`` of a fitted model (:func:`check_fit`, Figure 1b/c).

How ``γ`` is computed
---------------------
Where the likelihood's expectation ``E`` has a closed form (Gaussian, Poisson, exponential,
Laplace, stochastic volatility) ``γ = −2∂E/∂v`` and ``∂γ/∂v = −2∂²E/∂v²`` are the exact
derivatives (JAX autodiff) of that closed form, e.g. Poisson ``γ = e^{m+v/2}``, exponential
(gpvi's rate ``e^{−f}``) ``γ = y e^{−m+v/2}``, stochastic volatility ``γ = ½y²e^{−m+v/2}``,
Laplace ``γ = 2 N(y | m, v)/b``, Gaussian ``γ = 1/σ²``.  Otherwise ``E`` is a high-order
Gauss–Hermite sum (200 nodes by default; the paper used 1000) and the same two derivatives
are taken by autodiff of it.  The nodes come from :func:`scipy.special.roots_hermitenorm`,
which stays accurate beyond the ≈360 nodes where NumPy's ``hermgauss`` weights underflow.
``gamma_slope(..., method="fd")`` offers the paper's central differences (δ = 1e-6) instead,
as an independent check.

Slopes that are zero up to rounding (``|∂γ/∂v| ≤ rtol·|γ|`` at the same point,
``rtol = 1e-10``) count as zero, so a ``γ`` that does not depend on ``v`` (Gaussian) satisfies
both 2a and 2b.  A grid check is evidence, not proof: the verdict holds on the grid checked.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from gpvi.likelihoods import Bernoulli, Exponential, Gaussian, Laplace, Likelihood, Ordinal, Poisson, StochasticVolatility, StudentT
from gpvi._compile import jit

__all__ = ["gamma", "gamma_slope", "check_conditions", "check_fit", "has_closed_form",
           "ConditionReport", "FitConditions", "DEFAULT_QUADRATURE"]

#: Gauss-Hermite points of the checks for a likelihood without closed-form expectations.
DEFAULT_QUADRATURE = 200
_CLOSED_FORM = (Gaussian, Poisson, Exponential, Laplace, StochasticVolatility)
_RTOL = 1e-10
_FD_DELTA = 1e-6
# Nodes × points per block of the vectorised evaluation: bounds the working memory
# (a few arrays of this many float64) whatever the grid size.
_BLOCK_ELEMENTS = 2**21


def has_closed_form(likelihood) -> bool:
    """Whether :func:`gamma` uses a closed-form ``E`` for ``likelihood`` (exact class match:
    a subclass may change ``log_prob`` without changing ``expected_log_prob``)."""
    return type(likelihood) in _CLOSED_FORM


@lru_cache(maxsize=16)
def _nodes(n: int):
    import scipy.special

    z, w = scipy.special.roots_hermitenorm(n)
    return z, w / np.sqrt(2.0 * np.pi)  # weights of E_{N(0,1)}


def _resolve(likelihood, quadrature):
    """``(closed, n)``: closed form when available and no order is forced, else GH order n."""
    if not isinstance(likelihood, Likelihood):
        raise ValueError(f"likelihood must be a gpvi Likelihood, got {type(likelihood).__name__}")
    if quadrature is None:
        return (True, 0) if has_closed_form(likelihood) else (False, DEFAULT_QUADRATURE)
    if isinstance(quadrature, (bool, np.bool_)) or int(quadrature) != quadrature or int(quadrature) < 2:
        raise ValueError(f"quadrature must be None or an int ≥ 2 (Gauss–Hermite points), got {quadrature!r}")
    return False, int(quadrature)


@partial(jit, static_argnames=("closed", "slope", "block", "kind"))
def _evaluate(lik, z, w, y, m, v, closed, slope, block, kind):
    """γ (and ∂γ/∂v when ``slope``) at flat (P,) arrays, P a multiple of ``block``.

    ``kind`` is ``type(lik)``, unused in the body: it keys the jit cache on the likelihood
    class, because treedefs from ``jax.tree_util.register_dataclass`` of two classes with
    the same field layout (e.g. Poisson and Exponential) compare equal in this JAX version,
    and the cache then runs one class's compiled code for the other now and then.
    """
    if closed:
        def E(yy, mm, vv):
            return lik.expected_log_prob(yy, mm, vv)
    else:
        def E(yy, mm, vv):
            return jnp.sum(w * lik.log_prob(yy, mm + jnp.sqrt(vv) * z))

    def g(yy, mm, vv):
        return -2.0 * jax.grad(E, argnums=2)(yy, mm, vv)

    def one_block(args):
        yy, mm, vv = args
        out = jax.vmap(g)(yy, mm, vv)
        if slope:
            return out, jax.vmap(jax.grad(g, argnums=2))(yy, mm, vv)
        return out, out

    shape = (-1, block)
    gam, slo = jax.lax.map(one_block, (y.reshape(shape), m.reshape(shape), v.reshape(shape)))
    return gam.reshape(-1), slo.reshape(-1)


def _as_real(a, name):
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or array") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _codes(likelihood, y):
    """``y`` (any shape, user coding) mapped to the likelihood's internal codes."""
    try:
        arr = np.asarray(y)
    except (TypeError, ValueError):
        raise ValueError("y must be a number or a rectangular array of observations") from None
    return likelihood.validate(arr.reshape(-1)).reshape(arr.shape)


def _prepare(likelihood, y, m, v):
    _resolve(likelihood, None)  # a clear error for a non-likelihood before it is used
    codes = _codes(likelihood, y)
    m = _as_real(m, "m")
    v = _as_real(v, "v")
    if np.any(v <= 0):
        raise ValueError("v (the latent variances) must be positive")
    return np.broadcast_arrays(codes, m, v)


def _raw(likelihood, y, m, v, quadrature, slope):
    """γ and ∂γ/∂v (autodiff) at already-validated, broadcast arrays of one shape."""
    closed, n = _resolve(likelihood, quadrature)
    # Parameters as JAX arrays: a list-valued parameter (e.g. Ordinal edges=[...]) would
    # otherwise be traced leaf by leaf and fail the likelihood's own input checks under jit.
    likelihood = likelihood.with_parameters({k: jnp.asarray(p, jnp.float64)
                                             for k, p in likelihood.parameters().items()})
    shape = np.shape(m)
    yf, mf, vf = (np.ravel(a).astype(np.float64) for a in (y, m, v))
    P = yf.size
    if P == 0:
        return np.zeros(shape), np.zeros(shape)
    block = int(min(P, max(1, _BLOCK_ELEMENTS // max(n, 1))))
    pad = -P % block
    if pad:  # pad with copies of the first point (finite values), dropped below
        yf, mf, vf = (np.concatenate([a, np.repeat(a[:1], pad)]) for a in (yf, mf, vf))
    z, w = _nodes(n) if not closed else (np.zeros(1), np.zeros(1))
    gam, slo = _evaluate(likelihood, jnp.asarray(z), jnp.asarray(w), jnp.asarray(yf), jnp.asarray(mf),
                         jnp.asarray(vf), closed=closed, slope=slope, block=block, kind=type(likelihood))
    return np.asarray(gam)[:P].reshape(shape), np.asarray(slo)[:P].reshape(shape)


def gamma(likelihood, y, m, v, *, quadrature=None):
    """``γ(m, v) = −2 ∂E_{N(f|m,v)}[log p(y|f)]/∂v`` elementwise.

    Parameters
    ----------
    likelihood : a gpvi likelihood.
    y, m, v : observations (in the user's coding, e.g. Bernoulli labels {0, 1}; checked by
        ``likelihood.validate``), latent means and latent variances (> 0); broadcast together.
    quadrature : ``None`` (closed form where the likelihood has one, see
        :func:`has_closed_form`, else 200-point Gauss–Hermite) or an int: Gauss–Hermite with
        that many points, even where a closed form exists.

    Returns
    -------
    np.ndarray of the broadcast shape of ``y, m, v``.
    """
    y, m, v = _prepare(likelihood, y, m, v)
    return _raw(likelihood, y, m, v, quadrature, slope=False)[0]


def _fd_slope(likelihood, y, m, v, quadrature, delta):
    if not (delta > 0):
        raise ValueError(f"delta must be positive, got {delta!r}")
    # A step below v/2 keeps v − δ positive for variances near 0.
    d = np.minimum(delta, 0.5 * v)
    hi = _raw(likelihood, y, m, v + d, quadrature, slope=False)[0]
    lo = _raw(likelihood, y, m, v - d, quadrature, slope=False)[0]
    return (hi - lo) / (2.0 * d)


def gamma_slope(likelihood, y, m, v, *, method: str = "autodiff", delta: float = _FD_DELTA, quadrature=None):
    """``∂γ(m, v)/∂v`` elementwise (shapes and arguments as :func:`gamma`).

    ``method="autodiff"`` (default) differentiates the closed form or the Gauss–Hermite sum
    exactly; ``method="fd"`` takes central differences ``(γ(v+δ) − γ(v−δ)) / 2δ`` with
    ``δ = min(delta, v/2)`` like Sheth & Khardon (2016, Fig. 1: δ = 1e-6).  Central
    differences carry a rounding error of about ``1e-16·|γ|/δ``.
    """
    if method not in ("autodiff", "fd"):
        raise ValueError(f"method must be 'autodiff' or 'fd', got {method!r}")
    y, m, v = _prepare(likelihood, y, m, v)
    if method == "fd":
        return _fd_slope(likelihood, y, m, v, quadrature, delta)
    return _raw(likelihood, y, m, v, quadrature, slope=True)[1]


def _gamma_and_slope(likelihood, y, m, v, quadrature, method, delta):
    g, s = _raw(likelihood, y, m, v, quadrature, slope=(method == "autodiff"))
    if method == "fd":
        s = _fd_slope(likelihood, y, m, v, quadrature, delta)
    return g, s


def _signs(slope, atol):
    """−1, 0, +1 with ``|slope| ≤ atol`` counted as 0."""
    return np.where(slope > atol, 1, np.where(slope < -atol, -1, 0)).astype(np.int8)


def _theorem(c1, c2a, c2b) -> str:
    if not c1:
        return ("⇒ Theorem 1 does not apply (γ < 0 can make the FP covariance indefinite: clip γ at 0 "
                "with clip_gamma or rely on the engine's safeguards)")
    if c2b:
        return "⇒ FP converges to V* (Theorem 1, part 2)"
    if c2a:
        return "⇒ FP converges to V* or to a 2-cycle (Theorem 1, part 1)"
    return "⇒ Theorem 1 gives no guarantee (FP relies on its damping and cycle safeguards)"


def _verdict_text(c1, c2a, c2b, f1, f2a, f2b, where):
    pct = lambda f: f"{100 * f:.3g}%"  # noqa: E731
    parts = ["Condition 1 holds" if c1 else f"Condition 1 fails (γ < 0 on {pct(f1)} of {where})"]
    if c2a and c2b:
        parts.append("Conditions 2a and 2b both hold (γ does not depend on v)")
    elif c2a:
        parts.append(f"Condition 2a holds (2b fails on {pct(f2b)} of {where})")
    elif c2b:
        parts.append(f"Condition 2b holds (2a fails on {pct(f2a)} of {where})")
    else:
        parts.append(f"neither 2a nor 2b holds (γ decreasing in v on {pct(f2a)}, increasing on "
                     f"{pct(f2b)} of {where})")
    return "; ".join(parts)


@dataclasses.dataclass(frozen=True, eq=False)
class ConditionReport:
    """Conditions 1, 2a, 2b of Sheth & Khardon (2016) checked on a grid of ``(m, v)``.

    Attributes
    ----------
    likelihood : repr of the likelihood checked.
    y_values : (K,) observation values (internal codes) at which γ was evaluated.
    m : (Gm,) latent means; v : (Gv,) latent variances of the grid.
    gamma, slope : (K, Gm, Gv) arrays of γ and ∂γ/∂v.
    sign : (K, Gm, Gv) int8, sign of ∂γ/∂v (0 where ``|slope| ≤ rtol·|γ|``).
    condition1, condition2a, condition2b : whether each holds at every grid point and y value.
    fraction_fail_1 : fraction of grid points (over all y values) with γ < 0;
    fraction_fail_2a : … with γ decreasing in v; fraction_fail_2b : … with γ increasing in v.
    method : ``"closed form"`` or ``"quadrature"`` (``quadrature_points`` Gauss–Hermite nodes).
    slope_method : ``"autodiff"`` or ``"fd"``.
    rtol : relative size below which slopes (and negative γ) count as rounding.
    y_subsampled : True when ``y`` had more distinct values than were evaluated.
    """

    likelihood: str
    y_values: np.ndarray
    m: np.ndarray
    v: np.ndarray
    gamma: np.ndarray
    slope: np.ndarray
    sign: np.ndarray
    condition1: bool
    condition2a: bool
    condition2b: bool
    fraction_fail_1: float
    fraction_fail_2a: float
    fraction_fail_2b: float
    method: str
    quadrature_points: int | None
    slope_method: str
    rtol: float
    y_subsampled: bool = False

    @property
    def closed_form(self) -> bool:
        """Whether the verdict came from a closed-form γ (rather than quadrature)."""
        return self.method == "closed form"

    @property
    def theorem(self) -> str:
        """What Theorem 1 says given the conditions found."""
        return _theorem(self.condition1, self.condition2a, self.condition2b)

    @property
    def combined_sign(self) -> np.ndarray:
        """(Gm, Gv) sign of ∂γ/∂v over all y values: +1 / −1 where it is non-negative /
        non-positive for every y (and non-zero for one), 0 where zero for all, 2 where the
        y values disagree."""
        up = np.any(self.sign > 0, axis=0)
        down = np.any(self.sign < 0, axis=0)
        return np.where(up & down, 2, np.where(up, 1, np.where(down, -1, 0))).astype(np.int8)

    def summary(self) -> str:
        """One paragraph: the verdict on each condition, what Theorem 1 then says, and how it
        was computed."""
        where = "the grid"
        how = "closed form" if self.closed_form else f"{self.quadrature_points}-point Gauss–Hermite"
        ys = ", ".join(f"{y:g}" for y in self.y_values[:8]) + (", …" if self.y_values.size > 8 else "")
        verdict = _verdict_text(self.condition1, self.condition2a, self.condition2b, self.fraction_fail_1,
                                self.fraction_fail_2a, self.fraction_fail_2b, where)
        return (f"{self.likelihood}: {verdict} {self.theorem}. [{how}, slopes by {self.slope_method}; "
                f"m ∈ [{self.m[0]:g}, {self.m[-1]:g}], v ∈ [{self.v[0]:g}, {self.v[-1]:g}] "
                f"on a {self.m.size}×{self.v.size} grid; y ∈ {{{ys}}}"
                f"{' (subsampled)' if self.y_subsampled else ''}]")

    def as_dict(self, arrays: bool = False) -> dict:
        """The scalar results as a dict (for JSON); ``arrays=True`` adds the grids."""
        out = dict(likelihood=self.likelihood, y_values=self.y_values.tolist(), condition1=self.condition1,
                   condition2a=self.condition2a, condition2b=self.condition2b,
                   fraction_fail_1=self.fraction_fail_1, fraction_fail_2a=self.fraction_fail_2a,
                   fraction_fail_2b=self.fraction_fail_2b, method=self.method,
                   quadrature_points=self.quadrature_points, slope_method=self.slope_method, rtol=self.rtol,
                   m_range=[float(self.m[0]), float(self.m[-1])], v_range=[float(self.v[0]), float(self.v[-1])],
                   grid=[int(self.m.size), int(self.v.size)], theorem=self.theorem, summary=self.summary())
        if arrays:
            out.update(m=self.m.tolist(), v=self.v.tolist(), gamma=self.gamma.tolist(), slope=self.slope.tolist(),
                       sign=self.sign.tolist())
        return out


def _default_y(likelihood):
    """A small set of observations (user coding) at which to check a likelihood whose γ may
    depend on y; None when there is no sensible default."""
    t = type(likelihood)
    if t is Bernoulli:
        return np.array([0.0, 1.0])
    if t is Poisson:
        return np.array([0.0, 1.0, 3.0, 10.0])
    if t is Exponential:
        return np.array([0.1, 1.0, 10.0])
    if t is StochasticVolatility:
        return np.array([0.1, 1.0, 3.0])
    if t is Ordinal:
        return np.arange(likelihood.num_levels, dtype=np.float64)
    if t in (Gaussian, Laplace, StudentT):
        return np.array([0.0])  # γ depends on y − m only: the m grid covers the shift
    return None


def _y_values(likelihood, y, max_values):
    if y is None:
        y = _default_y(likelihood)
        if y is None:
            raise ValueError(f"no default observations for {type(likelihood).__name__}: pass y= (values in its "
                             "support at which to evaluate γ)")
    codes = np.unique(_codes(likelihood, np.ravel(np.asarray(y))))
    if codes.size == 0:
        raise ValueError("y is empty: pass at least one observation value")
    sub = codes.size > max_values
    if sub:  # evenly spaced order statistics, the extremes included
        codes = np.unique(codes[np.round(np.linspace(0, codes.size - 1, max_values)).astype(int)])
    return codes, sub


def _range(r, name, positive=False):
    try:
        lo, hi = (float(x) for x in r)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high) of numbers, got {r!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"{name} must be a finite pair with low < high, got {r!r}")
    if positive and lo <= 0:
        raise ValueError(f"{name} must lie above 0 (variances), got {r!r}")
    return lo, hi


def check_conditions(likelihood, y=None, *, m_range=(-10.0, 10.0), v_range=(1e-3, 20.0), grid=(200, 200),
                     quadrature=None, method: str = "autodiff", delta: float = _FD_DELTA, rtol: float = _RTOL,
                     max_values: int = 25) -> ConditionReport:
    """Check Conditions 1, 2a and 2b of Sheth & Khardon (2016) on a grid of ``(m, v)``.

    Parameters
    ----------
    likelihood : a gpvi likelihood.
    y : observations at which γ is evaluated (γ depends on y for most likelihoods): all
        distinct values of ``y`` (at most ``max_values`` of them, evenly spaced order
        statistics beyond that).  ``None``: a small default set per likelihood — both labels
        (Bernoulli), all levels (ordinal), ``{0, 1, 3, 10}`` (Poisson), ``{0.1, 1, 10}``
        (exponential), ``{0.1, 1, 3}`` (stochastic volatility), ``{0}`` (Gaussian, Laplace,
        Student-t, whose γ depends on ``y − m`` only).
    m_range, v_range : grid limits (linear spacing); ``grid`` = (points in m, points in v).
    quadrature : as in :func:`gamma` (``None``: closed form where available, else 200 points).
    method, delta : slope by ``"autodiff"`` or central differences ``"fd"`` (see :func:`gamma_slope`).
    rtol : slopes with ``|∂γ/∂v| ≤ rtol·|γ|`` at the same point count as 0, and γ ≥
        ``−rtol·max_v|γ|`` (same y and m) counts as non-negative.  With ``method="fd"`` use a larger value
        (≈ 1e-8): central differences with δ = 1e-6 carry errors of ~1e-10·|γ|.

    Returns
    -------
    ConditionReport
    """
    if method not in ("autodiff", "fd"):
        raise ValueError(f"method must be 'autodiff' or 'fd', got {method!r}")
    if not (rtol >= 0):
        raise ValueError(f"rtol must be non-negative, got {rtol!r}")
    if isinstance(max_values, bool) or int(max_values) != max_values or max_values < 1:
        raise ValueError(f"max_values must be a positive int, got {max_values!r}")
    closed, n = _resolve(likelihood, quadrature)
    m_lo, m_hi = _range(m_range, "m_range")
    v_lo, v_hi = _range(v_range, "v_range", positive=True)
    try:
        gm, gv = (int(g) for g in grid)
    except (TypeError, ValueError):
        raise ValueError(f"grid must be a pair of ints (points in m, points in v), got {grid!r}") from None
    if gm < 2 or gv < 2:
        raise ValueError(f"grid needs at least 2 points each way, got {grid!r}")
    codes, sub = _y_values(likelihood, y, int(max_values))
    mg = np.linspace(m_lo, m_hi, gm)
    vg = np.linspace(v_lo, v_hi, gv)
    Y, M, V = np.meshgrid(codes, mg, vg, indexing="ij")
    G, S = _gamma_and_slope(likelihood, Y, M, V, quadrature, method, delta)
    # A slope is compared with γ at the same point (the rounding of both scales with |γ|, and
    # γ spans many orders of magnitude along a row, e.g. e^{m+v/2}); a negative γ with the
    # largest |γ| along v of the same (y, m), so that cancellation in a near-zero γ of a
    # log-concave likelihood does not count as a violation of Condition 1.
    sign = _signs(S, rtol * np.abs(G))
    neg = G < -rtol * np.max(np.abs(G), axis=2, keepdims=True)
    return ConditionReport(
        likelihood=repr(likelihood), y_values=codes, m=mg, v=vg, gamma=G, slope=S, sign=sign,
        condition1=not bool(np.any(neg)), condition2a=not bool(np.any(sign < 0)),
        condition2b=not bool(np.any(sign > 0)), fraction_fail_1=float(np.mean(neg)),
        fraction_fail_2a=float(np.mean(sign < 0)), fraction_fail_2b=float(np.mean(sign > 0)),
        method="closed form" if closed else "quadrature", quadrature_points=None if closed else n,
        slope_method=method, rtol=float(rtol), y_subsampled=sub)


@dataclasses.dataclass(frozen=True, eq=False)
class FitConditions:
    """γ and the sign of ∂γ/∂v at the latent marginals ``(m_i, v_i)`` of a fit's training
    points (Sheth & Khardon 2016, Fig. 1b/c), with the fit's safeguard diagnostics.

    Attributes
    ----------
    m, v : (N,) latent means and variances of the training points under the fitted q.
    y : (N,) observations (internal codes).
    gamma, slope : (N,) γ_i and ∂γ/∂v at each point; sign : (N,) int8 in {−1, 0, +1}.
    fraction_increasing, fraction_decreasing, fraction_flat : of the points, by sign.
    fraction_gamma_negative : points with γ_i < 0 (Condition 1 violated there).
    condition1, condition2a, condition2b : whether each holds at all these points (2b: γ_i
        non-increasing in v at every point — "Condition 2b holds in this iteration").
    diagnostics : the fit's ``FitResult.diagnostics`` (damped / cycled / clipped steps).
    method, quadrature_points : how γ was computed (as in :class:`ConditionReport`).
    """

    m: np.ndarray
    v: np.ndarray
    y: np.ndarray
    gamma: np.ndarray
    slope: np.ndarray
    sign: np.ndarray
    fraction_increasing: float
    fraction_decreasing: float
    fraction_flat: float
    fraction_gamma_negative: float
    condition1: bool
    condition2a: bool
    condition2b: bool
    diagnostics: dict
    method: str
    quadrature_points: int | None

    @property
    def theorem(self) -> str:
        """What Theorem 1 would say if these points were the whole domain."""
        return _theorem(self.condition1, self.condition2a, self.condition2b)

    def summary(self) -> str:
        """The fractions, the local verdict and the fit's safeguard counts in one line."""
        d = self.diagnostics
        verdict = _verdict_text(self.condition1, self.condition2a, self.condition2b, self.fraction_gamma_negative,
                                self.fraction_decreasing, self.fraction_increasing, "the points")
        return (f"{self.m.size} points: γ increasing in v at {100 * self.fraction_increasing:.3g}%, decreasing at "
                f"{100 * self.fraction_decreasing:.3g}%, flat at {100 * self.fraction_flat:.3g}%; at these points "
                f"{verdict}. "
                f"Fit: {d.get('backtracks', 0)} damped step(s), {d.get('cycles', 0)} 2-cycle(s), "
                f"{d.get('clipped_steps', 0)} step(s) with γ clipped.")

    def as_dict(self, arrays: bool = False) -> dict:
        """The scalar results as a dict (for JSON); ``arrays=True`` adds the per-point arrays."""
        out = dict(points=int(self.m.size), fraction_increasing=self.fraction_increasing,
                   fraction_decreasing=self.fraction_decreasing, fraction_flat=self.fraction_flat,
                   fraction_gamma_negative=self.fraction_gamma_negative, condition1=self.condition1,
                   condition2a=self.condition2a, condition2b=self.condition2b, diagnostics=dict(self.diagnostics),
                   method=self.method, quadrature_points=self.quadrature_points, summary=self.summary())
        if arrays:
            out.update(m=self.m.tolist(), v=self.v.tolist(), y=self.y.tolist(), gamma=self.gamma.tolist(),
                       slope=self.slope.tolist(), sign=self.sign.tolist())
        return out


def check_fit(fit_result, X, y, *, offset=None, quadrature=None, method: str = "autodiff",
              delta: float = _FD_DELTA, rtol: float = _RTOL) -> FitConditions:
    """γ and the sign of ∂γ/∂v at the training points of a fit.

    Parameters
    ----------
    fit_result : a :class:`gpvi.FitResult`; e.g. ``gpvi.fit(..., engine="fpi", max_iter=1)``
        from the prior gives the ``(m_i, v_i)`` at the start of the second FP iteration, as in
        Sheth & Khardon (2016, Fig. 1b/c).
    X : (N, D) inputs and y : (N,) observations passed to :func:`gpvi.fit` (when the fit used
        ``subset=``, the same rows are selected here).
    offset : the (N,) offset of the fit, if any (``log(exposure)`` for a fit given ``exposure``).
    quadrature, method, delta, rtol : as in :func:`check_conditions`; a slope counts as zero
        when ``|∂γ/∂v| ≤ rtol·|γ_i|``.

    Returns
    -------
    FitConditions
    """
    if method not in ("autodiff", "fd"):
        raise ValueError(f"method must be 'autodiff' or 'fd', got {method!r}")
    for attr in ("model", "predict_f", "diagnostics"):
        if not hasattr(fit_result, attr):
            raise ValueError(f"fit_result must be a gpvi FitResult, got {type(fit_result).__name__}")
    lik = fit_result.model.likelihood
    X = np.asarray(X)
    y = np.asarray(y)
    if X.ndim == 1:
        X = X[:, None]
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
    subset = getattr(fit_result, "subset", None)
    if subset is not None:
        X, y = X[subset], y[subset]
        if offset is not None and np.ndim(offset) > 0:
            offset = np.asarray(offset)[subset]
    codes = _codes(lik, y)
    m, v = fit_result.predict_f(X, offset)
    m = np.asarray(m, np.float64)
    # Training rows of a full GP have v_i ≥ 0 up to rounding; γ needs v > 0.
    v = np.maximum(np.asarray(v, np.float64), np.finfo(np.float64).tiny)
    closed, n = _resolve(lik, quadrature)
    G, S = _gamma_and_slope(lik, codes, m, v, quadrature, method, delta)
    atol = rtol * np.abs(G)
    sign = _signs(S, atol)
    neg = G < -atol
    return FitConditions(
        m=m, v=v, y=codes, gamma=G, slope=S, sign=sign, fraction_increasing=float(np.mean(sign > 0)),
        fraction_decreasing=float(np.mean(sign < 0)), fraction_flat=float(np.mean(sign == 0)),
        fraction_gamma_negative=float(np.mean(neg)), condition1=not bool(np.any(neg)),
        condition2a=not bool(np.any(sign < 0)), condition2b=not bool(np.any(sign > 0)),
        diagnostics=dict(fit_result.diagnostics), method="closed form" if closed else "quadrature",
        quadrature_points=None if closed else n)
