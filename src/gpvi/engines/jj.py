"""vi-JJ, vi-Taylor, vi-JJ-hybrid and vi-JJ-full (Izmailov & Kropotov 2017, §4) for
Bernoulli(logit) models.

The expected log-likelihood is replaced by a quadratic surrogate (:mod:`gpvi.likelihoods.surrogates`: the
Jaakkola–Jordan bound or a Taylor expansion) with one parameter ξ_i per observation.  For fixed
ξ the surrogate bound is quadratic in ``q(w) = N(m, V)``, so its maximiser over ``q`` is
closed-form (Eqs. 12–13, 16–17), and maximising over ``q`` leaves the *collapsed* bound

    ``Ĵ(θ, ξ) = Σ_i [α_i + β_i o_i − κ_i (o_i² + c_i)] + ½ gᵀ P⁻¹ g − ½ log|P|``,
    ``P = I + 2 Σ κ_i a_i a_iᵀ``,  ``g = Σ a_i (β_i − 2κ_i o_i)``

(whitened coordinates, ``o_i = b_i + offset_i``; Eq. 18 and the paper's ``Ĵ``), one pass over
the data plus a d×d Cholesky, differentiable in θ and ξ by autodiff.

**Analytic rounds.**  With the surrogate as a likelihood object the shared data sums give
``(E, Σρa − m, Σλaaᵀ)`` at ``ξ`` refreshed from the current marginals, and one undamped
natural-gradient (fixed-point/Newton) step of :mod:`gpvi.engines._common` is the exact
maximiser of the surrogate for those ξ: one round = ξ update + μ, Σ update, one pass.  For JJ
the rounds are an EM iteration: the surrogate bound never decreases.  For Taylor (ξ = m) the
mean update is Newton's method on ``Σ log σ(y_i m_i) − ½|m|²`` whatever V is, so its fixed point
is the Laplace approximation of the whitened model (tested against ``engine="laplace"``); the
rounds are undamped, as in the paper.

Engines (fixed hyperparameters), all run through :func:`gpvi.fit`:

============  ========================================================================
``jj``        JJ analytic rounds until the estimated gap of the surrogate step is small
``taylor``    Taylor analytic rounds, likewise
``jj-hybrid`` ``n_upd`` JJ rounds, then ≤ ``max_fun`` L-BFGS-B evaluations of Ĵ in ξ; repeat
``jj-full``   L-BFGS-B on Ĵ in ξ alone (q analytic at every evaluation)
============  ========================================================================

With ``learn_hyperparameters`` :func:`gpvi.fit` calls :func:`learn` instead (the paper's drivers,
not fit's profile L-BFGS-B): ``jj``/``taylor`` alternate ``n_upd`` rounds with an L-BFGS-B step on
``Ĵ(·, ξ)`` of at most ``max_fun`` evaluations (Algorithm 1; ξ taken from the marginals at the
end of the rounds; ``max_fun`` is a hard cap, counted by the driver, since SciPy checks its own
``maxfun`` only between iterations); ``jj-hybrid`` does the same with θ and ξ jointly in the
L-BFGS-B step;
``jj-full`` runs one L-BFGS-B on θ and ξ jointly.  After an L-BFGS-B step the state is the
analytic ``q*(θ, ξ)`` at its best point, so the surrogate bound of vi-JJ never decreases.

Every result reports both bounds: ``EngineResult.vlb`` and the trace are the *true* VLB
(Gauss–Hermite, as every other engine reports it), so that traces lie on one axis; the true
VLB of each traced iterate is computed off the clock (its time is not in the trace).  The
surrogate bound at the solution is ``extras["surrogate_bound"]``.
"""
from __future__ import annotations

import copy
import numbers
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpvi._module import flatten_params, ravel_params, ravel_values, unflatten_params
from gpvi.likelihoods import Bernoulli
from gpvi.objective import Objective, State, chunk_setup, stacked_state, marginals_stacked, chunk_projection, vlb_in_hyperparameters
from gpvi.likelihoods.surrogates import COEFFICIENTS, SURROGATES, optimal_xi
from gpvi.engines.registry import Engine
from gpvi.engines._common import (STOPPED, Clock, EngineResult, Progress, call_on_state, estimated_gap,
                                 final_gap, flip, gap_threshold, reversed_chol, target_and_step)
from gpvi._linalg import tri_inv
from gpvi._watchdog import paused
from gpvi._compile import jit

__all__ = ["run_jj", "run_taylor", "run_hybrid", "run_full", "learn", "collapsed_bound",
           "surrogate_objective", "SUPPORTED"]

#: The engine names of this module (Bernoulli-logit models only).
SUPPORTED = ("jj", "taylor", "jj-hybrid", "jj-full")
_VARIANT = {"jj": ("jj", "alternate"), "taylor": ("taylor", "alternate"), "jj-hybrid": ("jj", "hybrid"),
            "jj-full": ("jj", "full")}


# ---- checks ---------------------------------------------------------------------------------
def check_likelihood(model, engine: str):
    """Raise a ValueError unless ``model`` has a Bernoulli likelihood with the logit link."""
    lik = model.likelihood
    if isinstance(lik, Bernoulli) and lik.link == "logit":
        return
    what = type(lik).__name__ + (f"(link={lik.link!r})" if isinstance(lik, Bernoulli) else "")
    raise ValueError(f"engine={engine!r} needs a Bernoulli likelihood with the logit link (its surrogates bound "
                     f"or expand log σ(y f)), got {what}; the engines {', '.join(map(repr, SUPPORTED))} support "
                     "only Bernoulli(logit) — use 'fpi', 'fpb' or 'gradient' for other likelihoods")


def _check_count(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


# ---- objectives sharing one data layout ------------------------------------------------------
def surrogate_objective(objective: Objective, kind: str) -> Objective:
    """``objective`` with the likelihood replaced by the ``kind`` surrogate (``"jj"`` or
    ``"taylor"``); the projections and prior cache are shared (they do not depend on it)."""
    sur = copy.copy(objective)
    lik = objective.model.likelihood
    sur.model = objective.model.replace(likelihood=SURROGATES[kind](quadrature_points=lik.quadrature_points))
    sur.num_evaluations = 0
    return sur


def with_model(objective: Objective, model) -> Objective:
    """``objective`` for other hyperparameters: same chunks, prior cache and projections
    recomputed (one compiled set-up call)."""
    new = copy.copy(objective)
    new.model = model
    new.prior, new._prior_finite, new.proj = chunk_setup(model, new.X, new.chunks.X, new.cached, new.blocks)
    new.num_evaluations = 0
    return new


@partial(jit, static_argnames=("cached", "blocks"))
def _marginals(model, prior, chunks, proj, state, cached, blocks):
    """Latent means and variances ``(C, n)`` of every row (padding rows included)."""
    W = stacked_state(state)

    def one(xs):
        ch, pr = xs
        A, b, c = chunk_projection(model, prior, ch, pr, cached, blocks)
        return marginals_stacked(A, b, c, ch.offset, W)

    return jax.lax.map(one, (chunks, proj))


def marginals(objective: Objective, state: State):
    """``(m, v)``, each (C, n) in the objective's chunk layout."""
    return _marginals(objective.model, objective.prior, objective.chunks, objective.proj, state,
                      objective.cached, objective.blocks)


_optimal_xi = jit(optimal_xi, static_argnums=0)  # (eagerly: three small programs per shape)


def analytic_xi(objective: Objective, state: State, kind: str):
    """The analytic ξ (C, n) of every row for ``state`` (see :func:`gpvi.likelihoods.surrogates.optimal_xi`)."""
    m, v = marginals(objective, state)
    return _optimal_xi(kind, m, v)


# ---- the collapsed bound Ĵ(θ, ξ) -------------------------------------------------------------
def collapsed_bound(model, X, chunks, xi, kind: str):
    """``(Ĵ, (g, R))``: the surrogate bound maximised over ``q`` in closed form, for per-row
    parameters ``xi`` (C, n) in the layout of ``chunks``.  ``R`` is the reversed Cholesky
    factor of ``P = I + 2Σκ_i a_i a_iᵀ`` (see :func:`state_from_collapsed`).  Differentiable in
    the model's parameters and ``xi``; each chunk is rematerialised in the backward pass."""
    prior = model.prior_cache(X)
    coeffs = COEFFICIENTS[kind]

    @jax.checkpoint
    def chunk(ch, xc):
        (At,), b, c = chunk_projection(model, prior, ch, None, False, 1)
        keep = ch.mask > 0
        alpha, beta, kappa = (jnp.where(keep, t, 0.0) for t in coeffs(ch.y, xc))
        o = b + ch.offset
        const = jnp.sum(alpha + beta * o - kappa * (o * o + c))
        return const, At @ (beta - 2.0 * kappa * o), (At * kappa) @ At.T

    def body(carry, xs):
        out = chunk(*xs)
        return tuple(a + b for a, b in zip(carry, out)), None

    d = model.num_weights(X)
    init = (jnp.zeros(()), jnp.zeros(d), jnp.zeros((d, d)))
    (const, g, P), _ = jax.lax.scan(body, init, (chunks, xi))
    R = reversed_chol(jnp.eye(d) + 2.0 * P)
    z = solve_triangular(R, g[::-1], lower=True)  # zᵀz = gᵀ P⁻¹ g
    value = const + 0.5 * (z @ z) - jnp.sum(jnp.log(jnp.diag(R)))
    return value, (g, R)


@jit
def state_from_collapsed(g, R) -> State:
    """The maximiser ``q* = N(P⁻¹ g, P⁻¹)`` from :func:`collapsed_bound`'s ``(g, R)``."""
    z = solve_triangular(R, g[::-1], lower=True)
    mean = solve_triangular(R.T, z, lower=False)[::-1]
    return State(mean, flip(tri_inv(R).T))


def _neg_collapsed(theta, xi, model, X, chunks, kind):
    value, aux = collapsed_bound(unflatten_params(model, theta), X, chunks, xi, kind)
    return -value, aux


_neg_collapsed_and_grad = jit(jax.value_and_grad(_neg_collapsed, argnums=(0, 1), has_aux=True),
                                  static_argnames=("kind",))
_true_vlb = jit(vlb_in_hyperparameters)


# ---- clock with off-clock evaluations ----------------------------------------------------------
class _Clock(Clock):
    """:class:`~gpvi.engines._common.Clock` whose rows hold the *true* VLB while the engine
    steps on its surrogate: the true VLB (and any ``on_state`` hook) is evaluated off the clock,
    i.e. its time is subtracted from every later row; the surrogate's bound is kept alongside."""

    def __init__(self, callback=None, on_state=None):
        super().__init__(callback, on_state)
        self.off = 0.0
        self.surrogate: list[float] = []

    def now(self):
        return time.perf_counter() - self.t0 - self.off

    def tick(self, iteration, true_vlb_fn, model, state, surrogate=float("nan")):
        """Record iteration ``iteration`` at ``state`` (of ``model``); returns the true VLB."""
        jax.block_until_ready(state)
        t = self.now()
        s = time.perf_counter()
        v = float(true_vlb_fn())
        if self.on_state is not None and not self.stopped:
            self.stopped = call_on_state(self.on_state, model, state, Progress(int(iteration), v, t))
        self.off += time.perf_counter() - s
        self.rows.append((t, v))
        self.surrogate.append(float(surrogate))
        if self.callback is not None:
            with paused():
                self.callback(iteration, v, t)
        return v


def _finite_state(state) -> bool:
    return bool(np.all(np.isfinite(np.asarray(state.mean))) and np.all(np.isfinite(np.asarray(state.chol))))


# ---- fixed hyperparameters: analytic rounds ---------------------------------------------------
def _analytic(objective, state, kind, engine, *, tol, tol_nats, max_iter, callback, on_state):
    check_likelihood(objective.model, engine)
    sur = surrogate_objective(objective, kind)
    clock = _Clock(callback, on_state)
    sums = sur.sums(state)
    clock.tick(0, lambda: objective.vlb(state), objective.model, state, sums.vlb)
    converged, message, it, gap = False, f"reached max_iter={max_iter}", 0, float("inf")
    if clock.stopped:
        message = STOPPED
    for it in range(1, 0 if clock.stopped else max_iter + 1):
        thr = gap_threshold(sums.vlb, tol, tol_nats)
        _, prop, gap = target_and_step(state, sums.grad, sums.S, 1.0)
        gap = float(gap)
        if gap <= thr:
            converged, message, it = True, f"estimated surrogate gap {gap:.3g} nats ≤ {thr:.3g}", it - 1
            break
        new = sur.sums(prop) if _finite_state(prop) else None
        if new is None or not np.isfinite(float(new.vlb)):
            message, it = "the analytic update gave a non-finite state; stopped at the last finite one", it - 1
            break
        state, sums = prop, new
        clock.tick(it, lambda: objective.vlb(state), objective.model, state, sums.vlb)
        if clock.stopped:
            message, gap = STOPPED, float(estimated_gap(state, sums.grad, sums.S, sums.trSV)[0])
            break
    true = float(objective.vlb(state))
    extras = {"surrogate": kind, "surrogate_bound": float(sums.vlb), "surrogate_gap": gap,
              "surrogate_trace": np.asarray(clock.surrogate)}
    return EngineResult(state, true, it, converged, message, clock.trace,
                        evaluations=objective.num_evaluations + sur.num_evaluations, extras=extras,
                        gap=final_gap(objective, state))


def run_jj(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
           max_iter: int = 500, callback=None, n_upd: int = 3, max_fun: int = 5, on_state=None) -> EngineResult:
    """vi-JJ with fixed hyperparameters: Jaakkola–Jordan analytic rounds (ξ² = m² + v, then the
    exact maximiser of the bound over q) until the estimated gap of the next round's q-update
    is at most ``tol_nats`` (default ``0.1·tol·max(1, |bound|)``).  ``n_upd``/``max_fun`` are
    used when hyperparameters are learned (:func:`learn`); ``on_state(model, state, progress)``
    (:class:`~gpvi.engines._common.Progress`) is called off the clock at every traced iterate and
    ends the run when it returns True."""
    _check_count("n_upd", n_upd), _check_count("max_fun", max_fun)
    return _analytic(objective, state, "jj", "jj", tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                     callback=callback, on_state=on_state)


def run_taylor(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
               max_iter: int = 500, callback=None, n_upd: int = 3, max_fun: int = 5, on_state=None) -> EngineResult:
    """vi-Taylor with fixed hyperparameters: expansion at ξ = m, then the exact maximiser of
    the approximate bound over q; as :func:`run_jj` otherwise."""
    _check_count("n_upd", n_upd), _check_count("max_fun", max_fun)
    return _analytic(objective, state, "taylor", "taylor", tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                     callback=callback, on_state=on_state)


def run_hybrid(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
               max_iter: int = 500, callback=None, n_upd: int = 3, max_fun: int = 5, on_state=None) -> EngineResult:
    """vi-JJ-hybrid with fixed hyperparameters: ``n_upd`` analytic rounds, then an L-BFGS-B
    step of at most ``max_fun`` evaluations of Ĵ in ξ (a hard cap); repeated (see :func:`learn`)."""
    return learn(objective, state, [], engine="jj-hybrid", tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                 max_rounds=max_iter, callback=callback, n_upd=n_upd, max_fun=max_fun, on_state=on_state)[0]


def run_full(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
             max_iter: int = 500, callback=None, n_upd: int = 3, max_fun: int = 5, on_state=None) -> EngineResult:
    """vi-JJ-full with fixed hyperparameters: L-BFGS-B on Ĵ in ξ (q analytic at every
    evaluation), at most ``max_iter`` iterations (see :func:`learn`; ``n_upd`` and ``max_fun``
    are checked but not used)."""
    return learn(objective, state, [], engine="jj-full", tol=tol, tol_nats=tol_nats, max_iter=max_iter,
                 max_rounds=max_iter, callback=callback, n_upd=n_upd, max_fun=max_fun, on_state=on_state)[0]


# ---- the drivers with hyperparameters ---------------------------------------------------------
class _Collapsed:
    """``x ↦ (−Ĵ, −∇Ĵ)`` for SciPy on ``x = [θ (unconstrained, flat); ξ (N,)]`` (ξ only when it
    is optimised), remembering the best point evaluated and its analytic ``q``."""

    def __init__(self, model, names, objective, kind, xi_free: bool):
        self.model, self.kind, self.xi_free = model, kind, xi_free
        theta0 = flatten_params(model, names)
        # NumPy (the order of ravel_pytree): no eager programs for θ's few numbers at every evaluation
        flat, self.unravel = ravel_params(theta0)
        self.theta0 = np.asarray(flat, dtype=np.float64)
        self.p = self.theta0.size
        self.X, self.chunks = objective.X, objective.chunks
        self.shape = objective.chunks.mask.shape
        self.N = objective.num_data
        self.xi_fixed = None
        self.evaluations = 0
        self.reset()

    def reset(self):
        self.best = (np.inf, None, None)  # (−Ĵ, x, (g, R))

    def pack(self, theta_flat, xi):
        if not self.xi_free:
            return np.asarray(theta_flat, dtype=np.float64)
        return np.concatenate([np.asarray(theta_flat), np.asarray(xi).reshape(-1)[:self.N]])

    def split(self, x):
        theta = self.unravel(x[:self.p])
        if not self.xi_free:
            return theta, self.xi_fixed
        C, n = self.shape
        xi = np.zeros(C * n)
        xi[:self.N] = x[self.p:]
        return theta, jax.device_put(xi.reshape(C, n))

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64)
        theta, xi = self.split(x)
        self.evaluations += 1
        (val, aux), (g_theta, g_xi) = _neg_collapsed_and_grad(theta, xi, self.model, self.X, self.chunks, self.kind)
        val = float(val)
        grad = ravel_values(g_theta) if self.p else np.zeros(0)
        if self.xi_free:
            grad = np.concatenate([grad, np.asarray(g_xi).reshape(-1)[:self.N]])
        if not np.isfinite(val) or not np.all(np.isfinite(grad)):
            return np.inf, np.zeros_like(x)
        if val < self.best[0]:
            self.best = (val, x.copy(), aux)
        return val, grad

    def model_at(self, x):
        return unflatten_params(self.model, self.unravel(x[:self.p]))


class _BudgetSpent(Exception):
    """An L-BFGS-B step has used its ``max_fun`` evaluations of the collapsed bound."""


def _capped(fn, budget: int):
    """``fn`` allowed at most ``budget`` calls; the next one raises :class:`_BudgetSpent`.

    SciPy's L-BFGS-B checks ``maxfun`` only when an iteration ends, and stops only once the
    count *exceeds* it, so a line search that is under way runs past it (3 evaluations per
    step at ``maxfun=2``, 25 for 4 steps at 5).  Counting here makes ``max_fun`` a hard cap."""
    used = [0]

    def capped(x):
        if used[0] >= budget:
            raise _BudgetSpent
        used[0] += 1
        return fn(x)

    return capped


def _lbfgsb_step(fn, x, max_fun: int):
    """One L-BFGS-B step of :func:`learn`: at most ``max_fun`` evaluations of ``fn``, from ``x``;
    the step's result is ``fn.best`` (the best point evaluated)."""
    try:
        import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
        scipy.optimize.minimize(_capped(fn, max_fun), x, jac=True, method="L-BFGS-B",
                                options=dict(maxfun=max_fun, maxiter=max_fun, ftol=0.0, gtol=0.0))
    except _BudgetSpent:
        pass


def learn(objective: Objective, state: State, names, *, engine: str = "jj", tol: float = 1e-6,
          tol_nats: float | None = None, max_iter: int = 500, max_rounds: int = 100, callback=None,
          n_upd: int = 3, max_fun: int = 5, on_state=None):
    """The paper's drivers: returns ``(EngineResult, model, objective)`` with the learned
    hyperparameters (``objective`` is the true-likelihood Objective at them).

    ``names``: dotted parameter names to learn (may be empty: then only ξ and q are fitted).
    ``engine``: ``"jj"``/``"taylor"`` (Algorithm 1: ``n_upd`` analytic rounds, then L-BFGS-B on
    ``Ĵ(·, ξ)`` with at most ``max_fun`` evaluations, ξ from the marginals after the rounds),
    ``"jj-hybrid"`` (the same with θ and ξ jointly in the L-BFGS-B step) or ``"jj-full"`` (one
    L-BFGS-B run on θ and ξ jointly, at most ``max_iter`` iterations; ``max_fun`` is not used).
    ``max_fun`` is a hard cap on the evaluations of Ĵ (value and gradient) in each L-BFGS-B
    step: the step ends at the evaluation that reaches it, even inside a line search (SciPy's
    own ``maxfun`` is checked only between iterations), and takes the best point evaluated.  The alternating drivers
    stop after ``max_rounds`` outer iterations or when Ĵ after an L-BFGS-B step has changed by at
    most ``tol·max(1, |Ĵ|)`` (``tol_nats`` nats if given) since the previous one.  The state
    after each L-BFGS-B step is the analytic maximiser ``q*(θ, ξ)`` at its best point.
    """
    if engine not in _VARIANT:
        raise ValueError(f"engine must be one of {SUPPORTED}, got {engine!r}")
    check_likelihood(objective.model, engine)
    n_upd, max_fun = _check_count("n_upd", n_upd), _check_count("max_fun", max_fun)
    kind, variant = _VARIANT[engine]
    names = list(names)
    model = objective.model
    fn = _Collapsed(model, names, objective, kind, xi_free=variant != "alternate")
    clock = _Clock(callback, on_state)
    obj = objective
    sur = surrogate_objective(obj, kind)

    def tick(i, mdl, st, surrogate):
        # the current Objective's cached projections when it is at these hyperparameters
        if mdl is obj.model:
            return clock.tick(i, lambda: obj.vlb(st), mdl, st, surrogate)
        return clock.tick(i, lambda: _true_vlb(mdl, obj.X, obj.chunks, st), mdl, st, surrogate)

    tick(0, model, state, float(sur.vlb(state)))
    x = fn.theta0
    rounds = steps = 0
    converged, message = False, f"reached max_rounds={max_rounds} outer iterations"
    last = None
    stop_at = (lambda v: tol_nats) if tol_nats is not None else (lambda v: tol * max(1.0, abs(v)))

    if variant == "full":
        xi = analytic_xi(obj, state, kind)
        x = fn.pack(fn.theta0, xi)
        it = [0]

        def record(res):
            it[0] += 1
            if fn.best[1] is not None:
                mdl = fn.model_at(fn.best[1])
                st = state_from_collapsed(*fn.best[2])
                tick(it[0], mdl, st, -fn.best[0])
                if clock.stopped:
                    raise StopIteration

        import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
        out = scipy.optimize.minimize(fn, x, jac=True, method="L-BFGS-B", callback=record,
                                      options=dict(maxiter=int(max_iter), maxfun=10 * int(max_iter),
                                                   ftol=tol, gtol=1e-9))
        steps = int(out.nit)
        if fn.best[1] is None:
            raise ValueError(f"the collapsed JJ bound is not finite at the starting hyperparameters {names}")
        model, state = fn.model_at(fn.best[1]), state_from_collapsed(*fn.best[2])
        obj = with_model(objective, model) if names else objective
        converged = bool(out.success) and not clock.stopped
        message = STOPPED if clock.stopped else f"L-BFGS-B on θ and ξ: {out.message}"
        if it[0] == 0:  # no iteration completed: trace the best point evaluated
            tick(1, model, state, -fn.best[0])
    else:
        if clock.stopped:
            message = STOPPED
        for outer in range(1, 0 if clock.stopped else max_rounds + 1):
            # stage 1: n_upd analytic rounds of ξ, μ, Σ
            for _ in range(n_upd):
                sums = sur.sums(state)
                _, prop, _ = target_and_step(state, sums.grad, sums.S, 1.0)
                if not _finite_state(prop):
                    break
                state = prop
                rounds += 1
                tick(rounds + steps, model, state, float(sums.vlb))
                if clock.stopped:
                    break
            if clock.stopped:
                message = STOPPED
                break
            # stage 2: L-BFGS-B on θ (and ξ for the hybrid) with ξ from the current marginals
            xi = analytic_xi(obj, state, kind)
            fn.xi_fixed = xi
            fn.reset()
            x = fn.pack(x[:fn.p] if fn.p else np.zeros(0), xi)
            if fn.p == 0 and not fn.xi_free:
                value = -float(fn(x)[0])  # nothing numeric to optimise: Ĵ at the rounds' ξ
            else:
                _lbfgsb_step(fn, x, max_fun)
                value = -fn.best[0]
            if fn.best[1] is None:
                if outer == 1:
                    raise ValueError("the collapsed surrogate bound or its gradient is not finite at the starting "
                                     f"hyperparameters {names}; check their values")
                message = "the collapsed bound was not finite at any point of the last L-BFGS-B step"
                break
            x = fn.best[1]
            steps += 1
            if names:
                model = fn.model_at(x)
                obj = with_model(objective, model)
                sur = surrogate_objective(obj, kind)
            state = state_from_collapsed(*fn.best[2])
            tick(rounds + steps, model, state, value)
            if clock.stopped:
                message = STOPPED
                break
            if last is not None and abs(value - last) <= stop_at(value):
                converged = True
                message = f"the collapsed bound changed by {abs(value - last):.3g} nats in outer iteration {outer}"
                break
            last = value
    true = float(obj.vlb(state))
    surrogate = float(surrogate_objective(obj, kind).vlb(state))
    extras = {"surrogate": kind, "surrogate_bound": surrogate, "surrogate_trace": np.asarray(clock.surrogate),
              "analytic_rounds": rounds, "lbfgsb_steps": steps, "bound_evaluations": fn.evaluations,
              "n_upd": n_upd, "max_fun": max_fun, "variant": engine}
    res = EngineResult(state, true, rounds + steps, converged, message, clock.trace,
                       evaluations=fn.evaluations + rounds, extras=extras, gap=final_gap(obj, state))
    return res, model, obj


# Four engines: each drives its own hyperparameter search (the alternations of Izmailov &
# Kropotov 2017) instead of fit()'s profile search.
ENGINES = (
    Engine("jj", run_jj, "Jaakkola-Jordan bound: analytic xi, mu, Sigma (Izmailov & Kropotov 2017; Bernoulli logit)",
           hyperparameters="own", learn=partial(learn, engine="jj")),
    Engine("taylor", run_taylor, "Taylor expansion at the marginal means: analytic mu, Sigma (Izmailov & Kropotov 2017; "
           "Bernoulli logit)", hyperparameters="own", learn=partial(learn, engine="taylor")),
    Engine("jj-hybrid", run_hybrid, "Jaakkola-Jordan rounds alternating with L-BFGS-B on xi (and hyperparameters)",
           hyperparameters="own", learn=partial(learn, engine="jj-hybrid")),
    Engine("jj-full", run_full, "L-BFGS-B on xi (and hyperparameters) with mu, Sigma analytic",
           hyperparameters="own", learn=partial(learn, engine="jj-full")),
)
