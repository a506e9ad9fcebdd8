"""Mixture-of-Gaussians posteriors for full GPs (Nguyen & Bonilla 2014, §3.1 and §3.4: MIX, MIX2),
with one latent function or several (a :class:`gpvi.MultiLatent` of full GPs, e.g. softmax).

The variational posterior over the latent values ``f`` at the N training inputs is an equally
weighted mixture of K Gaussians with *diagonal* covariances,

    q(f) = (1/K) Σ_k N(f | m_k, diag s_k),

so each observation's marginal under component k is ``N(m_ki, s_ki)`` and the bound is

    L = (1/K) Σ_k Σ_i E_{N(m_ki, s_ki)}[log p(y_i | f)]          (expected log-likelihood)
        + E_q[log p(f)]                                            (closed form, the paper's Eq. 6)
        + H_lb[q],                                                 (entropy lower bound, Eq. 5)

    E_q[log p(f)] = −1/(2K) Σ_k [N log 2π + log|K| + (m_k−μ)ᵀK⁻¹(m_k−μ) + Σ_i s_ki (K⁻¹)_ii],
    H_lb = −(1/K) Σ_k log[(1/K) Σ_l N(m_k | m_l, diag(s_k + s_l))]  ≤  H[q]   (Jensen).

With Q latent functions (a :class:`~gpvi.models.multilatent.MultiLatent` of full GPs) each component is
a diagonal Gaussian over all Q·N latent values, ``f_i = (f_i1, …, f_iQ)`` has the marginal
``N(m_ki, diag s_ki)`` under component k, the cross-entropy is the sum over latents of the term
above (each with its own K_q and μ_q), and the entropy bound runs over all Q·N dimensions.

For K = 1 the exact entropy ``½ Σ_i log(2πe s_i)`` is used instead of the bound (which would be
``½ Σ_i log(4π s_i)``, looser by ``½ (1 − log 2)`` nats per latent value).  The expectations are
those of the likelihood (closed forms, Gauss–Hermite, or Monte Carlo with :class:`gpvi.MonteCarlo`).

Everything is optimised by L-BFGS on ``(m, log s)`` — and, with ``learn_hyperparameters``, the
unconstrained kernel/likelihood/mean parameters jointly — with gradients by autodiff through the
expectations (the gradient engine's method; the fixed-point engines need a Gaussian q).

``gpvi.fit(model, X, y, posterior="mog", components=K)`` calls :func:`fit_mog` and returns a
:class:`MoGResult`, a :class:`~gpvi.fitting.posterior.FitResult` like every result of
:func:`gpvi.fit`: the same ``predict_f`` / ``predict_y`` / ``predict_proba`` /
``log_predictive_density`` (of the mixture; ``predict_f`` gives its mean and variance,
:meth:`MoGResult.predict_components` each component's), the same ``trace``, ``callback`` and
progress bar, and it is saved and loaded by :func:`gpvi.io.save` / :func:`gpvi.io.load`.
"""
from __future__ import annotations

import dataclasses
import numbers
import time

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular  # noqa: F401

from gpvi._module import flatten_params, ravel_params, unflatten_params
from gpvi._watchdog import paused
from gpvi.fitting.lbfgs import stop_message
from gpvi.fitting.posterior import FitResult, effective_jitter
from gpvi.fitting.predict import likelihood_call
from gpvi.fitting.problem import learnable_parameters
from gpvi.fitting.runner import progress_callback
from gpvi.models.base import GP, check_X, cholesky
from gpvi.likelihoods.base import as_array
from gpvi._compile import jit

__all__ = ["fit_mog", "MoGResult", "latent_gps", "entropy_lower_bound", "mixture_entropy_1d2d"]

_LOG2PI = float(np.log(2 * np.pi))


def entropy_lower_bound(means, variances):
    """The paper's Eq. 5 for ``q = (1/K) Σ_k N(m_k, diag s_k)``: means, variances (K, N) → scalar.

    ``−(1/K) Σ_k log[(1/K) Σ_l N(m_k | m_l, diag(s_k + s_l))]`` (Jensen: ≤ the entropy)."""
    K = means.shape[0]
    diff = means[:, None, :] - means[None, :, :]
    tot = variances[:, None, :] + variances[None, :, :]
    logn = -0.5 * jnp.sum(_LOG2PI + jnp.log(tot) + diff**2 / tot, axis=-1)  # (K, K)
    return -jnp.mean(jax.scipy.special.logsumexp(logn, axis=1) - jnp.log(K))


def mixture_entropy_1d2d(means, variances, grid: int = 2001, span: float = 10.0):
    """Entropy of ``(1/K) Σ_k N(m_k, diag s_k)`` in 1 or 2 dimensions by numerical integration on
    a grid (a reference for tests; NumPy)."""
    means, variances = np.asarray(means, float), np.asarray(variances, float)
    D = means.shape[1]
    sd = np.sqrt(variances)
    lo, hi = (means - span * sd).min(0), (means + span * sd).max(0)
    axes = [np.linspace(lo[j], hi[j], grid if D == 1 else 801) for j in range(D)]
    pts = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, D)
    logc = -0.5 * np.sum(_LOG2PI + np.log(variances[None]) + (pts[:, None, :] - means[None]) ** 2 / variances[None], -1)
    logq = np.logaddexp.reduce(logc, axis=1) - np.log(means.shape[0])
    q = np.exp(logq)
    cell = np.prod([a[1] - a[0] for a in axes])
    return float(-np.sum(q * logq) * cell)


def _check_components(K):
    if isinstance(K, (bool, np.bool_)) or not isinstance(K, numbers.Integral) or K <= 0:
        raise ValueError(f"components must be a positive int K (the number of mixture components), got {K!r}")
    return int(K)


def latent_gps(model) -> list:
    """The full GPs of the latent functions: ``[model]`` for a GP, ``model.latents`` for a
    :class:`~gpvi.models.multilatent.MultiLatent` of full GPs; a ``ValueError`` otherwise."""
    from gpvi.models.multilatent import MultiLatent

    if isinstance(model, MultiLatent):
        if not all(isinstance(l, GP) for l in model.latents):
            raise ValueError("posterior='mog' needs full GPs for every latent function (MultiLatent.full), got "
                             f"{sorted({type(l).__name__ for l in model.latents})}")
        return list(model.latents)
    if isinstance(model, GP):
        return [model]
    raise ValueError(f"model must be a gpvi GP (full GP) or a MultiLatent of full GPs for posterior='mog', "
                     f"got {type(model).__name__}")


def _rows(a):
    """(K, Q, n) → what a likelihood takes: (K, n) for one latent, (K, n, Q) for several."""
    return a[:, 0] if a.shape[1] == 1 else a.swapaxes(1, 2)  # (a JAX or a NumPy array)


def _prior_factors(model, X):
    """Per latent: ``(L, diag K⁻¹, log det K, j·s)`` of its prior covariance on the training
    inputs, ``j·s`` the nugget its factorisation added."""
    out = []
    for lat in latent_gps(model):  # a loop over the Q latent functions
        L, nugget = cholesky(lat.kernel(X, X), lat.jitter)
        Linv = solve_triangular(L, jnp.eye(X.shape[0], dtype=L.dtype), lower=True)
        out.append((L, jnp.sum(Linv**2, axis=0), 2.0 * jnp.sum(jnp.log(jnp.diag(L))), nugget))
    return out


@jit
def _prior_terms(model, X):
    """What a fit needs of the prior on the training inputs ``X``, as one compiled program (a
    fresh process otherwise traces, lowers and loads a small program for every eager operation of
    the kernels and factorisations): :func:`_prior_factors` and the prior variances
    ``diag K(X, X)``, (Q, N)."""
    return _prior_factors(model, X), jnp.stack([lat.kernel.diag(X) for lat in latent_gps(model)])


@jit
def _conditional(model, Xt, Xs, means, variances):
    """Each component's GP conditional at ``Xs`` from its marginals ``means``, ``variances`` (K,
    Q, N) at the training inputs ``Xt``: two (K, Q, n) arrays (one compiled program per shape of
    ``Xs``)."""
    ms, vs = [], []
    for q, lat in enumerate(latent_gps(model)):  # a loop over the Q latent functions
        L, _ = cholesky(lat.kernel(Xt, Xt), lat.jitter)
        Ks = lat.kernel(Xt, Xs)
        A = cho_solve((L, True), Ks)  # K⁻¹ k_*, (N, n)
        ms.append(lat.mean + (means[:, q] - lat.mean) @ A)
        v0 = lat.kernel.diag(Xs) - jnp.sum(Ks * A, 0)
        vs.append(v0[None] + variances[:, q] @ (A**2))
    return jnp.stack(ms, axis=1), jnp.stack(vs, axis=1)


def _bound(u, logvar, model, X, y, K, factors=None):
    """The MoG bound L (nats, summed over the data) and the component means (K, Q, N), for
    whitened means ``u`` (``m_kq = μ_q + L_q u_kq``, L_q = chol K_q, so
    ``(m_kq−μ_q)ᵀK_q⁻¹(m_kq−μ_q) = |u_kq|²``: the cross-entropy is then well conditioned in the
    optimised variables) and log variances, both (K, Q, N).  ``factors``: the model's
    :func:`_prior_factors` on X when the hyperparameters are fixed (computed here otherwise)."""
    s = jnp.exp(logvar)
    lik = model.likelihood
    N = X.shape[0]
    means, cross = [], 0.0
    if factors is None:
        factors = _prior_factors(model, X)
    for q, (lat, (L, kinv_diag, logdet, _)) in enumerate(zip(latent_gps(model), factors)):
        means.append(lat.mean + u[:, q] @ L.T)
        cross = cross - 0.5 * (N * _LOG2PI + logdet + jnp.sum(u[:, q] ** 2) / K + jnp.sum(s[:, q] @ kinv_diag) / K)
    means = jnp.stack(means, axis=1)
    ell = jnp.sum(lik.expected_log_prob(jnp.broadcast_to(y, (K, N)), _rows(means), _rows(s))) / K
    if K == 1:
        ent = 0.5 * jnp.sum(_LOG2PI + 1.0 + logvar)
    else:
        ent = entropy_lower_bound(means.reshape(K, -1), s.reshape(K, -1))
    return ell + cross + ent, means


def _negative_bound(x, model, X, y, factors, *, K, names):
    """``−L`` at the flat vector ``x`` of :func:`fit_mog`: whitened means and log variances (K, Q,
    N) each, then the unconstrained values of the parameters ``names`` of ``model`` (their
    starting values in ``model`` give only the layout)."""
    Q, N = len(latent_gps(model)), X.shape[0]
    nv = 2 * K * Q * N
    mdl = model
    if names:
        unravel = jax.flatten_util.ravel_pytree(flatten_params(model, list(names)))[1]
        mdl = unflatten_params(model, unravel(x[nv:]))
    return -_bound(x[:nv // 2].reshape(K, Q, N), x[nv // 2:nv].reshape(K, Q, N), mdl, X, y, K, factors)[0]


# one compiled program per model structure, shapes, K and learned names, shared by the fits
# (a function made inside each fit was lowered again in every fit)
_negative_bound_and_grad = jit(jax.value_and_grad(_negative_bound), static_argnames=("K", "names"))


@dataclasses.dataclass(kw_only=True, repr=False)  # FitResult's short repr, not the arrays
class MoGResult(FitResult):
    """A fitted mixture-of-diagonal-Gaussians posterior over the N training latents: a
    :class:`~gpvi.fitting.posterior.FitResult` whose predictions are the mixture's.

    Beyond the fields of ``FitResult``: ``X`` the training inputs; ``means``, ``variances`` the
    components' marginals at ``X``, (K, N), or (K, Q, N) with Q latent functions.  The shared
    fields: ``model`` with the final hyperparameters; ``state`` None (the posterior is not one
    Gaussian); ``engine`` ``"mog"`` (L-BFGS-B on the mixture bound, not an engine of the
    registry); ``vlb`` the bound (nats, summed over the data); ``trace`` the bound at the start
    and after every L-BFGS-B iteration (seconds since the start of the fit, VLB), so
    ``iterations + 1`` rows; ``iterations`` the L-BFGS-B iterations of the whole fit (with
    learned hyperparameters: those of q alone first, then those of the joint search, which are
    also ``hyperparameter_rounds``); ``evaluations`` the evaluations of the bound (each a pass
    over the data); ``converged``, ``message`` the last L-BFGS-B run's; ``gap`` NaN (no
    certificate); ``extras`` ``{"components": K}``; ``search_message`` the joint L-BFGS-B's
    message (``"no hyperparameters learned"`` without learned hyperparameters); ``jitter`` the
    relative jitter of the factorisation of each latent's ``K(X, X)``.  ``repr`` and
    :meth:`~gpvi.fitting.posterior.FitResult.summary` are those of ``FitResult`` (a few lines,
    no arrays).  Saved and loaded by :func:`gpvi.io.save` and :func:`gpvi.io.load` like any
    ``FitResult``.
    """

    X: np.ndarray = dataclasses.field(repr=False)
    means: np.ndarray
    variances: np.ndarray

    @property
    def components(self) -> int:
        """The number K of mixture components."""
        return int(np.shape(self.means)[0])

    def _state_shapes(self) -> str:
        """The mixture's shapes, in words (for :meth:`summary`)."""
        return (f"variational state: {self.components} diagonal Gaussian component(s), means "
                f"{tuple(np.shape(self.means))}, variances {tuple(np.shape(self.variances))}")

    def _recorded_jitter(self) -> float:
        """The jitter of the factorisation of each latent's ``K(X, X)``, computed again (a result
        loaded from a file does not record it)."""
        return effective_jitter(self.model, None, self.X)

    def predict_components(self, X, offset=None):
        """Each component's latent means and variances at ``X`` (the GP conditional of each
        component, plus ``offset``): two (K, n) arrays, or (K, n, Q) with Q latent functions."""
        X, offset = self._X(X, offset)
        N = np.shape(self.X)[0]
        means = np.asarray(self.means, np.float64).reshape(self.components, -1, N)
        variances = np.asarray(self.variances, np.float64).reshape(means.shape)
        m, v = (np.asarray(a) for a in _conditional(self.model, np.asarray(self.X, np.float64), X, means, variances))
        m, v = _rows(m), np.maximum(_rows(v), 1e-300)
        if offset is not None:  # added to every latent, as for a Gaussian posterior
            m = m + (offset if m.ndim == 2 else offset[:, None])
        return m, v

    def predict_f(self, X, offset=None):
        """Mean and variance of the latent at ``X`` under the mixture (two (n,) arrays, (n, Q)
        with Q latent functions); :meth:`predict_components` gives each component's."""
        m, v = self.predict_components(X, offset)
        mean = m.mean(0)
        return mean, v.mean(0) + ((m - mean) ** 2).mean(0)  # the law of total variance

    def _flat(self, X, offset):
        """The components' moments at ``X`` with the K components stacked as rows: (K·n, …)."""
        m, v = self.predict_components(X, offset)
        return m.reshape((-1,) + m.shape[2:]), v.reshape((-1,) + v.shape[2:]), m.shape[0]

    def predict_y(self, X, offset=None):
        """Predictive mean and variance of the observation at ``X`` under the mixture (the law of
        total variance over the components); with Q latents (softmax) the class probabilities
        and their variances."""
        m, v, K = self._flat(X, offset)
        mu, var = likelihood_call(self.model.likelihood, "predict_mean_and_var", m, v)
        mu = np.asarray(mu).reshape((K, -1) + np.shape(mu)[1:])
        var = np.asarray(var).reshape(mu.shape)
        mean = mu.mean(0)
        return mean, var.mean(0) + ((mu - mean) ** 2).mean(0)

    def predict_proba(self, X, offset=None):
        """Class probabilities under the mixture (the components' averaged), with the columns of
        :meth:`FitResult.predict_proba <gpvi.fitting.posterior.FitResult.predict_proba>`."""
        m, v, K = self._flat(X, offset)
        p = self._class_probabilities(m, v)
        return p.reshape((K, -1) + p.shape[1:]).mean(0)

    def log_predictive_density(self, X, y, offset=None):
        """Per-point ``log p(y* | data)`` at inputs ``X`` under the mixture: an (n,) array."""
        X, offset = self._X(X, offset)
        lik = self.model.likelihood
        y = np.asarray(lik.validate(y))
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
        m, v, K = self._flat(X, offset)
        ys = np.tile(y, (K,) + (1,) * (y.ndim - 1))
        lp = np.asarray(likelihood_call(lik, "predictive_log_density", ys, m, v)).reshape(K, -1)
        return np.logaddexp.reduce(lp, axis=0) - np.log(K)


def fit_mog(model, X, y, *, components: int = 1, learn_hyperparameters=False, max_iter: int = 5000,
            tol: float = 1e-9, seed: int = 0, init_spread: float = 0.1, callback=None,
            progress: bool = False) -> MoGResult:
    """Fit ``q(f) = (1/K) Σ_k N(m_k, diag s_k)`` (``components = K``; MIX is K = 1, MIX2 K = 2) to
    a full GP ``model``, or a :class:`~gpvi.models.multilatent.MultiLatent` of full GPs, by L-BFGS-B on
    the bound (see the module docstring); ``gpvi.fit(..., posterior="mog")`` calls this.

    ``learn_hyperparameters``: False, True (all of :func:`gpvi.learnable_parameters`), one dotted
    name or a list of them, optimised jointly with q (after a first run of q alone at the
    starting hyperparameters).  Components start at the prior mean plus ``init_spread`` × prior
    sd of noise (seeded), so that they can separate.  ``max_iter``, ``tol``: the iteration limit
    and the relative-change tolerance (``ftol``) of each L-BFGS-B run.  ``callback`` is called as
    ``callback(iteration, vlb, seconds)`` at the start (iteration 0) and after every L-BFGS-B
    iteration, as the rows of the trace; ``progress`` shows a progress bar on stderr.
    """
    K = _check_components(components)
    lats = latent_gps(model)
    Q = len(lats)
    X = check_X(X)
    y = as_array(y, "y")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(f"y must be a 1-D array with one entry per row of X ({X.shape[0]}), got shape {y.shape}")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable, got {type(callback).__name__}")
    y = jax.device_put(model.likelihood.validate(y))  # (jnp.asarray: a staging program per shape)
    N = X.shape[0]
    Xj = jax.device_put(X)
    names = []
    if learn_hyperparameters is True:
        names = learnable_parameters(model)
    elif isinstance(learn_hyperparameters, str):
        names = [learn_hyperparameters]
    elif learn_hyperparameters:
        names = list(learn_hyperparameters)
    theta0 = flatten_params(model, names)
    flat_theta, unravel_host = ravel_params(theta0)  # (the order of jax.flatten_util.ravel_pytree, in NumPy)
    # the prior at the starting hyperparameters: its variances set the components' starting
    # variances; at fixed hyperparameters its factors are constants of every evaluation
    factors, kdiag = _prior_terms(model, Xj)
    kdiag = np.asarray(kdiag)  # (Q, N)
    rng = np.random.default_rng(seed)
    u0 = init_spread * rng.standard_normal((K, Q, N))
    lv0 = np.log(0.5 * kdiag)[None].repeat(K, 0)
    x0 = np.concatenate([u0.ravel(), lv0.ravel(), np.asarray(flat_theta)])
    nv = 2 * K * Q * N

    if names:
        factors = None  # (recomputed in every evaluation, at its hyperparameters)

    def vg(x):
        return _negative_bound_and_grad(x, model, Xj, y, factors, K=K, names=tuple(names))
    t0 = time.perf_counter()
    rows: list[tuple[float, float]] = []  # the trace: (seconds since t0, VLB)
    evaluations = [0]
    show = progress_callback(progress, "mog")

    def record(vlb):
        """One row of the trace, forwarded to the progress bar and the user's callback."""
        t = time.perf_counter() - t0
        rows.append((t, vlb))
        for f in (show, callback):
            if f is not None:
                with paused():
                    f(len(rows) - 1, vlb, t)

    def fun(x):
        v, g = vg(x)  # (a host array: the compiled call moves it)
        v = float(v)
        evaluations[0] += 1
        if not rows:  # the starting bound: iteration 0, as in the engines' traces
            record(-v)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(x)
        return v, np.asarray(g)

    def on_iteration(intermediate_result):
        record(-float(intermediate_result.fun))

    opts = dict(maxiter=max_iter, maxfun=2 * max_iter, ftol=tol, gtol=1e-8, maxcor=30)
    try:
        if names:
            # q first, at the starting hyperparameters: from a poor q the joint search ran into the
            # degenerate optimum of a diagonal posterior (lengthscale → 0, all noise) on Boston
            # (bound −425 against −381 for q alone at the same start).
            def fun_q(xq):
                v, g = fun(np.concatenate([xq, x0[nv:]]))
                return v, g[:nv]

            import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
            rq = scipy.optimize.minimize(fun_q, x0[:nv], jac=True, method="L-BFGS-B", callback=on_iteration,
                                         options=opts)
            x0 = np.concatenate([rq.x, x0[nv:]])
        import scipy.optimize  # (imported when needed: 0.4 s of `import gpvi`)
        res = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", callback=on_iteration, options=opts)
    finally:
        if show is not None:
            show.close()
    xf = np.asarray(res.x)
    u, logvar = xf[:nv // 2].reshape(K, Q, N), xf[nv // 2:nv].reshape(K, Q, N)
    final = unflatten_params(model, unravel_host(xf[nv:])) if names else model
    # the components' means m_kq = μ_q + L_q u_kq, on the host from the final prior factors
    final_factors, _ = _prior_terms(final, Xj)
    Ls, nuggets = [np.asarray(f[0]) for f in final_factors], [float(f[3]) for f in final_factors]
    means = np.stack([lat.mean + u[:, q] @ L.T for q, (lat, L) in enumerate(zip(latent_gps(final), Ls))], axis=1)
    variances = np.exp(np.asarray(logvar))
    # the relative jitter of each factorisation from its factor and nugget (GP.relative_jitter's
    # host path), instead of factorising K(X, X) once more
    caches = [(X, L, nug) for L, nug in zip(Ls, nuggets)]
    jitter = final.relative_jitter(caches[0] if isinstance(final, GP) else tuple(caches))
    if Q == 1:  # one latent: (K, N), as before
        means, variances = means[:, 0], variances[:, 0]
    vlb = -float(res.fun)
    search = stop_message(res, max_iter, "max_iter") if names else "no hyperparameters learned"
    return MoGResult(model=final, state=None, vlb=vlb, iterations=len(rows) - 1,
                     search_message=search, jitter=jitter, learned=tuple(names),
                     converged=bool(res.success and np.isfinite(vlb)), message=str(res.message),
                     trace=np.asarray(rows, dtype=np.float64).reshape(-1, 2), engine="mog",
                     evaluations=evaluations[0], hyperparameter_rounds=int(res.nit) if names else 0,
                     seconds=time.perf_counter() - t0, input_dim=X.shape[1], extras={"components": K},
                     X=X, means=means, variances=variances)
