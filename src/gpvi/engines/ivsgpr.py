"""iVSGPR: incremental variational sparse GP regression (Cheng & Boots 2016).

Stochastic mirror ascent on the posterior ``q(f)`` of a sparse GP with a Gaussian likelihood,
one minibatch of ``B`` rows per iteration (from :mod:`gpvi.stream`), learning the inducing inputs ``Z``, the inducing
functions' lengthscales and the hyperparameters ``θ`` online.  Iteration ``t`` with step size
``γ_t`` solves the tempered sparse-GPR subproblem (their Eq. 16)

    max_q  γ_t [ (N/B) Σ_{i∈batch} E_q log p(y_i | f_i) − KL(q ‖ p) ] − (1 − γ_t) KL(q ‖ q_t)

over ``q = p(f | u_Z') q(u_Z')``, i.e. over ``(θ, Z', l')`` and ``q(u)``.

**Whitened coordinates.**  The state is gpvi's ``State(mean, chol)`` of ``v = L⁻¹u`` with
``L = chol K_uu``, and the kernel is :class:`~gpvi.kernels.MultiscaleRBF` (an ``RBF`` kernel is
converted at the start, with every inducing lengthscale equal to the kernel's, which is the
same model).  Its inducing functions ``ψ_z`` depend on ``(z, l_z)`` only, not on ``θ``, so the
whitened basis ``Ψ̄ = Ψ L_G⁻ᵀ`` (``G = ψ_Zᵀψ_Z``, ``K_uu = s² G``) is a fixed orthonormal set of
functions for given ``(Z, l)``: ``q`` is ``N(Ψ̄ m, I + Ψ̄ (V − I) Ψ̄ᵀ)`` in the RKHS and
``f(x) = a_xᵀ v + …`` with gpvi's usual ``a_x = L⁻¹ k_Zx``.  Two posteriors on different
inducing sets meet through ``C = Ψ̄_tᵀ Ψ̄' = L_Gt⁻¹ G(Z_t, Z') L_G'⁻ᵀ``, and with a Gaussian
likelihood the subproblem is maximised over ``q(u)`` in closed form: in natural parameters

    Λ = γ (I + (N/B) Σ a_i a_iᵀ / σ²) + (1 − γ) (I − CᵀC + Cᵀ V_t⁻¹ C),
    Λ m = γ (N/B) Σ a_i (y_i − μ) / σ² + (1 − γ) Cᵀ V_t⁻¹ m_t,

the mirror-ascent (natural-parameter averaging) step after projecting ``q_t`` onto the new
basis.  With ``C = I`` (``Z``, ``l`` unchanged) it is the stochastic natural-gradient step of
Hensman et al. (2013), VSGPR-svi in the paper's terms.  The value at that optimum, a function
of ``(θ, Z', l')`` alone (written out in :func:`_collapsed`), is maximised by L-BFGS-B with at
most ``subproblem_evals`` evaluations (iVSGPR5, iVSGPR10), or until its relative change is below
1e-5 (``"ada"``, at most 100 evaluations, iVSGPRada); its gradient is by autodiff.  The paper
used nonlinear conjugate gradients (GPML's ``minimize``) with the same evaluation budgets.

Step sizes: ``γ_t = 1 / (1 + √t)``, t = 1, 2, … (the paper's), or a constant in (0, 1].

The per-iteration trace holds the minibatch estimate ``(N/B) Σ E_i − KL`` of the VLB at the new
state (a full-data VLB per iteration would cost more than the step); the result's ``vlb`` is the
full-data VLB of the final model and state.  Minibatches come from :func:`gpvi.stream.from_arrays`
over the in-memory rows, epoch after epoch, each epoch a fresh seeded permutation; the last batch
of an epoch is padded and masked, and its sums are scaled by N / (its real rows).
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from gpvi._module import flatten_params, unflatten_params
from gpvi.data.stream import from_arrays
from gpvi.kernels import RBF, MultiscaleRBF
from gpvi.likelihoods import Gaussian
from gpvi.models.base import SparseGP, cholesky, inverse_factor, kl_standard_normal
from gpvi.objective import Objective, State
from gpvi.engines.registry import Engine
from gpvi.engines._common import STOPPED, Clock, EngineResult, stopped_at_start
from gpvi.engines._stochastic import paper_step_size
from gpvi._compile import jit

__all__ = ["run", "minibatches", "step_size_at", "prepare_model"]

ADA_MAX_EVALS = 100  # the cap of the paper's Fig. 1b
ADA_RTOL = 1e-5


def minibatches(X, y, offset, batch_size: int, seed: int = 0):
    """Endless :class:`gpvi.stream.Batch` es of ``batch_size`` rows from in-memory arrays, epoch
    after epoch of :func:`gpvi.stream.from_arrays` (a fresh seeded permutation per epoch; the
    last batch of an epoch is padded and masked)."""
    source = from_arrays(X, y, offset)
    for epoch in itertools.count():
        yield from source.minibatches(batch_size, epoch=epoch, seed=seed)


def step_size_at(schedule, t: int) -> float:
    """γ_t of step ``t`` ≥ 1: ``"paper"`` → :func:`gpvi.engines._stochastic.paper_step_size`
    (1/(1 + √t), as in ``sfp``); a number → that constant."""
    return paper_step_size(t) if schedule == "paper" else float(schedule)


def prepare_model(model):
    """The model with a :class:`MultiscaleRBF` kernel whose inducing lengthscales are an
    (M, D) array (an ``RBF`` kernel or ``inducing_lengthscale=None`` becomes the kernel's
    lengthscales, which leaves the model unchanged); ValueError for what iVSGPR cannot run."""
    if not isinstance(model, SparseGP):
        raise ValueError(f"engine 'ivsgpr' needs a gpvi.SparseGP model, got {type(model).__name__}")
    if not isinstance(model.likelihood, Gaussian):
        raise ValueError("engine 'ivsgpr' supports only the Gaussian likelihood (sparse GP regression), got "
                         f"{type(model.likelihood).__name__}; use engine 'fpi' for other likelihoods")
    k = model.kernel
    if type(k) not in (RBF, MultiscaleRBF):
        raise ValueError("engine 'ivsgpr' needs an RBF or MultiscaleRBF kernel (its inducing functions must not "
                         f"depend on the hyperparameters), got {type(k).__name__}")
    if k.active_dims is not None:
        raise ValueError("engine 'ivsgpr' needs a kernel on all input columns (its multiscale inducing functions "
                         f"do not select columns), got active_dims={k.active_dims}; select the columns of X instead")
    Z = jnp.asarray(model.inducing)
    M, D = Z.shape
    ls = np.broadcast_to(np.asarray(k.lengthscale, np.float64), (D,))
    lz = np.broadcast_to(ls if getattr(k, "inducing_lengthscale", None) is None
                         else np.asarray(k.inducing_lengthscale, np.float64), (M, D)).copy()
    kern = MultiscaleRBF(variance=k.variance, lengthscale=k.lengthscale, inducing_lengthscale=lz)
    return model.replace(kernel=kern)


class _Prev(NamedTuple):
    """The current posterior q_t, as the subproblem needs it."""

    Z: jax.Array  # (M, D) inducing inputs
    lz: jax.Array  # (M, D) inducing lengthscales
    LG: jax.Array  # (M, M) chol of the variance-free Gram ψ_Zᵀψ_Z + jitter·I (as the model jitters)
    jitter: jax.Array  # () the jitter added to that Gram
    mean: jax.Array  # (M,)
    chol: jax.Array  # (M, M) lower, V_t = chol cholᵀ
    Pt: jax.Array  # (M, M) chol⁻¹ (so V_t⁻¹ = Ptᵀ Pt)
    LGi: jax.Array  # (M, M) LG⁻¹
    E: jax.Array  # (M, M) V_t⁻¹ − I
    vm: jax.Array  # (M,) V_t⁻¹ m_t
    old: jax.Array  # () tr(V_t⁻¹ − I) − M + m_tᵀV_t⁻¹m_t + log det V_t, the fixed part of KL(q‖q_t)


@jit
def _prev(model, state: State) -> _Prev:
    Z = jnp.asarray(model.inducing)
    _, LG, added, lz = _gram_chol(model)
    M = Z.shape[0]
    eye = jnp.eye(M, dtype=Z.dtype)
    Pt = solve_triangular(state.chol, eye, lower=True)
    LGi = solve_triangular(LG, eye, lower=True)
    Pm = Pt @ state.mean
    old = jnp.sum(Pt ** 2) - 2 * M + Pm @ Pm + 2.0 * jnp.sum(jnp.log(jnp.abs(jnp.diag(state.chol))))
    return _Prev(Z, lz, LG, added, state.mean, state.chol, Pt, LGi, Pt.T @ Pt - eye, Pt.T @ Pm, old)


def _gram_chol(model):
    """``(G, chol(G + j·I), j, l_Z)`` for the variance-free Gram ``G = ψ_Zᵀψ_Z`` of the
    inducing functions, jittered exactly as ``model.prior_cache`` jitters ``K_uu = s² G``
    (relative jitter: the same j), so that ``√s² · chol`` is the model's own factor.  The
    factor is of ``G`` held constant: a derivative goes through ``G`` (see :func:`_natural`)."""
    Z = jnp.asarray(model.inducing)
    lz, _ = model.kernel._inducing_l(Z)
    G = model.kernel.inducing_gram(Z, lz, Z, lz)
    LG, added = cholesky(jax.lax.stop_gradient(G), model.jitter)
    return G, LG, added, lz


def _natural(model, prev: _Prev, batch, scale, gamma):
    """``(Λ, Λm, pieces)`` of the subproblem's optimal q(u) at ``model``'s θ, Z, l, for a
    minibatch ``batch = (X (B, D), y, offset, mask (B,))`` (padding rows have mask 0)."""
    Xb, yb, ob, mask = batch
    kern, lik = model.kernel, model.likelihood
    Z = jnp.asarray(model.inducing)
    M = Z.shape[0]
    eye = jnp.eye(M, dtype=Z.dtype)
    G, LG, added, lz = _gram_chol(model)
    # L⁻¹ of the model's factor L = √s²·LG once, so the projections and the cross-basis map
    # below are matrix products (XLA:CPU's triangular solves and their gradients cost several
    # times a product of the same size at M = 512); its derivative in G is in closed form, so
    # neither the factorisation nor the triangular inverse is differentiated.
    LGi = inverse_factor(G + added * eye, LG)
    Ti = LGi / jnp.sqrt(kern.variance)
    At, b, c = model.project_many(Ti, Xb)
    At, c = At * mask, c * mask  # padding rows drop out of every sum
    # C = Ψ̄_tᵀ Ψ̄' : old whitened basis against the new one (variance-free, so θ-independent).
    # The jitter j·I of each Gram is a white component of each inducing function that stays
    # with its index as the function moves (ψ̃_i = ψ_i + √j e_i), so it adds √(j_t j')·I to the
    # cross-Gram: C is exactly I when nothing moved, and continuous in Z' and l'.
    Gx = kern.inducing_gram(prev.Z, prev.lz, Z, lz) + jnp.sqrt(prev.jitter * added) * eye
    C = prev.LGi @ (Gx @ LGi.T)
    EC = prev.E @ C  # Cᵀ V_t⁻¹ C − CᵀC = Cᵀ E C
    r = (yb - b - ob) * mask
    w = scale / lik.variance
    Lam = gamma * (eye + w * (At @ At.T)) + (1.0 - gamma) * (eye + C.T @ EC)
    Lam = 0.5 * (Lam + Lam.T)
    h = gamma * w * (At @ r) + (1.0 - gamma) * (C.T @ prev.vm)
    return Lam, h, (At, c, b, r, C, EC)


def _collapsed(model, prev: _Prev, batch, scale, gamma):
    """γ × the subproblem objective at its optimal q(u), a function of the model's θ, Z, l.

    With β = (1 − γ)/γ and the subproblem J = (N/B) Σ E_i − KL(q‖p) − β KL(q‖q_t), J is a
    concave quadratic in (m, V) whose maximum is
    ``const_E + M/2 − (β/2)[tr(D_t (I − CCᵀ)) − M + m_tᵀV_t⁻¹m_t + log det V_t]
    + ((1+β)/2)[hᵀΛ⁻¹h − M − log det Λ]`` with ``D_t = V_t⁻¹ − I``,
    ``const_E = −(N/2) log 2πσ² − (N/B) Σ (r_i² + c_i)/(2σ²)``.  At γ = 1 this is Titsias's
    collapsed bound of the (N/B-weighted) minibatch.
    """
    lik = model.likelihood
    M = prev.mean.shape[0]
    Lam, h, (At, c, b, r, C, EC) = _natural(model, prev, batch, scale, gamma)
    RL = jnp.linalg.cholesky(Lam)
    u = solve_triangular(RL, h, lower=True)
    logdet_lam = 2.0 * jnp.sum(jnp.log(jnp.diag(RL)))
    B = jnp.sum(batch[3])
    const_e = -0.5 * scale * B * jnp.log(2.0 * jnp.pi * lik.variance) \
        - 0.5 * scale / lik.variance * jnp.sum(r * r + c)
    old = prev.old - jnp.sum(C * EC)  # tr(D_t (I − CCᵀ)) − M + m_tᵀV_t⁻¹m_t + log det V_t
    return gamma * (const_e + 0.5 * M) - 0.5 * (1.0 - gamma) * old + 0.5 * (u @ u - M - logdet_lam)


def _neg_collapsed(theta, base, prev, batch, scale, gamma):
    return -_collapsed(unflatten_params(base, theta), prev, batch, scale, gamma)


_neg_collapsed_and_grad = jit(jax.value_and_grad(_neg_collapsed))


@jit
def _update(model, prev: _Prev, batch, scale, gamma):
    """The subproblem's optimal q(u) as a State, and the minibatch VLB estimate there."""
    Xb, yb, ob, mask = batch
    Lam, h, (At, c, b, r, _, _) = _natural(model, prev, batch, scale, gamma)
    M = h.shape[0]
    RL = jnp.linalg.cholesky(Lam)
    mean = cho_solve((RL, True), h)
    # chol of V = Λ⁻¹, lower: with J the reversal, JΛJ = R̃R̃ᵀ gives V = (J R̃⁻ᵀ J)(J R̃⁻ᵀ J)ᵀ
    Rr = jnp.linalg.cholesky(Lam[::-1, ::-1])
    chol = solve_triangular(Rr, jnp.eye(M, dtype=h.dtype), lower=True).T[::-1, ::-1]
    m_f = mean @ At + b + ob
    v_f = c + jnp.sum((chol.T @ At) ** 2, axis=0)
    E = model.likelihood.expected_log_prob(yb, m_f, v_f)
    vlb = scale * jnp.sum(E * mask) - kl_standard_normal(mean, chol)
    return State(mean, chol), vlb


def _check_options(batch_size, subproblem_evals, step_size_, N, seed):
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) \
            or not 1 <= batch_size <= N:
        raise ValueError(f"batch_size must be an int in [1, N = {N}], got {batch_size!r}")
    if not (subproblem_evals == "ada" or (isinstance(subproblem_evals, (int, np.integer))
                                          and not isinstance(subproblem_evals, (bool, np.bool_))
                                          and subproblem_evals >= 0)):
        raise ValueError("subproblem_evals must be an int ≥ 0 (function evaluations per minibatch; 0 skips "
                         f"the (θ, Z) subproblem) or 'ada', got {subproblem_evals!r}")
    if not (step_size_ == "paper" or (isinstance(step_size_, (int, float, np.floating))
                                      and not isinstance(step_size_, (bool, np.bool_))
                                      and 0.0 < step_size_ <= 1.0)):
        raise ValueError(f"step_size must be 'paper' (1/(1+√t)) or a number in (0, 1], got {step_size_!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")


def run(objective: Objective, state: State, *, tol: float = 1e-6, tol_nats: float | None = None,
        max_iter: int = 500, callback=None, batch_size: int | None = None, subproblem_evals="ada",
        ada_max_evals: int = ADA_MAX_EVALS, step_size="paper", learn="all", seed: int = 0,
        on_state=None, hyperparameters=None) -> EngineResult:
    """Run ``max_iter`` iVSGPR steps (one minibatch each) from ``state``.

    Parameters
    ----------
    objective : the :class:`~gpvi.objective.Objective` of a :class:`~gpvi.models.SparseGP` with a
        Gaussian likelihood and an ``RBF`` or ``MultiscaleRBF`` kernel on the training data.
    state : q(u) to start from (whitened, for ``objective.model``'s inducing inputs).
    tol, tol_nats : unused (a stochastic run has no convergence certificate; it always runs
        ``max_iter`` steps).
    batch_size : rows per minibatch ``B`` (1 ≤ B ≤ N); default min(2048, N).
    subproblem_evals : most function evaluations of the (θ, Z, l) subproblem per minibatch
        (5 → iVSGPR5, 10 → iVSGPR10); ``"ada"`` (iVSGPRada): until the relative change is below
        1e-5, at most ``ada_max_evals`` (100, the paper's cap); ``0``: no subproblem, θ and Z stay fixed and only q(u) moves (the
        SVI step of Hensman et al. 2013, VSGPR-svi).
    step_size : ``"paper"`` (γ_t = 1/(1+√t)) or a constant in (0, 1].
    learn : ``"all"`` (every learnable parameter of the model, inducing inputs and inducing
        lengthscales included) or a list of dotted parameter names optimised in the subproblem.
    seed : of the minibatch permutations.
    on_state : ``on_state(model, state, progress)`` after every step, with the model learned so
        far (e.g. for a test error; :class:`~gpvi.engines._common.Progress`); returning True
        ends the run there.
    hyperparameters : the names :func:`gpvi.fit` passes for ``learn_hyperparameters`` (with
        ``learn_inducing``); when given they replace ``learn``.

    Notes
    -----
    ``extras`` of the result: ``"model"`` (the learned model; its full-data VLB is the result's
    ``vlb``) and ``"subproblem_evaluations"`` (per step).
    """
    model = prepare_model(objective.model)
    N = objective.num_data
    batch_size = min(2048, N) if batch_size is None else batch_size
    _check_options(batch_size, subproblem_evals, step_size, N, seed)
    if isinstance(ada_max_evals, (bool, np.bool_)) or not isinstance(ada_max_evals, (int, np.integer)) \
            or ada_max_evals < 1:
        raise ValueError(f"ada_max_evals must be an int ≥ 1, got {ada_max_evals!r}")
    known = [n for n, t in model.transforms().items() if t != "fixed"]
    if hyperparameters is not None:
        learn = list(hyperparameters)
    if isinstance(learn, str) and learn == "all":
        names = known
    elif isinstance(learn, (list, tuple)) and all(isinstance(n, str) for n in learn):
        bad = sorted(set(learn) - set(known))
        if bad:
            raise ValueError(f"learn names unknown parameters {bad}; the model's learnable ones are {sorted(known)}")
        names = list(learn)
    else:
        raise ValueError(f"learn must be 'all' or a list of parameter names such as ['inducing'], got {learn!r}")

    n = objective.chunks.mask.shape[1]
    X = np.asarray(objective.X)
    y = np.asarray(objective.chunks.y).reshape(-1)[:N]
    off = np.asarray(objective.chunks.offset).reshape(-1)[:N]
    stream = minibatches(X, y, off, int(batch_size), int(seed))

    clock = Clock(callback, on_state, model)
    if clock.tick(objective.vlb(state), 0, state):
        return stopped_at_start(objective, state, clock.rows[0][1], clock, {"model": model, "subproblem_evaluations": []})
    evals_per_step = []
    steps = 0
    do_sub = bool(names) and (subproblem_evals == "ada" or subproblem_evals > 0)
    for t in range(1, int(max_iter) + 1):
        gamma = step_size_at(step_size, t)
        b = next(stream)
        batch = tuple(jax.device_put((b.X, b.y, b.offset, b.mask)))  # (jnp.asarray: a staging program per shape)
        scale = N / float(b.rows)  # unbiased for the padded last batch of an epoch too
        prev = _prev(model, state)
        used = 0
        if do_sub:
            model, used = _solve_subproblem(model, names, prev, batch, scale, gamma, subproblem_evals,
                                            ada_max_evals)
        evals_per_step.append(used)
        state, vlb_b = _update(model, prev, batch, scale, gamma)
        if not (np.all(np.isfinite(np.asarray(state.chol))) and np.isfinite(float(vlb_b))):
            raise FloatingPointError(f"ivsgpr: the posterior became non-finite at step {t} (γ = {gamma:.3g})")
        clock.model, steps = model, t
        if clock.tick(vlb_b, t, state):
            break
    final = Objective(model, X, y, off, chunk_size=n)
    vlb = float(final.vlb(state))
    message = (f"{STOPPED} after {steps} minibatch steps of {int(batch_size)} rows" if clock.stopped else
               f"ran max_iter={int(max_iter)} minibatch steps of {int(batch_size)} rows (stochastic mirror "
               "ascent has no convergence certificate)")
    extras = {"model": model, "subproblem_evaluations": evals_per_step}
    return EngineResult(state, vlb, steps, False, message, clock.trace,
                        evaluations=objective.num_evaluations + final.num_evaluations, extras=extras)


class _BudgetSpent(Exception):
    """The subproblem's evaluation budget is used up (ends the L-BFGS-B run)."""


def _solve_subproblem(model, names, prev, batch, scale, gamma, evals, ada_max_evals):
    """L-BFGS-B on the collapsed subproblem in the named parameters from the current ones, with
    at most ``evals`` (or ``ada_max_evals``) evaluations; returns the model at the best point
    evaluated and the number of evaluations."""
    theta0 = flatten_params(model, names)
    x0, unravel = jax.flatten_util.ravel_pytree(theta0)
    best = {"f": np.inf, "x": None}
    count = [0]
    budget = ada_max_evals if evals == "ada" else int(evals)

    def fun(x):
        if count[0] >= budget:
            # L-BFGS-B checks maxfun only between iterations; a line search could overrun it
            raise _BudgetSpent
        count[0] += 1
        f, g = _neg_collapsed_and_grad(unravel(jnp.asarray(x)), model, prev, batch, scale, gamma)
        f = float(f)
        g = np.asarray(jax.flatten_util.ravel_pytree(g)[0])
        if not np.isfinite(f) or not np.all(np.isfinite(g)):
            return np.inf, np.zeros_like(x)
        if f < best["f"]:
            best["f"], best["x"] = f, np.array(x)
        return f, g

    if evals == "ada":
        opts = dict(maxfun=ada_max_evals, maxiter=ada_max_evals, ftol=ADA_RTOL, gtol=0.0)
    else:
        opts = dict(maxfun=int(evals), maxiter=int(evals), ftol=0.0, gtol=0.0)
    try:
        import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
        scipy.optimize.minimize(fun, np.asarray(x0), jac=True, method="L-BFGS-B", options=opts)
    except _BudgetSpent:
        pass
    if best["x"] is None:
        return model, count[0]
    return unflatten_params(model, unravel(jnp.asarray(best["x"]))), count[0]


ENGINE = Engine("ivsgpr", run, "minibatch stochastic mirror ascent learning hyperparameters and inducing inputs online (Cheng & Boots 2016; sparse GP, Gaussian likelihood)", data="minibatch", hyperparameters="joint")
