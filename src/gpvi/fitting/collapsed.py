"""Collapsed bounds of Gaussian likelihoods: hyperparameters in closed form.

With a Gaussian likelihood the optimal ``q(w)`` is known in closed form for every
hyperparameter setting θ, so the profile bound ``F(θ) = max_q VLB(θ, q)`` that :func:`gpvi.fit`
maximises for other likelihoods (running the engine to convergence at every evaluation) is a
closed-form function of θ (with ``r = y − b − offset`` the residual from the prior mean):

- ``GP``: the exact log marginal likelihood ``log N(r | 0, K + νI + σ²I)`` (``ν`` the model's
  jitter nugget, part of its prior);
- ``SparseGP``: Titsias' (2009) collapsed bound
  ``log N(r | 0, Q + σ²I) − Σ_i c_i / 2σ²`` with ``Q = AᵀA``, ``a_i = L_M⁻¹ k(Z, x_i)`` and
  ``c_i = k_ii − |a_i|²`` (the model's :meth:`~gpvi.models.SparseGP.project`);
- ``GLM``: the Bayesian linear-regression evidence, the same formula with ``a_i = σ_p h_i`` and
  ``c_i = 0``.

Each is the VLB at its optimal ``q`` exactly, so its maximiser is the maximiser of the profile
bound; one evaluation costs one Cholesky (N×N for the full GP; d×d by the Woodbury identity
for the sparse GP and the GLM, after an O(N d²) pass over the data in chunks) instead of an
engine run.  :func:`learn` maximises it by L-BFGS-B with autodiff gradients; :func:`gpvi.fit`
then runs the engine once at the learned θ to get ``q`` (which for a Gaussian likelihood is
this same closed-form optimum).

Both bounds are evaluated on padded data (:func:`gpvi._compile.bucket`), so that training
sets whose sizes fall in one bucket share one compiled program.  Padding the full GP does not
change the bound: padded rows get the covariance block ``I`` and residual 0 (a block-diagonal
addition contributes ``log det I = 0`` and nothing to the quadratic form).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpvi._compile import bucket, jit
from gpvi._module import flatten_params, ravel_params, ravel_values, unflatten_params
from gpvi.likelihoods import Gaussian
from gpvi.engines import Progress
from gpvi.fitting.lbfgs import memory, stop_message
from gpvi.fitting.problem import check_offset
from gpvi.likelihoods.base import as_array
from gpvi.models.base import GLM, GP, SparseGP, check_X
from gpvi.objective import make_chunks
from gpvi._watchdog import paused
from gpvi.priors import LogPrior

__all__ = ["applies", "collapsed_bound", "learn"]

_LOG2PI = float(np.log(2.0 * np.pi))


def applies(model, engine) -> bool:
    """Whether :func:`gpvi.fit` learns the hyperparameters of ``model`` on its collapsed bound:
    a Gaussian likelihood on a GP, SparseGP or GLM, with any engine (a name or
    :class:`~gpvi.engines.Engine`) whose profile search maximises the VLB (not ``"laplace"``,
    which maximises its own Laplace evidence by design)."""
    from gpvi import engines

    return (type(model.likelihood) is Gaussian and isinstance(model, (GP, SparseGP, GLM))
            and engines.get(engine).evidence == "vlb")


def _gp_bound(model, X, y, offset, mask):
    """Exact log marginal likelihood of a full GP on rows padded to a bucket: (Np, D), (Np,)×3."""
    K = model.kernel(X, X)
    keep = mask > 0
    n = jnp.sum(mask)
    # the model's nugget (gpvi.models.cholesky at its first try), from the real rows only
    nugget = model.jitter * jnp.maximum(jnp.sum(jnp.where(keep, jnp.diag(K), 0.0)) / n,
                                        jnp.finfo(K.dtype).tiny)
    both = keep[:, None] & keep[None, :]
    diag = jnp.where(keep, nugget + model.likelihood.variance, 1.0)
    S = jnp.where(both, K, 0.0) + jnp.diag(diag)
    L = jnp.linalg.cholesky(S)
    r = jnp.where(keep, y - model.mean - offset, 0.0)
    alpha = solve_triangular(L, r, lower=True)
    return -0.5 * (alpha @ alpha) - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * _LOG2PI


def _projected_bound(model, chunks):
    """Titsias' bound (SparseGP) or the linear-regression evidence (GLM) from the model's
    projections of each chunk, by the Woodbury identity: one d×d Cholesky."""
    # the prior cache and the per-pass cache (a sparse GP's L⁻¹, so each chunk's projections are a
    # matrix product, with closed-form derivatives; X is unused by these models)
    _, pcache = model.caches(chunks.X.reshape(-1, chunks.X.shape[-1]))
    s2 = model.likelihood.variance

    @jax.checkpoint  # the backward pass recomputes each chunk: O(chunk·d) memory like the forward
    def one(ch):
        At, b, c = model.project_many(pcache, ch.X)
        keep = ch.mask > 0
        r = jnp.where(keep, ch.y - b - ch.offset, 0.0)
        Am = At * ch.mask
        return Am @ At.T, Am @ r, r @ r, jnp.sum(jnp.where(keep, c, 0.0))

    d = model.num_weights(chunks.X[0])  # M inducing inputs or D columns (static shapes)

    def body(carry, ch):
        return tuple(a + b for a, b in zip(carry, one(ch))), None

    init = (jnp.zeros((d, d)), jnp.zeros(d), jnp.zeros(()), jnp.zeros(()))
    (P, Ar, rr, csum), _ = jax.lax.scan(body, init, chunks)
    n = jnp.sum(chunks.mask)
    B = jnp.eye(d) + P / s2
    LB = jnp.linalg.cholesky(0.5 * (B + B.T))
    z = solve_triangular(LB, Ar, lower=True)
    logdet = n * jnp.log(s2) + 2.0 * jnp.sum(jnp.log(jnp.diag(LB)))
    quad = rr / s2 - (z @ z) / s2**2
    return -0.5 * (n * _LOG2PI + logdet + quad) - 0.5 * csum / s2


def _bound(model, data):
    if isinstance(model, GP):
        return _gp_bound(model, *data)
    return _projected_bound(model, data)


def _negative(theta, model, data):
    return -_bound(unflatten_params(model, theta), data)


_value_and_grad = jit(jax.value_and_grad(_negative))
_value = jit(_bound)


def _padded_data(model, X, y, offset, chunk_size):
    """The data as the compiled bound takes it: rows padded to a bucket (:func:`bucket`)."""
    N = X.shape[0]
    if isinstance(model, GP):
        pad = bucket(N) - N
        rows = lambda a: np.concatenate([a, np.repeat(a[:1], pad, axis=0)]) if pad else a  # noqa: E731
        off = np.zeros(N) if offset is None else np.asarray(offset, np.float64)
        # (device_put: jnp.asarray would stage each host array through a compiled program)
        return jax.device_put((rows(np.asarray(X, np.float64)), rows(np.asarray(y, np.float64)), rows(off),
                               np.concatenate([np.ones(N), np.zeros(pad)])))
    return make_chunks(X, y, offset, chunk_size, bucketed=True)


def collapsed_bound(model, X, y, offset=None, chunk_size: int = 2048) -> float:
    """The collapsed bound (nats) of ``model`` (Gaussian likelihood; GP, SparseGP or GLM) on
    ``X`` (N, D), ``y`` (N,), ``offset`` (N,) or None: the VLB at the optimal ``q``."""
    if type(model.likelihood) is not Gaussian:
        raise ValueError(f"model: the collapsed bound needs a Gaussian likelihood, not "
                         f"{type(model.likelihood).__name__}")
    X = check_X(X, "X")
    y = model.likelihood.validate(as_array(y, "y"))  # finite, 1-D (one ValueError otherwise)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries: lengths must match")
    offset = check_offset(offset, X.shape[0])
    model = model.initialise(X, y)
    return float(_value(model, _padded_data(model, X, y, offset, chunk_size)))


def learn(model, names, X, y, offset, *, tol, max_rounds, chunk_size, t0, callback=None, log_prior=None,
          on_round=None):
    """L-BFGS-B on the collapsed bound in the unconstrained parameters ``names``.

    Returns ``(model, iterations, rows, evaluations, message)``: the model with the best
    parameters evaluated, the L-BFGS-B iteration count, the (seconds since ``t0``, bound) of every
    iteration (the first row at the start), the number of evaluations of the bound (the one at the
    start included; each is the optimal ``q`` in closed form, which :func:`gpvi.fit` counts as one
    iteration and one pass over the data) and why L-BFGS-B stopped
    (:func:`gpvi.fitting.lbfgs.stop_message`).  ``callback(iteration, bound, seconds)`` as in :func:`gpvi.fit`.
    Stops when the bound changes by at most ``tol · max(1, |bound|)`` between iterations.
    ``log_prior``: a :class:`gpvi.priors.LogPrior` of ``names`` (or None): the search then
    maximises bound + log p(θ); ``rows`` still record the bound.  ``on_round(model, progress)``
    (:class:`gpvi.engines.Progress`) after every iteration, with the model at its point; the
    search ends there when it returns True.
    """
    theta0 = flatten_params(model, names)
    flat0, unravel = ravel_params(theta0)  # NumPy: no eager JAX programs for a few numbers
    log_prior = log_prior if log_prior is not None else LogPrior(model, names, {})
    data = _padded_data(model, X, y, offset, chunk_size)
    best = [np.inf, None]
    rows = []
    evaluations = [0]

    def fun(x):
        evaluations[0] += 1
        theta = unravel(x)
        val, g = _value_and_grad(theta, model, data)
        g = ravel_values(g)
        val, g, _ = log_prior.penalise(theta, val, g)  # maximise bound + log p(θ)
        if not np.isfinite(val) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)  # the line search backs off
        if val < best[0]:
            best[:] = [val, np.array(x)]
        return val, g

    def bound(x, f):  # the bound alone, without log p(θ)
        return -f - log_prior.value(unravel(x))

    def record(intermediate_result):  # scipy passes the OptimizeResult only under this name
        rows.append((time.perf_counter() - t0, bound(intermediate_result.x, float(intermediate_result.fun))))
        k = len(rows) - 1
        if callback is not None:
            with paused():
                callback(k, rows[-1][1], rows[-1][0])
        if on_round is not None and on_round(unflatten_params(model, unravel(intermediate_result.x)),
                                             Progress(k, rows[-1][1], rows[-1][0], round=k)):
            raise StopIteration  # (SciPy ends the search with the point of this round)

    x0 = np.asarray(flat0)
    f0, _ = fun(x0)
    if not np.isfinite(f0):
        raise ValueError("the collapsed bound or its gradient is not finite at the starting hyperparameters "
                         f"{names}; check their values (or fit without learning them)")
    rows.append((time.perf_counter() - t0, bound(x0, f0)))
    import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
    out = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", callback=record,
                                  options=dict(maxiter=max_rounds, ftol=tol, gtol=1e-9, maxcor=memory(x0.size)))
    learned = unflatten_params(model, unravel(best[1]))
    return (learned, int(out.nit), np.asarray(rows, np.float64).reshape(-1, 2), evaluations[0],
            stop_message(out, max_rounds))
