"""Likelihoods against independent references.

Every reference below is written from the textbook definition of the density (NumPy /
SciPy), never copied from :mod:`gpvi.likelihoods`; Gaussian expectations are taken with
adaptive ``scipy.integrate.quad`` in the standardised variable ``z = (f - m)/sqrt(v)``, or
(several latents) with a product Gauss–Hermite rule of high order built here from NumPy's nodes.

``test_every_likelihood_class_is_covered`` sweeps every :class:`~gpvi.likelihoods.Likelihood`
subclass that gpvi ships (found by importing its modules, not from a hand-kept list) and
requires an instance under test for each: the one-latent likelihoods in ``CASES`` (the full
battery of checks below), the others in ``SWEEP``, each of which declares its references and
the tolerances of its checks.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import json
import pkgutil
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

import gpvi
import gpvi.io
from gpvi._module import Module
from gpvi import likelihoods as L
from gpvi.likelihoods import surrogates

# ------------------------------------------------------------------------------------------
# Instances under test and their valid observations (internal coding).
EDGES = np.array([-1.0, 0.5, 2.0])
SHAPE = 1.5

CASES = {
    "gaussian": (L.Gaussian(variance=0.7), [-1.3, 0.4, 2.1]),
    "bernoulli-logit": (L.Bernoulli(link="logit"), [-1.0, 1.0]),
    "bernoulli-probit": (L.Bernoulli(link="probit"), [-1.0, 1.0]),
    "poisson": (L.Poisson(), [0.0, 1.0, 3.0, 7.0]),
    "quasipoisson": (L.QuasiPoisson(), [0.0, 0.5, 2.3, 7.0]),  # non-integer targets are its point
    "ordinal": (L.Ordinal(edges=EDGES, shape=SHAPE), [0.0, 1.0, 2.0, 3.0]),
    "laplace": (L.Laplace(scale=0.8), [-1.3, 0.4, 2.1]),
    "studentt": (L.StudentT(df=4.0, scale=0.9), [-1.3, 0.4, 2.1]),
    "exponential": (L.Exponential(), [0.3, 1.5, 4.0]),
    "sv": (L.StochasticVolatility(), [-1.3, 0.4, 2.1]),
}
IDS = list(CASES)

# Latent grid: no m coincides with a Laplace y (the kink), v spans [1e-3, 5].
MS = np.array([-2.0, 0.0, 0.7, 2.5])
SMALL_V = np.array([1e-3, 0.1])
LARGE_V = np.array([1.0, 5.0])
ALL_V = np.concatenate([SMALL_V, LARGE_V])

# Gauss–Hermite order used where the default (20 nodes) is too coarse for large v; the
# aim there is to check the formula.  The default order's accuracy at large v is not
# asserted (for peaked p(y|f), e.g. Poisson y=7 at m=−2, v=5, it is off by ~0.1 nats).
HIGH_ORDER = 200

CLOSED_FORM_E = ("gaussian", "poisson", "quasipoisson", "laplace", "exponential", "sv")


def grid(ys, vs):
    """Flattened (y, m, v) triples over ys × MS × vs, as float64 arrays."""
    Y, M, V = np.meshgrid(np.asarray(ys, float), MS, np.asarray(vs, float), indexing="ij")
    return Y.ravel(), M.ravel(), V.ravel()


def j(*a):
    return tuple(jnp.asarray(x, dtype=jnp.float64) for x in a)


# Likelihoods are pytrees, so one jitted dispatcher serves every method (much faster than
# eager execution of the autodiff/quadrature graphs).
_jitted = jax.jit(lambda lik, method, *args: getattr(lik, method)(*args), static_argnums=1)


def call(lik, method, *args):
    """``lik.<method>(*args)`` under jit, NumPy results."""
    out = _jitted(lik, method, *j(*args))
    return tuple(np.asarray(o) for o in out) if isinstance(out, tuple) else np.asarray(out)


# ------------------------------------------------------------------------------------------
# Independent reference densities log p(y | f) (scalar or NumPy arrays).
def _ordinal_prob(y, f, edges=EDGES, k=SHAPE):
    """σ(k(φ_{j+1} − f)) − σ(k(φ_j − f)), φ_0 = −∞, φ_L = +∞, evaluated without
    cancellation by using σ(a) − σ(b) = σ(−b) − σ(−a) when both are close to 1."""
    phi = np.concatenate([[-np.inf], edges, [np.inf]])
    jj = np.asarray(y).astype(int)
    a = k * (phi[jj + 1] - f)
    b = k * (phi[jj] - f)
    direct = special.expit(a) - special.expit(b)
    flipped = special.expit(-b) - special.expit(-a)
    return np.where(b > 0, flipped, direct)


def ref_log_prob(name, lik, y, f):
    y = np.asarray(y, float)
    f = np.asarray(f, float)
    if name == "gaussian":
        return stats.norm.logpdf(y, loc=f, scale=np.sqrt(float(lik.variance)))
    if name == "bernoulli-logit":
        return -np.logaddexp(0.0, -y * f)
    if name == "bernoulli-probit":
        return special.log_ndtr(y * f)
    if name == "poisson":
        return stats.poisson.logpmf(y, np.exp(f))
    if name == "quasipoisson":  # y f − e^f − log Γ(y + 1), for any real y ≥ 0
        return y * f - np.exp(f) - special.gammaln(y + 1.0)
    if name == "ordinal":
        return np.log(_ordinal_prob(y, f))
    if name == "laplace":
        return stats.laplace.logpdf(y, loc=f, scale=float(lik.scale))
    if name == "studentt":
        s = float(lik.scale)
        return stats.t.logpdf((y - f) / s, df=float(lik.df)) - np.log(s)
    if name == "exponential":
        return stats.expon.logpdf(y, scale=np.exp(f))  # rate e^{-f}, mean e^{f}
    if name == "sv":
        return stats.norm.logpdf(y, loc=0.0, scale=np.exp(f / 2))  # N(y | 0, e^f)
    raise KeyError(name)


def _fast_log_prob(name, lik, y):
    """Scalar-f version of ``ref_log_prob`` (same formulas, no scipy.stats overhead)."""
    if name == "gaussian":
        s2 = float(lik.variance)
        return lambda f: -0.5 * (np.log(2 * np.pi * s2) + (y - f) ** 2 / s2)
    if name == "bernoulli-logit":
        return lambda f: -np.logaddexp(0.0, -y * f)
    if name == "bernoulli-probit":
        return lambda f: special.log_ndtr(y * f)
    if name in ("poisson", "quasipoisson"):
        return lambda f: special.xlogy(y, np.exp(f)) - np.exp(f) - special.gammaln(y + 1)
    if name == "ordinal":
        return lambda f: np.log(_ordinal_prob(y, f))
    if name == "laplace":
        b = float(lik.scale)
        return lambda f: -np.log(2 * b) - abs(y - f) / b
    if name == "studentt":
        nu, s = float(lik.df), float(lik.scale)
        c = special.gammaln((nu + 1) / 2) - special.gammaln(nu / 2) - 0.5 * np.log(nu * np.pi) - np.log(s)
        return lambda f: c - (nu + 1) / 2 * np.log1p(((y - f) / s) ** 2 / nu)
    if name == "exponential":
        return lambda f: -f - y * np.exp(-f)
    if name == "sv":
        return lambda f: -0.5 * (np.log(2 * np.pi) + f + y * y * np.exp(-f))
    raise KeyError(name)


def gauss_expect(g, m, v, kink=None):
    """∫ g(f) N(f | m, v) df by adaptive quadrature over z ∈ [−15, 15] (the mass outside is
    below 1e-49, far below every tolerance here), split at a kink of g if there is one."""
    s = np.sqrt(v)
    h = lambda z: g(m + s * z) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)  # noqa: E731
    pts = None
    if kink is not None and -15 < (kink - m) / s < 15:
        pts = [(kink - m) / s]
    val, _ = integrate.quad(h, -15.0, 15.0, points=pts, epsabs=1e-14, epsrel=1e-12, limit=500)
    return val


def _kink(name, y):
    return y if name == "laplace" else None


@functools.lru_cache(maxsize=None)
def ref_expected_log_prob(name, y, m, v):
    lik = CASES[name][0]
    return gauss_expect(_fast_log_prob(name, lik, y), m, v, _kink(name, y))


@functools.lru_cache(maxsize=None)
def ref_predictive_log_density(name, y, m, v):
    lik = CASES[name][0]
    lp = _fast_log_prob(name, lik, y)
    return np.log(gauss_expect(lambda f: np.exp(lp(f)), m, v, _kink(name, y)))


def refs(fn, name, Y, M, V):
    return np.array([fn(name, float(y), float(m), float(v)) for y, m, v in zip(Y, M, V)])


# Conditional moments E[y|f], Var[y|f] (user coding), from the textbook distributions.
def ref_conditional_moments(name, lik):
    if name == "gaussian":
        return (lambda f: f), (lambda f: float(lik.variance))
    if name == "bernoulli-logit":
        return special.expit, (lambda f: special.expit(f) * special.expit(-f))
    if name == "bernoulli-probit":
        return special.ndtr, (lambda f: special.ndtr(f) * special.ndtr(-f))
    if name in ("poisson", "quasipoisson"):
        return np.exp, np.exp
    if name == "laplace":
        return (lambda f: f), (lambda f: 2.0 * float(lik.scale) ** 2)
    if name == "studentt":
        nu, s = float(lik.df), float(lik.scale)
        return (lambda f: f), (lambda f: s**2 * nu / (nu - 2.0))
    if name == "exponential":
        return np.exp, (lambda f: np.exp(2.0 * f))
    if name == "sv":
        return (lambda f: 0.0), np.exp
    if name == "ordinal":
        lv = np.arange(len(EDGES) + 1.0)
        probs = lambda f: np.array([_ordinal_prob(k, f) for k in lv])  # noqa: E731
        mean = lambda f: float(probs(f) @ lv)  # noqa: E731
        return mean, (lambda f: float(probs(f) @ lv**2) - mean(f) ** 2)
    raise KeyError(name)


# ------------------------------------------------------------------------------------------
# Every other likelihood gpvi ships: several latents, wrappers, surrogates.  Each SWEEP case
# declares its instance, its valid observations, independent references of log p and of
# what ``expected_log_prob`` computes, and the checks of that expectation with their
# tolerances and the reason for each.
C3 = 3  # classes of the Softmax cases

# Warped: t(y) = y + Σ_j a_j tanh(b_j (y + c_j)),  p(y|f) = t'(y) N(t(y) | f, σ²).
W_A, W_B, W_C, W_S2 = np.array([0.8, 0.3]), np.array([1.2, 2.0]), np.array([0.1, -0.5]), 0.6
MC_S2 = 0.7  # noise variance of the Gaussian wrapped by MonteCarlo
MC_SAMPLES = (1000, 2000)  # samples of the MonteCarlo cases (Gaussian, Softmax)


def _logistic_log_prob(y, f):
    return -np.logaddexp(0.0, -np.asarray(y, float) * np.asarray(f, float))


def _gaussian_log_prob(s2):
    """log N(y | f, s2), written out (cheap enough to sit inside adaptive quadrature)."""
    return lambda y, f: -0.5 * (np.log(2 * np.pi * s2) + (np.asarray(y, float) - np.asarray(f, float)) ** 2 / s2)


def _softmax_log_prob(y, f):
    f = np.asarray(f, float)
    fy = np.take_along_axis(f, np.asarray(y).astype(int)[..., None], axis=-1)[..., 0]
    return fy - special.logsumexp(f, axis=-1)


def _hetero_log_prob(y, f):
    """log N(y | f₀, exp(2 f₁)), written out."""
    f = np.asarray(f, float)
    return -0.5 * np.log(2 * np.pi) - f[..., 1] - 0.5 * (np.asarray(y, float) - f[..., 0]) ** 2 * np.exp(-2 * f[..., 1])


def _warped_log_prob(y, f):
    y = np.asarray(y, float)
    u = W_B * (y[..., None] + W_C)
    t = y + np.sum(W_A * np.tanh(u), axis=-1)
    dt = 1.0 + np.sum(W_A * W_B / np.cosh(u) ** 2, axis=-1)
    return np.log(dt) - 0.5 * (np.log(2 * np.pi * W_S2) + (t - np.asarray(f, float)) ** 2 / W_S2)


@functools.lru_cache(maxsize=None)
def _product_rule(n, C):
    """Nodes (n^C, C) and weights of the product Gauss–Hermite rule for N(0, I_C), from
    ``numpy.polynomial.hermite.hermgauss`` (weight e^{−x²}: z = √2 x, w/√π)."""
    x, w = np.polynomial.hermite.hermgauss(n)
    grids = np.meshgrid(*([x * np.sqrt(2.0)] * C), indexing="ij")
    wgrids = np.meshgrid(*([w / np.sqrt(np.pi)] * C), indexing="ij")
    return np.stack([g.ravel() for g in grids], -1), np.prod(np.stack([g.ravel() for g in wgrids], -1), axis=1)


# Order of the reference product rule: 40 nodes per class (64 000 nodes for C = 3) differ from
# 80 per class by < 2e-8 nats in E on the rows below (at v = 5 on every class; < 1e-14 where
# v ≤ 0.1), far inside the tolerances that use it.
REF_PRODUCT_ORDER = 40


def _product_moments(log_prob, Y, M, V, n=REF_PRODUCT_ORDER):
    """``(E[lp], E[lp²])`` of ``lp = log_prob(y, f)`` under f ~ N(m, diag v), row by row."""
    Z, W = _product_rule(n, M.shape[1])
    out = []
    for y, m, v in zip(Y, M, V):
        lp = log_prob(np.full(len(Z), y), m + np.sqrt(v) * Z)
        out.append((lp @ W, (lp * lp) @ W))
    return np.array(out).T


def _quad_moments(log_prob, Y, M, V):
    """``(E[lp], E[lp²])`` of a one-latent ``log_prob(y, f)`` by adaptive quadrature."""
    out = [(gauss_expect(lambda f: float(log_prob(y, f)), m, v),
            gauss_expect(lambda f: float(log_prob(y, f)) ** 2, m, v)) for y, m, v in zip(Y, M, V)]
    return np.array(out).T


def _mc_atol(moments, num_samples, k=5.0):
    """k standard errors of an S-sample average of log p: ``k·sqrt(Var_q[log p]/S)`` per row, the
    i.i.d. error scale (scrambled Sobol draws, MonteCarlo's default, err less still)."""
    def atol(Y, M, V):
        e, e2 = moments(Y, M, V)
        return k * np.sqrt(np.maximum(e2 - e * e, 0.0) / num_samples)
    return atol


def _jj_bound(y, m, v):
    """E_{N(f|m,v)} of the Jaakkola–Jordan bound of log σ(y f) at ξ = √(m² + v):
    log σ(ξ) + (y f − ξ)/2 − λ(ξ)(f² − ξ²), λ(ξ) = tanh(ξ/2)/(4ξ), integrated over f by quad."""
    xi = np.sqrt(m * m + v)
    lam = np.tanh(xi / 2) / (4 * xi)
    return gauss_expect(lambda f: -np.logaddexp(0.0, -xi) + (y * f - xi) / 2 - lam * (f * f - xi * xi), m, v)


def _taylor(y, m, v):
    """E_{N(f|m,v)} of the second-order Taylor expansion of log σ(y f) at f = m:
    log σ(ym) + y σ(−ym)(f − m) − ½ σ(m)σ(−m)(f − m)², integrated over f by quad."""
    t = y * m
    d1, d2 = y * special.expit(-t), -special.expit(t) * special.expit(-t)
    return gauss_expect(lambda f: -np.logaddexp(0.0, -t) + d1 * (f - m) + 0.5 * d2 * (f - m) ** 2, m, v)


def _rows_1d(fn):
    return lambda Y, M, V: np.array([fn(float(y), float(m), float(v)) for y, m, v in zip(Y, M, V)])


@dataclasses.dataclass(frozen=True)
class Check:
    """One comparison of ``expected_log_prob`` with the case's reference ``expected``."""

    why: str  # what the tolerance is justified by
    rows: str = "all"  # "all", or "small" (every latent's v ≤ 0.1)
    rtol: float = 0.0
    atol: float | Callable = 0.0  # a number or (Y, M, V) -> per-row array
    order: int | None = None  # Gauss–Hermite order of the instance checked (None: as is)


@dataclasses.dataclass(frozen=True)
class Case:
    lik: L.Likelihood
    ys: tuple  # valid observations, internal coding
    log_prob: Callable  # reference log p(y | f); f (n,) or (n, C)
    expected: Callable  # reference of what expected_log_prob computes: (Y, M, V) -> (n,)
    checks: tuple  # of Check
    num_latents: int = 1
    saved: bool = True  # model files hold it (else gpvi.io must refuse it)


def _quad_expected(log_prob):
    return lambda Y, M, V: _quad_moments(log_prob, Y, M, V)[0]


_QUADRATURE_CHECKS = (
    Check("default order, v ≤ 0.1: log p is a near-polynomial over the 20 nodes", "small", 1e-8, 1e-9),
    Check("200 nodes: converged quadrature of a smooth log p", "all", 1e-7, 1e-8, order=200),
)
_EXACT_CHECKS = (Check("closed form against adaptive quadrature (converged to ~1e-12)", "all", 1e-9, 1e-10),)

_MC_GAUSS_MOMENTS = functools.partial(_quad_moments, _gaussian_log_prob(MC_S2))
_MC_SOFTMAX_MOMENTS = functools.partial(_product_moments, _softmax_log_prob)

SWEEP = {
    "softmax": Case(
        L.Softmax(num_classes=C3), (0.0, 1.0, 2.0), _softmax_log_prob,
        lambda Y, M, V: _product_moments(_softmax_log_prob, Y, M, V)[0],
        (Check("10 nodes per class, v ≤ 0.1: converged to rounding", "small", 1e-10, 1e-12),
         # The rule's own error grows with v: measured at most 3.7e-4 relative (2.7e-4 nats), at
         # v = 5 on every class.  A wrong node, weight or term is off by far more, and the same
         # 10-node rule written here agrees to rounding (test_softmax_is_the_documented_product_rule).
         Check("10 nodes per class, v ≤ 5: the rule's own error (measured ≤ 3.7e-4 relative)", "all", 1e-3, 1e-6)),
        num_latents=C3),
    "heteroscedastic": Case(
        L.HeteroscedasticGaussian(), (-1.3, 0.4, 2.1), _hetero_log_prob,
        lambda Y, M, V: _product_moments(_hetero_log_prob, Y, M, V)[0],
        # log p is quadratic in f₀ (exact with 40 nodes) and e^{−2 f₁} needs ~(2√v)²/2 ≈ 10 < 40
        # nodes' worth of terms at v = 5: the reference is converged to ~1e-8 relative there
        (Check("closed form against the 40-node product rule on log p", "all", 1e-7, 1e-8),),
        num_latents=2),
    "warped": Case(
        L.Warped(L.Gaussian(variance=W_S2), a=W_A, b=W_B, c=W_C), (-1.3, 0.4, 2.1), _warped_log_prob,
        _quad_expected(_warped_log_prob), _EXACT_CHECKS),
    "montecarlo-gaussian": Case(
        L.MonteCarlo(L.Gaussian(variance=MC_S2), num_samples=MC_SAMPLES[0]), (-1.3, 0.4, 2.1),
        _gaussian_log_prob(MC_S2),
        # the Gaussian's closed form, E = −½ log 2πσ² − ((y − m)² + v)/(2σ²)
        lambda Y, M, V: -0.5 * np.log(2 * np.pi * MC_S2) - ((Y - M) ** 2 + V) / (2 * MC_S2),
        (Check(f"{MC_SAMPLES[0]} samples: 5 standard errors", "all", 0.0,
               _mc_atol(_MC_GAUSS_MOMENTS, MC_SAMPLES[0])),)),
    "montecarlo-softmax": Case(
        L.MonteCarlo(L.Softmax(num_classes=C3), num_samples=MC_SAMPLES[1], sampling="iid"), (0.0, 1.0, 2.0),
        _softmax_log_prob, lambda Y, M, V: _MC_SOFTMAX_MOMENTS(Y, M, V)[0],
        (Check(f"{MC_SAMPLES[1]} i.i.d. samples: 5 standard errors", "all", 0.0,
               _mc_atol(_MC_SOFTMAX_MOMENTS, MC_SAMPLES[1])),),
        num_latents=C3),
    # The logistic base of the surrogates (private, but shipped and usable): default quadrature.
    "logistic-surrogate-base": Case(
        surrogates._Logistic(), (-1.0, 1.0), _logistic_log_prob, _quad_expected(_logistic_log_prob),
        _QUADRATURE_CHECKS, saved=False),
    # The surrogates replace E[log σ(y f)] by the expectation of a quadratic in f (engine
    # internals: never part of a model file).
    "jaakkola-jordan": Case(
        surrogates.JaakkolaJordan(), (-1.0, 1.0), _logistic_log_prob, _rows_1d(_jj_bound),
        (Check("closed form against adaptive quadrature of the bound", "all", 1e-9, 1e-10),), saved=False),
    "taylor-logistic": Case(
        surrogates.TaylorLogistic(), (-1.0, 1.0), _logistic_log_prob, _rows_1d(_taylor),
        (Check("closed form against adaptive quadrature of the expansion", "all", 1e-9, 1e-10),), saved=False),
}
SWEEP_IDS = list(SWEEP)


def sweep_rows(case):
    """(Y, M, V) of a case: the shared grid for one latent; for C latents, per label the
    rows (m, v·1), v in ALL_V, and two rows that mix v = 1e-3, 0.1 and 5 across the classes,
    m ~ N(0, 1.5²) from a fixed seed."""
    if case.num_latents == 1:
        return grid(case.ys, ALL_V)
    C = case.num_latents
    rng = np.random.default_rng(20240601)
    mixed = [np.resize([1e-3, 5.0, 0.1], C), np.resize([5.0, 0.1, 1e-3], C)]
    Y, M, V = [], [], []
    for y in case.ys:
        for v in [np.full(C, x) for x in ALL_V] + mixed:
            Y.append(y)
            M.append(rng.normal(0.0, 1.5, C))
            V.append(v)
    return np.array(Y, float), np.array(M), np.array(V)


def _small(case, V):
    return V <= SMALL_V.max() if case.num_latents == 1 else np.all(V <= SMALL_V.max(), axis=1)


def shipped_likelihood_classes():
    """Every Likelihood subclass defined in gpvi: all modules of gpvi.likelihoods and
    gpvi.sklearn.estimators imported, then ``__subclasses__`` followed recursively."""
    for info in pkgutil.walk_packages(L.__path__, L.__name__ + "."):
        importlib.import_module(info.name)
    importlib.import_module("gpvi.sklearn.estimators")
    found, todo = set(), [L.Likelihood]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return {c for c in found if c.__module__.startswith("gpvi.")}


# ------------------------------------------------------------------------------------------
def test_every_likelihood_class_is_covered():
    shipped = shipped_likelihood_classes()
    # the sweep sees the public classes, the private ones and the one sklearn defines
    assert {L.Gaussian, L.Softmax, L.Warped, L.MonteCarlo, L.QuasiPoisson, surrogates._Logistic,
            surrogates.JaakkolaJordan} <= shipped
    assert all(issubclass(c, L.Likelihood) for c in shipped)
    covered = {type(lik) for lik, _ in CASES.values()} | {type(c.lik) for c in SWEEP.values()}
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in shipped - covered)
    assert not missing, f"likelihood classes without a test instance: {missing}"
    # ...and every instance has independent references that run.
    for name, (lik, ys) in CASES.items():
        assert np.isfinite(ref_log_prob(name, lik, ys[0], 0.1))
        ref_conditional_moments(name, lik)
    for name, case in SWEEP.items():
        assert case.checks, name
        Y, M, V = (a[:2] for a in sweep_rows(case))
        assert np.all(np.isfinite(case.log_prob(Y, M))), name
        assert np.all(np.isfinite(case.expected(Y, M, V))), name


@pytest.mark.parametrize("name", IDS)
def test_log_prob_matches_scipy(name):
    lik, ys = CASES[name]
    Y, _, _ = grid(ys, ALL_V)  # the shared grid shape (every new shape costs compilations)
    F = np.linspace(-6.0, 6.0, Y.size)
    got = np.asarray(call(lik, "log_prob", Y, F))
    np.testing.assert_allclose(got, ref_log_prob(name, lik, Y, F), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", IDS)
def test_validate_accepts_valid_y(name):
    lik, ys = CASES[name]
    np.testing.assert_array_equal(lik.validate(np.asarray(ys)), np.asarray(ys, float))


# a) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", IDS)
def test_expected_log_prob_tiny_variance_is_log_prob(name):
    lik, ys = CASES[name]
    Y, M, _ = grid(ys, ALL_V)
    V = np.full_like(M, 1e-10)
    got = np.asarray(call(lik, "expected_log_prob", Y, M, V))
    # E − log p ≈ (v/2)·∂²_f log p: |∂²_f log p| ≤ 50 on this grid, so ≤ 2.5e-9.
    np.testing.assert_allclose(got, call(lik, "log_prob", Y, M), rtol=1e-12, atol=1e-8)
    np.testing.assert_allclose(got, ref_log_prob(name, lik, Y, M), rtol=1e-12, atol=1e-8)


# b) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CLOSED_FORM_E)
def test_closed_form_expected_log_prob_matches_quad(name):
    lik, ys = CASES[name]
    assert type(lik).expected_log_prob is not L.Likelihood.expected_log_prob, "closed form expected"
    Y, M, V = grid(ys, ALL_V)
    got = np.asarray(call(lik, "expected_log_prob", Y, M, V))
    # Exact formula vs adaptive quadrature converged to ~1e-12 relative.
    np.testing.assert_allclose(got, refs(ref_expected_log_prob, name, Y, M, V), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", [n for n in IDS if n not in CLOSED_FORM_E])
def test_quadrature_expected_log_prob_matches_quad(name):
    lik, ys = CASES[name]
    Y, M, V = grid(ys, ALL_V)
    small = np.isin(V, SMALL_V)
    ref = refs(ref_expected_log_prob, name, Y, M, V)
    # Default order where sqrt(v) ≤ 0.32: log p is then a near-polynomial over the nodes.
    got = call(lik, "expected_log_prob", Y, M, V)
    np.testing.assert_allclose(got[small], ref[small], rtol=1e-8, atol=1e-9)
    # Large v: the formula at a high order (the default 20 nodes are a speed/accuracy choice).
    got = call(lik.replace(quadrature_points=HIGH_ORDER), "expected_log_prob", Y, M, V)
    np.testing.assert_allclose(got, ref, rtol=1e-7, atol=1e-8)


# c) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", IDS)
def test_variational_moments_are_finite_difference_derivatives(name):
    lik, ys = CASES[name]
    Y, M, V = grid(ys, ALL_V)
    e, rho, lam = (np.asarray(t) for t in call(lik, "variational_moments", Y, M, V))
    np.testing.assert_allclose(e, np.asarray(call(lik, "expected_log_prob", Y, M, V)), rtol=1e-13, atol=1e-13)
    E = lambda m, v: np.asarray(call(lik, "expected_log_prob", Y, m, v))  # noqa: E731
    hm = 1e-5
    fd_rho = (E(M + hm, V) - E(M - hm, V)) / (2 * hm)
    hv = 1e-4 * V  # relative step: v spans 1e-3..5 and must stay positive
    fd_lam = 2.0 * (E(M, V + hv) - E(M, V - hv)) / (2 * hv)
    # Central differences: truncation O(h²·|E'''|) ≲ 1e-8 relative; rounding O(eps·|E|/h)
    # ≲ 1e-10 for ρ (h = 1e-5) and ≲ 5e-8 for λ (h = 1e-4·v ≥ 1e-7, |E| ≤ 20 at v = 1e-3).
    np.testing.assert_allclose(rho, fd_rho, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lam, fd_lam, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("points", [20, 7])
def test_logit_moments_are_the_autodiff_derivatives_of_the_quadrature(points):
    # Bernoulli(logit) writes ρ, λ out (Stein's form of ∂E/∂v) and takes one log per mirrored
    # pair of nodes (an odd rule keeps its middle node alone); the base class differentiates
    # the same Gauss–Hermite E by autodiff: they must agree to rounding, also far in the tails.
    lik = L.Bernoulli(quadrature_points=points)
    Y, M, V = grid([-1.0, 1.0], ALL_V)
    M = np.concatenate([M, np.full(4, 40.0), np.full(4, -40.0)])
    Y, V = np.concatenate([Y, np.tile([-1.0, 1.0], 4)]), np.concatenate([V, np.full(8, 0.5)])
    got = jax.jit(lik.variational_moments)(*j(Y, M, V))
    ref = jax.jit(lambda *a: L.Likelihood.variational_moments(lik, *a))(*j(Y, M, V))
    for label, a, b in zip(("E", "rho", "lam"), got, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-15, err_msg=label)
    # any array shape, elementwise: a 2-D batch gives the 1-D results reshaped
    n = 2 * (len(Y) // 2)
    got2 = lik.variational_moments(*(jnp.asarray(a[:n]).reshape(2, -1) for a in (Y, M, V)))
    for a, b in zip(got2, got):
        np.testing.assert_allclose(np.asarray(a).ravel(), np.asarray(b)[:n], rtol=1e-14, atol=1e-16)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in IDS if n != "laplace"])
def test_variational_moments_match_quadrature_moments(name):
    # At a high order both are converged expectations of log p, ∂_f log p, ∂²_f log p
    # (Stein's identity makes 2∂E/∂v = E[∂²_f log p]); the gap is quadrature error.
    lik = CASES[name][0].replace(quadrature_points=HIGH_ORDER)
    Y, M, V = grid(CASES[name][1], ALL_V)
    vm = call(lik, "variational_moments", Y, M, V)
    qm = call(lik, "quadrature_moments", Y, M, V)
    for label, a, b in zip(("E", "rho", "lam"), vm, qm):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-7, atol=1e-8, err_msg=label)


# d) ---------------------------------------------------------------------------------------
def test_poisson_closed_form_moments():
    lik = L.Poisson()
    Y, M, V = grid(CASES["poisson"][1], ALL_V)
    e, rho, lam = (np.asarray(t) for t in call(lik, "variational_moments", Y, M, V))
    mu = np.exp(M + V / 2)
    np.testing.assert_allclose(e, Y * M - mu - special.gammaln(Y + 1), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(rho, Y - mu, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(lam, -mu, rtol=1e-13, atol=1e-13)


def test_gaussian_closed_form_moments():
    s2 = 0.7
    lik = L.Gaussian(variance=s2)
    Y, M, V = grid(CASES["gaussian"][1], ALL_V)
    e, rho, lam = (np.asarray(t) for t in call(lik, "variational_moments", Y, M, V))
    np.testing.assert_allclose(e, -0.5 * np.log(2 * np.pi * s2) - ((Y - M) ** 2 + V) / (2 * s2),
                               rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(rho, (Y - M) / s2, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(lam, np.full_like(M, -1.0 / s2), rtol=1e-13, atol=1e-13)


def test_laplace_closed_form_moments():
    # E|X| for X ~ N(μ, s²) has ∂/∂μ = 2Φ(μ/s) − 1 and ∂/∂(s²) = φ(μ/s)/s, so with μ = y − m:
    # ρ = (2Φ(μ/s) − 1)/b and λ = −2φ(μ/s)/(s b).
    b = 0.8
    lik = L.Laplace(scale=b)
    Y, M, V = grid(CASES["laplace"][1], ALL_V)
    _, rho, lam = (np.asarray(t) for t in call(lik, "variational_moments", Y, M, V))
    s = np.sqrt(V)
    t = (Y - M) / s
    np.testing.assert_allclose(rho, (2 * special.ndtr(t) - 1) / b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lam, -2 * stats.norm.pdf(t) / (s * b), rtol=1e-10, atol=1e-12)


def test_exponential_closed_form_moments():
    # E = −m − y e^{−m+v/2}: ρ = −1 + y e^{−m+v/2}, λ = −y e^{−m+v/2}.
    lik = L.Exponential()
    Y, M, V = grid(CASES["exponential"][1], ALL_V)
    _, rho, lam = (np.asarray(t) for t in call(lik, "variational_moments", Y, M, V))
    g = Y * np.exp(-M + V / 2)
    np.testing.assert_allclose(rho, -1 + g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lam, -g, rtol=1e-12, atol=1e-12)


# e) ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_predictive_log_density_matches_quad(name):
    lik, ys = CASES[name]
    Y, M, V = grid(ys, ALL_V)
    small = np.isin(V, SMALL_V)
    ref = refs(ref_predictive_log_density, name, Y, M, V)
    # Default order for small v: the integrand is resolved by 20 nodes.
    got = call(lik, "predictive_log_density", Y, M, V)
    np.testing.assert_allclose(got[small], ref[small], rtol=1e-8, atol=1e-9)
    # Large v at a high order: validates the formula (node placement, weights, log-sum-exp).
    # Gauss–Hermite converges slowly on p(y|f) peaked far from m (Poisson y=7 at m=−2, v=5
    # is still 1e-4 off at 200 nodes), while a wrong formula is off by O(1e-1) or more.
    got = call(lik.replace(quadrature_points=HIGH_ORDER), "predictive_log_density", Y, M, V)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_predict_mean_and_var_law_of_total_variance(name):
    lik = CASES[name][0]
    cm, cv = ref_conditional_moments(name, lik)
    M, V = np.meshgrid(MS, ALL_V, indexing="ij")
    M, V = M.ravel(), V.ravel()
    ref_mean = np.array([gauss_expect(cm, m, v) for m, v in zip(M, V)])
    ref_second = np.array([gauss_expect(lambda f: cv(f) + cm(f) ** 2, m, v) for m, v in zip(M, V)])
    ref_var = ref_second - ref_mean**2
    small = np.isin(V, SMALL_V)
    for label, model, sel, rtol in (("default order, small v", lik, small, 1e-8),
                                    ("high order", lik.replace(quadrature_points=HIGH_ORDER), ..., 1e-6)):
        mean, var = call(model, "predict_mean_and_var", M, V)
        np.testing.assert_allclose(mean[sel], ref_mean[sel], rtol=rtol, atol=1e-10, err_msg=f"mean, {label}")
        np.testing.assert_allclose(var[sel], ref_var[sel], rtol=rtol, atol=1e-10, err_msg=f"var, {label}")


def test_probit_predictive_probability_is_exact():
    lik = L.Bernoulli(link="probit")
    M, V = np.meshgrid(np.linspace(-4, 4, 9), [1e-3, 0.1, 1.0, 5.0, 50.0], indexing="ij")
    M, V = M.ravel(), V.ravel()
    p, var = (np.asarray(t) for t in call(lik, "predict_mean_and_var", M, V))
    want = stats.norm.cdf(M / np.sqrt(1 + V))
    np.testing.assert_allclose(p, want, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(var, want * (1 - want), rtol=1e-12, atol=1e-15)
    # ...and it is the Gaussian integral of Φ(f).
    for m, v, pp in zip(M[::7], V[::7], p[::7]):
        assert abs(gauss_expect(special.ndtr, m, v) - pp) < 1e-10


# f) ---------------------------------------------------------------------------------------
F_EXTREME = np.concatenate([[-30.0, -20.0], np.linspace(-5, 5, 21), [20.0, 30.0]])


def test_ordinal_probabilities_sum_to_one():
    lik = CASES["ordinal"][0]
    levels = np.arange(len(EDGES) + 1.0)
    Y, F = np.meshgrid(levels, F_EXTREME, indexing="ij")
    p = np.exp(np.asarray(call(lik, "log_prob", Y, F)))
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    # predictive level probabilities also sum to one and match quadrature
    M, V = np.meshgrid(MS, SMALL_V, indexing="ij")
    P = call(lik, "level_probabilities", M.ravel(), V.ravel())
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-13)
    ref = np.array([[gauss_expect(lambda f: _ordinal_prob(k, f), m, v) for k in levels]
                    for m, v in zip(M.ravel(), V.ravel())])
    np.testing.assert_allclose(P, ref, rtol=1e-8, atol=1e-12)


def test_ordinal_log_prob_matches_direct_formula_including_extremes():
    lik = CASES["ordinal"][0]
    levels = np.arange(len(EDGES) + 1.0)
    Y, F = np.meshgrid(levels, F_EXTREME, indexing="ij")
    got = np.asarray(call(lik, "log_prob", Y, F))
    assert np.all(np.isfinite(got))
    phi = np.concatenate([[-np.inf], EDGES, [np.inf]])
    sig = special.expit
    idx = Y.astype(int)
    naive = sig(SHAPE * (phi[idx + 1] - F)) - sig(SHAPE * (phi[idx] - F))
    ok = naive > 1e-6  # where the naive difference has no cancellation worth speaking of
    np.testing.assert_allclose(got[ok], np.log(naive[ok]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, np.log(_ordinal_prob(Y, F)), rtol=1e-10, atol=1e-12)
    # Deep tails: log p ≈ −k·(distance to the nearest edge) to within e^{-k·gap} terms.
    np.testing.assert_allclose(got[0, -1], np.log(sig(SHAPE * (EDGES[0] - 30.0))), rtol=1e-12)
    np.testing.assert_allclose(got[-1, 0], np.log(sig(-SHAPE * (EDGES[-1] + 30.0))), rtol=1e-12)


def test_ordinal_rejects_unknown_levels_and_bad_edges():
    lik = CASES["ordinal"][0]
    for bad in ([0, 4], [-1, 0], [0.5, 1]):
        with pytest.raises(ValueError):
            lik.validate(np.asarray(bad, float))
    with pytest.raises(ValueError):
        L.Ordinal(edges=np.array([0.0, 0.0, 1.0]))


# g) ---------------------------------------------------------------------------------------
def test_bernoulli_label_codings_agree():
    lik = L.Bernoulli()
    want = np.array([-1.0, 1.0, 1.0, -1.0, 1.0])
    for labels in (np.array([0, 1, 1, 0, 1]), np.array([-1, 1, 1, -1, 1]),
                   np.array([False, True, True, False, True]), np.array([0.0, 1.0, 1.0, 0.0, 1.0])):
        got = lik.validate(labels)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, want)
    # all-one-class inputs are valid in either coding
    np.testing.assert_array_equal(lik.validate(np.ones(3, int)), np.ones(3))
    np.testing.assert_array_equal(lik.validate(np.zeros(3, int)), -np.ones(3))
    for bad in ([0, 2], [-1, 0, 1], [0.5, 1.0]):
        with pytest.raises(ValueError):
            lik.validate(np.asarray(bad))


# h) ---------------------------------------------------------------------------------------
class HandPoisson(L.Likelihood):
    """A user's Poisson: only log_prob, no decorator."""

    def log_prob(self, y, f):
        return y * f - jnp.exp(f) - jax.scipy.special.gammaln(y + 1.0)


class HandGaussian(L.Likelihood):
    """A user's likelihood with a learnable parameter."""

    noise: object = gpvi.param("positive", 0.5)

    def log_prob(self, y, f):
        return -0.5 * (jnp.log(2 * jnp.pi * self.noise) + (y - f) ** 2 / self.noise)


def test_user_likelihood_matches_builtin_poisson():
    Y, M, V = grid(CASES["poisson"][1], ALL_V)
    mine = call(HandPoisson(), "variational_moments", Y, M, V)
    ref = call(L.Poisson(), "variational_moments", Y, M, V)
    # 20-node Gauss–Hermite of e^{f}: the error of the rule on e^{az} is ≈ a^{2n}/(2n)!·e^{a²/2}
    # (a = sqrt(v) ≤ 2.24, n = 20): < 1e-20, so agreement is to rounding (|E| ≤ 150).
    for label, a, b in zip(("E", "rho", "lam"), mine, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-8, atol=1e-8, err_msg=label)


def test_user_likelihood_is_a_pytree():
    Y, M, V = j(*grid(CASES["poisson"][1], ALL_V))
    f = jax.jit(lambda lik, y, m, v: lik.variational_moments(y, m, v))
    out = f(HandPoisson(), Y, M, V)
    Yn, Mn, Vn = (np.asarray(t) for t in (Y, M, V))
    mu = np.exp(Mn + Vn / 2)  # Poisson closed forms (see test_poisson_closed_form_moments)
    for a, b in zip(out, (Yn * Mn - mu - special.gammaln(Yn + 1), Yn - mu, -mu)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-8, atol=1e-8)
    assert jax.tree_util.tree_leaves(HandPoisson()) == []

    g = HandGaussian(noise=0.3)
    leaves, treedef = jax.tree_util.tree_flatten(g)
    assert len(leaves) == 1 and float(leaves[0]) == 0.3
    assert isinstance(jax.tree_util.tree_unflatten(treedef, leaves), HandGaussian)
    assert g.transforms() == {"noise": "positive"}
    # jit over it, and differentiate through its parameter (d/dσ² of E for a Gaussian:
    # −1/(2σ²) + ((y−m)² + v)/(2σ⁴)).
    y, m, v = j([0.3, -1.0], [0.1, 0.5], [0.2, 1.0])
    dE = jax.jit(jax.grad(lambda lik: jnp.sum(lik.expected_log_prob(y, m, v))))(g)
    s2 = 0.3
    yn, mn, vn = (np.asarray(t) for t in (y, m, v))
    want = np.sum(-1 / (2 * s2) + ((yn - mn) ** 2 + vn) / (2 * s2**2))
    # the GH rule is exact for the quadratic log p
    np.testing.assert_allclose(float(dE.noise), want, rtol=1e-12)


def test_laplace_predictive_log_density_limits():
    # v → 0 gives log p(y|m): the gap is O(v) away from the kink and √(2v/π)/b = 1e-8 at it.
    b = 0.8
    lik = L.Laplace(scale=b)
    y = np.array([0.0, 0.0, 0.0, 50.0, -50.0])
    m = np.array([0.3, -0.3, 0.0, 0.0, 0.0])
    got = call(lik, "predictive_log_density", y, m, np.full(5, 1e-16))
    np.testing.assert_allclose(got, -np.log(2 * b) - np.abs(y - m) / b, rtol=1e-12, atol=1e-7)
    # far from the kink (|y − m| ≫ √v) the density is exp(−|μ|/b + v/(2b²))/(2b)
    got = call(lik, "predictive_log_density", y[3:], m[3:], np.full(2, 2.0))
    np.testing.assert_allclose(got, -np.log(2 * b) - 50 / b + 2.0 / (2 * b**2), rtol=1e-12)


# i) ---------------------------------------------------------------------------------------
# The SWEEP cases: log p, the expectation and the model-file codec, against their references.
@pytest.mark.parametrize("name", SWEEP_IDS)
def test_sweep_log_prob_matches_reference(name):
    case = SWEEP[name]
    Y, M, _ = sweep_rows(case)
    F = np.random.default_rng(7).uniform(-6.0, 6.0, M.shape)
    got = call(case.lik, "log_prob", Y, F)
    np.testing.assert_allclose(got, case.log_prob(Y, F), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", SWEEP_IDS)
def test_sweep_validate_accepts_valid_y(name):
    case = SWEEP[name]
    np.testing.assert_array_equal(case.lik.validate(np.asarray(case.ys)), np.asarray(case.ys, float))


@pytest.mark.parametrize("name", SWEEP_IDS)
@pytest.mark.slow
def test_sweep_expected_log_prob_matches_reference(name):
    case = SWEEP[name]
    Y, M, V = sweep_rows(case)
    ref = case.expected(Y, M, V)
    small = _small(case, V)
    for check in case.checks:
        lik = case.lik if check.order is None else case.lik.replace(quadrature_points=check.order)
        sel = small if check.rows == "small" else np.ones_like(small)
        assert np.any(sel), check.why
        atol = np.broadcast_to(check.atol(Y, M, V) if callable(check.atol) else check.atol, ref.shape)
        e = call(lik, "expected_log_prob", Y, M, V)
        e_vm = call(lik, "variational_moments", Y, M, V)[0]
        for label, got in (("expected_log_prob", e), ("variational_moments", e_vm)):
            assert_within(got[sel], ref[sel], check.rtol, atol[sel], f"{name}, {label}: {check.why}")


def assert_within(got, ref, rtol, atol, what):
    """``|got − ref| ≤ atol + rtol·|ref|`` elementwise, ``atol`` a number or one per element."""
    err, allowed = np.abs(got - ref), atol + rtol * np.abs(ref)
    bad = ~(err <= allowed)
    assert not np.any(bad), (f"{what}: {bad.sum()} of {bad.size} beyond tolerance; worst: got {got[bad][:4]}, "
                             f"want {ref[bad][:4]}, |err| {err[bad][:4]} > {allowed[bad][:4]}")


def test_softmax_is_the_documented_product_rule():
    # C = 3 classes: log p(y | f) depends on the two differences f_c − f_y alone, which are
    # N(m_c − m_y, diag(v_c) + v_y 11ᵀ); 14 Gauss–Hermite nodes per difference (20² lowered to
    # the 216-node budget), through a dense Cholesky factor per row, written here from NumPy's
    # nodes: agrees to rounding, at every v.
    case = SWEEP["softmax"]
    Y, M, V = sweep_rows(case)
    C = M.shape[1]
    Z, W = _product_rule(14, C - 1)
    ref = []
    for y, m, v in zip(Y, M, V):
        r = int(y)
        o = [(r + j) % C for j in range(1, C)]  # the other classes, in Softmax's order
        A = np.linalg.cholesky(np.diag(v[o]) + v[r])
        d = (m[o] - m[r]) + Z @ A.T
        ref.append(-np.logaddexp(0.0, np.logaddexp(d[:, 0], d[:, 1])) @ W)
    np.testing.assert_allclose(call(case.lik, "expected_log_prob", Y, M, V), ref, rtol=1e-12, atol=1e-13)


def test_surrogates_against_the_true_expectation():
    Y, M, V = grid([-1.0, 1.0], ALL_V)
    true = _quad_expected(_logistic_log_prob)(Y, M, V)
    jj = call(SWEEP["jaakkola-jordan"].lik, "expected_log_prob", Y, M, V)
    assert np.all(jj <= true + 1e-12), "the Jaakkola–Jordan bound exceeds E[log σ(y f)]"
    # both surrogates are exact at v → 0 (JJ: ξ = |m| makes the bound tight at f = m)
    for name in ("jaakkola-jordan", "taylor-logistic"):
        got = call(SWEEP[name].lik, "expected_log_prob", Y, M, np.full_like(V, 1e-12))
        np.testing.assert_allclose(got, _logistic_log_prob(Y, M), rtol=1e-12, atol=1e-11, err_msg=name)


def _codec_round_trip(obj):
    """``obj`` through gpvi.io's component codec, as in a model file: JSON metadata and arrays
    written with ``numpy.savez`` and read back."""
    arrays = {}
    spec = json.loads(json.dumps(gpvi.io.encode(obj, arrays, "lik")))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    buf.seek(0)
    with np.load(buf) as z:
        stored = {k: z[k] for k in z.files}
    return gpvi.io.decode(spec, stored)


def assert_same_component(a, b, path="lik"):
    """Same class and, field by field, equal settings and bit-equal parameter arrays."""
    arrays = (np.ndarray, jax.Array, np.generic)
    if isinstance(a, arrays) or isinstance(b, arrays):  # the codec reads arrays back as jax arrays
        assert isinstance(a, arrays) and isinstance(b, arrays), f"{path}: {a!r} vs {b!r}"
        x, y = np.asarray(a), np.asarray(b)
        assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y), f"{path}: {x!r} != {y!r}"
        return
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Module):
        for f in dataclasses.fields(a):
            assert_same_component(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_component(x, y, f"{path}.{i}")
    else:
        assert a is None or isinstance(a, (str, bool, int, float)), f"{path}: unexpected {type(a).__name__}"
        assert a == b, f"{path}: {a!r} != {b!r}"


SAVED = {**{n: lik for n, (lik, _) in CASES.items()}, **{n: c.lik for n, c in SWEEP.items() if c.saved}}


@pytest.mark.parametrize("name", list(SAVED))
def test_model_file_codec_round_trip(name):
    lik = SAVED[name]
    back = _codec_round_trip(lik)
    assert back is not lik
    assert_same_component(back, lik)


@pytest.mark.parametrize("name", [n for n, c in SWEEP.items() if not c.saved])
def test_engine_internal_likelihoods_are_not_saved(name):
    with pytest.raises(ValueError, match="cannot save"):
        gpvi.io.encode(SWEEP[name].lik, {}, "lik")


def test_quasipoisson_is_read_under_its_old_private_name():
    # files written before it moved to gpvi.likelihoods name it ``_QuasiPoisson``
    spec = {"class": "_QuasiPoisson", "fields": {"quadrature_points": {"value": 20}}}
    assert_same_component(gpvi.io.decode(spec, {}), L.QuasiPoisson())
    assert gpvi.io.encode(L.QuasiPoisson(), {}, "lik") == {"class": "QuasiPoisson",
                                                             "fields": {"quadrature_points": {"value": 20}}}


def test_class_probabilities_of_label_likelihoods():
    """``class_probabilities`` (what ``FitResult.predict_proba`` reports): rows sum to 1, the
    Bernoulli column is E[σ(f)] by adaptive quadrature, a Monte Carlo wrapper reports its wrapped
    likelihood's, and a likelihood without labels refuses."""
    m, v = np.array([-1.0, 0.3, 2.0]), np.array([0.5, 1.0, 3.0])
    p = call(L.Bernoulli(), "class_probabilities", m, v)
    ref = [integrate.quad(lambda z: special.expit(mi + np.sqrt(vi) * z) * stats.norm.pdf(z), -12, 12)[0]
           for mi, vi in zip(m, v)]
    np.testing.assert_allclose(p[:, 1], ref, rtol=1e-6)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(call(L.MonteCarlo(L.Bernoulli()), "class_probabilities", m, v), p)
    q = call(L.Ordinal(edges=EDGES, shape=SHAPE), "class_probabilities", m, v)
    assert q.shape == (3, len(EDGES) + 1)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-10)
    ms, vs = np.array([[0.0, 1.0, -1.0]]), np.array([[0.2, 0.5, 1.0]])
    np.testing.assert_allclose(call(L.Softmax(num_classes=3), "class_probabilities", ms, vs).sum(axis=1), 1.0,
                               rtol=1e-10)
    with pytest.raises(ValueError, match="class labels"):
        L.Gaussian(variance=1.0).class_probabilities(jnp.asarray(m), jnp.asarray(v))
