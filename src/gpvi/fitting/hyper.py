"""How :func:`gpvi.fit` learns the hyperparameters: one strategy per way, chosen by :func:`choose`.

Every strategy is called as ``strategy(problem, runner, state, obj)`` (the checked
:class:`~gpvi.fitting.problem.Problem`, its :class:`~gpvi.fitting.runner.Runner`, the starting
state and the Objective it was computed on, if any) and returns an :class:`Outcome`:

- :func:`fixed`: no hyperparameters learned: one engine run (an engine such as ``ivsgpr`` that
  learns them by design still returns its learned model);
- :func:`profile`: L-BFGS-B on the *profile* bound ``F(θ) = max_q VLB(θ, q)`` (DESIGN §3),
  :func:`profile_search`, then one engine run at the learned θ.  Every evaluation first runs the
  engine to convergence, warm-started from the previous optimum, and then differentiates the VLB
  in the unconstrained hyperparameters by autodiff with the whitened ``(m, V)`` held fixed.  At
  the inner optimum that is the exact gradient of ``F`` (envelope theorem).  Because the
  fixed-point engines converge in a handful of iterations, each evaluation is cheap; this is
  much faster than alternating single steps, which zig-zags like EM.  With the Laplace engine
  (``Engine.evidence == "laplace"``) the Laplace log marginal likelihood is maximised instead;
- :func:`on_collapsed_bound`: Gaussian likelihoods: L-BFGS-B on the closed-form collapsed bound
  (:mod:`gpvi.fitting.collapsed`), then one engine run at the learned θ;
- :func:`joint`: engines that learn θ together with q (``Engine.hyperparameters == "joint"``,
  the stochastic engines): one engine run that takes the names;
- :func:`engine_owned`: engines with their own driver (``Engine.learn``: jj, taylor,
  jj-hybrid, jj-full, the alternation of Izmailov & Kropotov 2017).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
# Imported with gpvi, not lazily at the first search: loaded after JAX had started, scipy.optimize
# (and the BLAS it brings) made the USPS 4-7-9 learned fit 1.15x slower (52-56 s against 45-48 s,
# alternating fresh processes, 2026-11-28), for 0.2 s saved on `import gpvi`.

from gpvi.fitting import collapsed, warmstart
from gpvi.fitting.lbfgs import memory, stop_message
from gpvi.fitting.problem import check_known
from gpvi._module import (flatten_params, matching_parameters, parameter_value, ravel_params, ravel_values,
                          shares_elements, unflatten_params, untied_name)
from gpvi.priors import LogPrior
from gpvi.engines import STOPPED, Progress
from gpvi.engines.laplace import check_learned_hyperparameters, laplace_log_marginal_at
from gpvi.likelihoods.softmax import Softmax
from gpvi.models.base import SparseGP
from gpvi.objective import (as_device_array, full_gp_latents, make_chunks, pads_rows, prior_inputs, sparse_envelope,
                            vlb_envelope, vlb_in_hyperparameters)
from gpvi._compile import jit

__all__ = ["Outcome", "choose", "fixed", "profile", "on_collapsed_bound", "joint", "engine_owned",
           "profile_search", "neg_vlb", "neg_vlb_and_grad", "neg_envelope", "neg_envelope_grad",
           "neg_sparse_envelope", "neg_sparse_envelope_and_grad", "neg_laplace",
           "neg_laplace_and_grad", "INNER_TOL_CAP", "inner_tol", "NOT_LEARNED"]


@dataclasses.dataclass
class Outcome:
    """What a strategy ends with, from which :func:`gpvi.fit` builds its ``FitResult`` (the counts
    are the runner's).

    ``res`` is the last engine run's ``EngineResult`` (its state, VLB, convergence, gap and
    extras are the fit's); ``message`` its message with what the hyperparameter search did;
    ``trace`` the (K, 2) trace of the fit; ``rounds`` the L-BFGS-B iterations of the search;
    ``prior`` the prior cache of ``model`` on the training inputs, or None where the fit must
    compute it (the engine returned a model it learned); ``search`` why the hyperparameter
    search stopped (:attr:`gpvi.FitResult.search_message`).
    """

    model: object
    res: object
    message: str
    trace: np.ndarray
    rounds: int = 0
    prior: object = None
    search: str = ""


#: ``FitResult.search_message`` of a fit that learned no hyperparameters.
NOT_LEARNED = "no hyperparameters learned"


def choose(problem):
    """The strategy for ``problem``: from whether it learns hyperparameters, the engine record
    (``Engine.hyperparameters``) and whether the collapsed bound applies to the model."""
    if not problem.learn:
        return fixed
    kind = problem.engine.hyperparameters
    if kind == "own":
        return engine_owned
    if kind == "joint":
        return joint
    if problem.source is None and collapsed.applies(problem.model, problem.engine):
        return on_collapsed_bound
    return profile


def _engine_model(model, res):
    """``(model, learned)`` after an engine run: the model the engine learned (``extras["model"]``,
    taken out of the extras; ``ivsgpr`` learns θ and Z whatever ``learn_hyperparameters`` says) and
    True, or ``model`` and False."""
    if "model" in res.extras:
        return res.extras.pop("model"), True
    return model, False


def fixed(problem, runner, state, obj):
    """One engine run at the problem's hyperparameters."""
    obj, res, trace = runner(problem.model, state, problem.tol, obj=obj)
    model, learned = _engine_model(problem.model, res)
    search = f"learned by the engine ({problem.engine.name})" if learned else NOT_LEARNED
    return Outcome(model, res, res.message, trace, prior=None if learned else obj.prior, search=search)


def joint(problem, runner, state, obj):
    """One engine run that learns the hyperparameters with q (``hyperparameters=`` names)."""
    names = problem.learned_names()
    obj, res, trace = runner(problem.model, state, problem.tol, obj=obj, hyperparameters=names)
    model = res.extras.pop("model", problem.model)
    return Outcome(model, res, f"{res.message}; hyperparameters learned jointly by the engine", trace,
                   search=f"learned jointly with q by the engine: {res.message}")


def on_collapsed_bound(problem, runner, state, obj):
    """θ on the closed-form collapsed bound (:mod:`gpvi.fitting.collapsed`, Gaussian likelihood),
    one factorisation per evaluation; then one engine run, at the learned θ, for q."""
    p = problem
    names = p.learned_names()
    model, rounds, rows, evaluations, search = collapsed.learn(
        p.model, names, p.X, p.y, p.offset, tol=p.tol, max_rounds=p.max_rounds,
        log_prior=LogPrior(p.model, names, p.hyperprior),
        chunk_size=p.chunk_size, t0=runner.t0, callback=lambda i, v, s: runner.callback(i, v, s, shift=False),
        on_round=(lambda m, pr: runner.on_state(m, None, pr, shift=False)) if runner.watching else None)
    if runner.stopped:
        search = STOPPED
    obj, res, trace = runner(model, state, p.tol)  # (the Laplace start's objective is of the old θ)
    model, learned = _engine_model(model, res)
    # each evaluation of the collapsed bound is the optimal q in closed form: one iteration (and
    # one pass over the data) of an inner run that converged at once
    runner.counts.evaluations += evaluations
    runner.counts.iterations += evaluations
    message = f"{res.message}; hyperparameters: {rounds} L-BFGS-B iteration(s) on the collapsed bound"
    return Outcome(model, res, message, np.concatenate([rows, trace]), rounds,
                   None if learned else obj.prior, search=f"{search} (collapsed bound)")


def profile(problem, runner, state, obj):
    """L-BFGS-B on the profile bound (:func:`profile_search`) from the engine's optimum at the
    starting θ; then one engine run at the learned θ."""
    obj, res, trace = runner(problem.model, state, problem.tol, obj=obj)
    model, learned = _engine_model(problem.model, res)
    if runner.stopped:  # the hook stopped the first run: no search
        return Outcome(model, res, res.message, trace, prior=None if learned else obj.prior, search=STOPPED)
    names = problem.learned_names(model)
    check_known(model, names)
    model, rounds, search = profile_search(problem, runner, model, names, res.state,
                                           start=None if learned else (obj, res))
    obj, res, _ = runner(model, search["state"], problem.tol, **search["mode"])
    message = f"{res.message}; hyperparameters: {rounds} L-BFGS-B iteration(s)"
    return Outcome(model, res, message, np.asarray(search["rows"]).reshape(-1, 2), rounds,
                   None if learned else obj.prior, search=search.get("message", "") + softmax_shift_hint(model, names))


#: A learned kernel variance below this fraction of the largest of a softmax's latents is taken to
#: have run to the softmax's shift (:func:`softmax_shift_hint`).
VANISHED_VARIANCE = 1e-6


def softmax_shift_hint(model, names) -> str:
    """``"; …"`` naming the class to make a :class:`~gpvi.likelihoods.Softmax` ``reference`` when a
    search over per-class kernel variances drove one of them to zero (below
    :data:`VANISHED_VARIANCE` of the largest), else ``""``.  That latent's logit is then a constant:
    the search was crawling towards the model with that class as the reference, which
    ``Softmax(reference=c)`` with one latent fewer fits directly, in fewer rounds."""
    lik, latents = getattr(model, "likelihood", None), getattr(model, "latents", None)
    if not isinstance(lik, Softmax) or lik.reference is not None or not latents:
        return ""
    if not any(n.endswith("kernel.variance") for n in names):
        return ""
    var = [getattr(getattr(lat, "kernel", None), "variance", None) for lat in latents]
    if any(v is None or np.size(v) != 1 for v in var):
        return ""
    var = np.array([float(np.asarray(v)) for v in var])
    c = int(np.argmin(var))
    if not var[c] < VANISHED_VARIANCE * var.max():
        return ""
    return (f"; latent {c}'s kernel variance ran to {var[c]:.2g} ({var[c] / var.max():.1g} of the largest): "
            f"the softmax's shift; Softmax(num_classes={lik.num_classes}, reference={c}) with the other "
            f"{len(latents) - 1} latents fits this optimum directly, in fewer rounds")


def engine_owned(problem, runner, state, obj):
    """The engine's own hyperparameter driver (``Engine.learn``), with its own counts."""
    p = problem
    names = p.learned_names()
    if obj is None:
        obj = runner.objective(p.model)
    runner.start_clock()
    res, model, obj = p.engine.learn(obj, state, names, tol=p.tol, tol_nats=p.tol_nats, max_iter=p.max_iter,
                                     max_rounds=p.max_rounds, callback=runner.callback,
                                     on_state=runner.on_state if runner.watching else None, **p.options)
    runner.counts.evaluations += res.evaluations  # (its own totals; no fixed-point safeguards)
    runner.counts.iterations += res.iterations
    return Outcome(model, res, res.message, runner.shifted(res.trace),
                   int(res.extras.get("lbfgsb_steps", 0)), obj.prior,
                   search=f"the {p.engine.name} engine's own driver: {res.message}")


# ---- the profile search ------------------------------------------------------------------------

def neg_vlb(theta, model, X, chunks, state):
    """−VLB in the unconstrained hyperparameters ``theta`` with the whitened ``state`` fixed."""
    return -vlb_in_hyperparameters(unflatten_params(model, theta), X, chunks, state)


neg_vlb_and_grad = jit(jax.value_and_grad(neg_vlb))


def neg_envelope(theta, model, prior, chunks, state, proj, blocks, likelihood):
    """−VLB of a full GP in ``theta`` with q held fixed over the training latents
    (:func:`gpvi.objective.vlb_envelope`)."""
    return -vlb_envelope(unflatten_params(model, theta), prior, chunks, state, blocks, proj, likelihood)


neg_envelope_grad = jit(jax.grad(neg_envelope), static_argnames=("blocks", "likelihood"))


def neg_sparse_envelope(theta, model, chunks, state):
    """−VLB of a sparse GP in ``theta`` with q held fixed over the inducing values
    (:func:`gpvi.objective.sparse_envelope`)."""
    return -sparse_envelope(unflatten_params(model, theta), chunks, state)


neg_sparse_envelope_and_grad = jit(jax.value_and_grad(neg_sparse_envelope))


def neg_laplace(theta, model, X, chunks, mode, clip=False):
    """−(Laplace log marginal likelihood) in ``theta`` at the posterior ``mode``."""
    return -laplace_log_marginal_at(unflatten_params(model, theta), X, chunks, mode, clip)


neg_laplace_and_grad = jit(jax.value_and_grad(neg_laplace), static_argnames=("clip",))


#: Loosest relative tolerance of the inner engine runs of the hyperparameter search (see
#: :func:`profile_search`).  Capped at tol before, the early runs converged q to 1e-7 of the
#: bound while the rounds still gained tens of nats: USPS 4-7-9 with one learned kernel shared by
#: three softmax latents took 94 passes, 74 with this cap (same optimum to 1e-8 relative).  A
#: looser fraction of the gain (1e-2 instead of 1e-3) cost more L-BFGS-B rounds than it saved.
INNER_TOL_CAP = 1e-2


def inner_tol(gain, vlb, tol, strict):
    """Relative tolerance of the inner runs when a round of the search gains ``gain`` nats at a
    bound of ``vlb``: a gap of 1e-3 of the gain, within [strict, max(tol, INNER_TOL_CAP)]."""
    return min(max(tol, INNER_TOL_CAP), max(strict, 1e-2 * gain / max(1.0, abs(vlb))))


def profile_search(problem, runner, model, names, state, start=None):
    """L-BFGS-B on the profile bound in the parameters ``names`` of ``model``, from the engine's
    optimum ``state``; returns ``(model, iterations, {"rows": trace rows, "state": best state,
    "message": why the search stopped, "mode": the engine options of the next run})`` (the
    message as :func:`gpvi.fitting.lbfgs.stop_message` writes it; the mode ``{"sequential":
    True}`` once an fpi run of the search has switched to the paper's order, else ``{}``).

    Every inner engine run adds to ``runner.counts``, so that the fit reports totals over the
    search.  With the Laplace engine (``Engine.evidence == "laplace"``) the objective is the
    Laplace log marginal likelihood, its gradient by the one-Newton-step construction of
    :func:`gpvi.engines.laplace.laplace_log_marginal_at`; the trace still records the VLB of each
    accepted point's Laplace posterior.  ``start``: the ``(objective, EngineResult)`` of the
    engine run at ``model`` that produced ``state``, if any, which then stands for the search's
    first evaluation (instead of another run from its optimum).
    """
    X, y, offset, tol, t0 = problem.X, problem.y, problem.offset, problem.tol, runner.t0
    laplace = problem.engine.evidence == "laplace"
    blockwise = problem.source is not None
    theta0 = flatten_params(model, names)
    flat0, unravel = ravel_params(theta0)  # NumPy: no eager JAX programs for a few numbers
    chunks = None if blockwise else make_chunks(X, y, offset, problem.chunk_size, bucketed=pads_rows(model, X.shape[0]))
    # padded rows share compiled programs (the block-wise path has its own fixed block shapes)
    Xj = as_device_array(X) if blockwise else prior_inputs(model, as_device_array(X), chunks)
    # Inner runs need only be as exact as the search's progress requires: their gap
    # threshold is 1e-3 of the bound's last gain between L-BFGS-B iterations (of the gain the
    # first step predicts in the first round), with a relative tol between tol·1e-3 (near the
    # end) and INNER_TOL_CAP (early, while rounds gain many nats).  A fixed tol·1e-3 made fpi crawl
    # through hundreds of slowly contracting iterations per evaluation once the kernel variance
    # grew (banana, 1 300 rows, sparse logistic: 3 117 passes, two runs stopped at max_iter).
    strict = max(tol * 1e-3, 1e-13)
    # Full GPs: the hypergradient of the profile bound with q held fixed in function space
    # (gpvi.objective.vlb_envelope); the likelihood's parameters then need one pass of the data.
    envelope = not laplace and not blockwise and full_gp_latents(model)
    # One sparse GP: the hypergradient with q held fixed over the inducing values
    # (gpvi.objective.sparse_envelope), cheaper than through the whitened projections.
    sparse = not laplace and not blockwise and type(model) is SparseGP
    lik_learned = any(n.split(".")[0] == "likelihood" for n in names)
    inner = {"tol": tol}
    log_prior = LogPrior(model, names, problem.hyperprior)  # (empty: no prior)
    memo = {"state": state, "best": (-np.inf, None, state), "recent": [], "mode": {}}
    # fpi's order: once a run has switched to the paper's order (rejected or slow joint steps),
    # the next runs start there (nearby θ, the same posterior's shape) instead of paying for the
    # same rejected joint steps again
    can_start_sequential = "sequential" in problem.engine.options and "sequential" not in problem.options
    given = {"run": start}
    rows = []
    vlbs = {}  # VLB of the Laplace posterior at each evaluated point (laplace only)

    # Names ending in [*] (an array's elements tied, the default estimators' isotropic stage): the
    # hypergradient is taken in the untied names, the tied value spread over its array, and
    # summed back (the chain rule) — the compiled program of the ARD stage that follows, not
    # one more (each is traced, lowered and compiled or loaded in every fresh process).
    spread = {n: np.shape(parameter_value(model, matching_parameters(model, n)[0]))
              for n in names if shares_elements(n)}

    def untie(theta):
        return {untied_name(n): (np.full(spread[n], v) if n in spread else v) for n, v in theta.items()}

    def retie(g):
        return {n: (np.sum(np.asarray(g[untied_name(n)])) if n in spread else g[n]) for n in names}

    def fun(x):
        theta = unravel(x)
        mdl = unflatten_params(model, theta)
        wide = untie(theta) if spread else theta
        try:
            if given["run"] is not None and np.array_equal(x, x0):  # the run that gave the start
                (new_obj, res), given["run"] = given["run"], None
            else:
                prev = memo.get("obj")
                begin = memo["state"] if prev is None else lambda o: warmstart.carry(prev, o, memo["state"])
                new_obj, res, _ = runner(mdl, begin, inner["tol"], quiet=True, **memo["mode"])
        except np.linalg.LinAlgError:
            return np.inf, np.zeros_like(x)
        if not np.isfinite(res.vlb):
            return np.inf, np.zeros_like(x)
        if laplace:
            val, g = neg_laplace_and_grad(wide, model, Xj, chunks, res.state.mean,
                                          clip=res.extras.get("hessian") == "clipped")
            vlbs[np.asarray(x).tobytes()] = res.vlb
        elif blockwise:  # the same value and gradient, block by block on the fit's executor
            val, g = new_obj.neg_vlb_and_grad(wide, model, res.state)
        elif sparse:
            val, g = neg_sparse_envelope_and_grad(wide, model, chunks, res.state)
        elif envelope:  # full GPs: q held fixed over the training latents (no Cholesky derivative)
            val = -res.vlb
            g = neg_envelope_grad(wide, model, new_obj.prior, new_obj.chunks, res.state, new_obj.proj,
                                  new_obj.blocks, lik_learned)
        else:
            val, g = neg_vlb_and_grad(wide, model, Xj, chunks, res.state)
        g = ravel_values(retie(g) if spread else g)
        val, g, lp = log_prior.penalise(theta, val, g)  # maximise bound + log p(θ)
        if not np.isfinite(val) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)
        memo["state"], memo["obj"] = res.state, new_obj  # warm start for the next evaluation
        if can_start_sequential and "sequential_from" in res.extras:
            memo["mode"] = {"sequential": True}
        memo["recent"] = [(np.array(x), res.state)] + memo["recent"][:3]  # for on_state at a round's point
        score = -val if laplace else res.vlb + lp
        if score > memo["best"][0]:
            memo["best"] = (score, np.array(x), res.state)
        return val, g

    def traced(x, f):  # the trace records the VLB (f also holds −log p(θ) under a hyperprior)
        if laplace:
            return vlbs.get(np.asarray(x).tobytes(), -f)
        return -f - log_prior.value(unravel(x))

    def record(intermediate_result):
        x = intermediate_result.x
        rows.append((time.perf_counter() - t0, traced(x, float(intermediate_result.fun))))
        inner["tol"] = inner_tol(abs(rows[-1][1] - rows[-2][1]), rows[-1][1], tol, strict)
        k = len(rows) - 1
        runner.callback(k, rows[-1][1], rows[-1][0], shift=False)
        # the engine's optimum at the round's point (L-BFGS-B need not have evaluated it last)
        at_x = next((s for xe, s in memo["recent"] if np.array_equal(xe, x)), memo["state"])
        if runner.watching and runner.on_state(unflatten_params(model, unravel(x)), at_x,
                                               Progress(k, rows[-1][1], rows[-1][0], round=k), shift=False):
            raise StopIteration  # (SciPy ends the search with the point of this round)

    x0 = np.asarray(flat0)
    f0, g0 = fun(x0)
    first = {"x": x0.copy(), "out": (f0, g0)}
    if np.isfinite(f0):
        # L-BFGS-B's first trial step has unit length along −g: it predicts a gain of |g| nats,
        # the scale for the inner runs of the first round (as the last gain is for later ones)
        inner["tol"] = inner_tol(float(np.linalg.norm(g0)), -f0, tol, strict)

    def fun_once(x):
        # L-BFGS-B's first call is at x0, which was just evaluated (an inner fit and a
        # hypergradient: ~10 s on USPS, three coupled 1233-point latents): answer it from there.
        if first["x"] is not None and np.array_equal(x, first["x"]):
            first["x"] = None
            return first["out"][0], np.array(first["out"][1])
        return fun(x)

    if not np.isfinite(f0):
        # Nothing to start the search from; returning the start with "converged" would hide it.
        raise ValueError("the bound or its gradient in the hyperparameters is not finite at the starting "
                         f"hyperparameters {names}; check their values (or fit without learning them)")
    rows.append((time.perf_counter() - t0, traced(x0, f0)))
    import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
    out = scipy.optimize.minimize(fun_once, x0, jac=True, method="L-BFGS-B", callback=record,
                                  options=dict(maxiter=problem.max_rounds, ftol=tol, gtol=1e-9, maxcor=memory(x0.size)))
    best_vlb, best_x, best_state = memo["best"]
    message = STOPPED if runner.stopped else stop_message(out, problem.max_rounds)
    if best_x is None:
        return model, int(out.nit), {"rows": rows, "state": state, "message": message, "mode": memo["mode"]}
    learned = unflatten_params(model, unravel(best_x))
    if laplace:
        # On (nearly) separable data the Laplace evidence is largest where the approximation is
        # useless (a huge latent scale, probabilities near 0.5): refuse such a maximum.
        check_learned_hyperparameters(learned, names, best_vlb, vlbs[best_x.tobytes()], X.shape[0])
    return learned, int(out.nit), {"rows": rows, "state": best_state, "message": message, "mode": memo["mode"]}
