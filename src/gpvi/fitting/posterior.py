"""The result of :func:`gpvi.fit`: :class:`FitResult`, the fitted posterior with its predictions
and how the fit obtained it.  A Gaussian posterior is a ``FitResult``; the mixture posterior
(``posterior="mog"``) is its subclass :class:`gpvi.fitting.mog.MoGResult`, with the same
predictions, trace and model files."""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from gpvi._module import matching_parameters
from gpvi.fitting.predict import latent_moments, likelihood_call
from gpvi.fitting.problem import check_offset, learnable_parameters
from gpvi.models.base import Model, check_X
from gpvi.objective import DEFAULT_CHUNK, State
from gpvi._compile import jit

__all__ = ["FitResult", "effective_jitter", "SUMMARY_MAX_PARAMETERS"]

#: Most rows of the parameter table of :meth:`FitResult.summary` (the rest are counted in one line).
SUMMARY_MAX_PARAMETERS = 15


@dataclasses.dataclass
class FitResult:
    """A fitted variational posterior and how it was obtained.

    Every :func:`gpvi.fit` returns one: for ``posterior="mog"`` it is the subclass
    :class:`gpvi.fitting.mog.MoGResult`, whose ``state`` is None (the posterior is its mixture
    components) and whose predictions are those of the mixture.

    ``repr(fit)`` is one line (engine, VLB, gap, convergence, iterations, hyperparameter rounds);
    ``print(fit)`` shows :meth:`summary` (at most about 30 lines, whatever the model).

    Attributes
    ----------
    model : the model with the hyperparameters (and inducing inputs) the fit ended with.
    state : ``State(mean, chol)`` of ``q(w)`` in whitened coordinates.
    vlb : final variational lower bound, nats summed over the data.
    iterations : engine iterations summed over every engine run of the fit, like
        ``evaluations`` (passes over the data) and the safeguard counts below.  Without learned
        hyperparameters that is the one run's count.  When they are learned by the profile
        L-BFGS-B search, the engine runs (warm-started) at every point the search evaluates and
        once more at the learned hyperparameters, and every one of those runs counts, so
        ``iterations ≥ hyperparameter_rounds`` (a search of 8 rounds that ends on a converged
        warm start does not read 0).  On the collapsed bound (Gaussian likelihood) each
        evaluation of the bound is the optimal ``q`` in closed form and counts as one iteration
        (and one pass in ``evaluations``), plus the final engine run at the learned θ.  Engines
        that learn the hyperparameters themselves report their own totals: ``jj``/``taylor``/
        ``jj-hybrid``/``jj-full`` their analytic rounds plus L-BFGS-B steps on the collapsed
        bound, the stochastic engines (``svi``, ``sfp``, ``ivsgpr``) their steps.
    converged, message : of the last engine run; ``message`` says why it stopped (and how many
        hyperparameter rounds ran).  ``converged`` means the engine certified its state: the
        estimated gap below was at most the tolerance (see :func:`gpvi.fit`'s ``tol`` and ``tol_nats``).
    evaluations : passes over the data, summed over every engine run of the fit (see ``iterations``).
    hyperparameter_rounds : L-BFGS-B iterations of the hyperparameter search (the profile or the
        collapsed bound's; the L-BFGS-B steps of the jj/taylor drivers); 0 when none ran.
    gap : the estimated distance ``VLB* − VLB`` (nats) of the final state from the optimum at
        the final hyperparameters (:func:`gpvi.engines._common.estimated_gap`; for the dual
        engine the duality gap where strong duality holds; NaN for the Laplace engine, which
        does not maximise the VLB).
    trace : (K, 2) array of (seconds since the start of the fit, VLB) per iteration.
    backtracks, cycles, clipped : safeguard events of the fixed-point engines (0 for others),
        summed over every engine run of the fit: damped (VLB-lowering) steps, detected
        2-cycles, steps that clipped γ_i at 0.
    subset : indices of the training rows used (subset of data), or None for all rows.
    extras : engine-specific numbers of the last engine run (see ``EngineResult.extras``); under a
        hyperprior ``extras["log_prior"]`` is ``log p(θ)`` at the learned θ (the search maximised
        ``vlb + extras["log_prior"]``).
    search_message : why the hyperparameter search stopped: SciPy L-BFGS-B's message of the
        profile search or of the collapsed bound (prefixed ``"max_rounds reached"`` when it ran out
        of rounds), the engine's own message for engines that learn θ themselves, ``"no
        hyperparameters learned"`` when none were; ``""`` where not recorded (results of
        :func:`gpvi.fit_stream` and results loaded from model files).
    jitter : the relative jitter ``j`` finally used: the Cholesky factorisation of the prior
        covariance (``K`` of a full GP, ``K_ZZ`` of a sparse GP) added ``j·s·I`` with ``s`` the mean
        prior variance (:func:`gpvi.models.base.cholesky`), starting at ``model.jitter`` and growing
        tenfold when the factorisation failed; the largest over the latent functions of a
        ``MultiLatent``.  NaN for models without jitter (``GLM``) and where not recorded (then
        :meth:`summary` computes it from the prior cache; see :func:`effective_jitter`).
    learned : the dotted names (patterns with ``*`` segments included) of the hyperparameters the
        fit learned, ``()`` when none, None where not recorded.
    """

    model: Model
    state: State
    vlb: float
    iterations: int
    converged: bool
    message: str
    trace: np.ndarray
    engine: str
    backtracks: int = 0
    cycles: int = 0
    evaluations: int = 0
    hyperparameter_rounds: int = 0
    seconds: float = 0.0
    prior: object = dataclasses.field(default=None, repr=False)
    chunk_size: int = DEFAULT_CHUNK
    input_dim: int | None = None  # columns of the training X, checked at predict time
    clipped: int = 0
    subset: np.ndarray | None = dataclasses.field(default=None, repr=False)
    extras: dict = dataclasses.field(default_factory=dict)
    gap: float = float("nan")
    search_message: str = ""
    jitter: float = float("nan")
    learned: tuple | None = dataclasses.field(default=None, repr=False)

    # ---- reading a fit ------------------------------------------------------------------
    def __repr__(self) -> str:
        """One line: the class, engine, VLB, gap, convergence, iterations and hyperparameter
        rounds (no arrays; :meth:`summary` has the rest)."""
        extra = f", components={self.components}" if hasattr(self, "components") else ""
        return (f"{type(self).__name__}(engine={self.engine!r}{extra}, vlb={_num(self.vlb)}, gap={_num(self.gap, 3)}, "
                f"converged={self.converged}, iterations={self.iterations}, "
                f"hyperparameter_rounds={self.hyperparameter_rounds})")

    def __str__(self) -> str:
        """:meth:`summary`: ``print(fit)`` shows it."""
        return self.summary()

    def summary(self) -> str:
        """A readable account of the fit, at most about 30 lines whatever the model.

        The model (class, inducing inputs, kernels), the likelihood, the engine and why it
        stopped, the VLB (nats; under a hyperprior also ``log p(θ)`` and the objective that was
        maximised, bound + log prior), the estimated gap, whether it converged, engine
        iterations, passes over the data, hyperparameter rounds and why the search stopped, the
        jitter used, and a table of the parameters (the dotted names of
        :func:`gpvi.learnable_parameters` and the fixed ones, each with its value, constraint and
        whether it was learned: scalars and vectors of at most 8 entries are shown, larger arrays
        by shape and range).  The inducing inputs and the variational state are left out of the
        table (their shapes are shown on one line).
        """
        lines = [f"{type(self).__name__}: {self.model.describe()}",
                 f"likelihood: {_describe_likelihood(self.model.likelihood)}"]
        lines.append(f"engine: {self.engine}; converged: {self.converged}; seconds: {self.seconds:.3g}")
        choice = self.extras.get("engine_choice") if isinstance(self.extras, dict) else None
        if choice:
            lines.append(f"engine choice: {_clip(str(choice))}")
        if self.message:
            lines.append(f"engine message: {_clip(self.message)}")
        log_prior = self.extras.get("log_prior") if isinstance(self.extras, dict) else None
        if log_prior is not None:
            lp = float(log_prior)
            lines.append(f"VLB: {_num(self.vlb)} nats (the bound alone, summed over the data)")
            lines.append(f"log prior: {_num(lp)} nats (hyperprior at the learned hyperparameters)")
            lines.append(f"objective maximised (bound + log prior): {_num(self.vlb + lp)} nats")
        else:
            lines.append(f"VLB: {_num(self.vlb)} nats (summed over the data)")
        lines.append(f"gap: {_num(self.gap)} nats (estimated VLB* - VLB at the final hyperparameters)")
        lines.append(f"iterations: {self.iterations} (engine, all runs); evaluations: {self.evaluations} "
                     "(passes over the data)")
        lines.append(f"hyperparameter rounds: {self.hyperparameter_rounds}; search stopped: "
                     f"{_clip(self.search_message) or '(not recorded)'}")
        lines.append(f"jitter: {self._jitter_line()}")
        lines.append(f"not in the table: {self._hidden_line()}")
        lines.extend(self._parameter_table())
        return "\n".join(lines)

    def _jitter_line(self) -> str:
        """The jitter used, relative to the mean prior variance, and the model's starting value."""
        start = getattr(self.model, "jitter", None)
        if start is None:
            return "none (the model has no jitter)"
        j = self.jitter
        if not np.isfinite(j):
            try:
                j = self._recorded_jitter()
            except Exception:  # noqa: BLE001 - a summary must not fail on an unusual prior cache
                j = float("nan")
        if not np.isfinite(j):
            return f"model.jitter {start:.3g} (the value used was not recorded)"
        grown = "" if math.isclose(j, start, rel_tol=1e-9) else f", grown from model.jitter {start:.3g}"
        return f"{j:.3g} (relative to the mean prior variance{grown})"

    def _recorded_jitter(self) -> float:
        """The jitter used, from the prior cache where :attr:`jitter` was not recorded (a result
        loaded from a file); NaN without one."""
        return effective_jitter(self.model, self.prior) if self.prior is not None else float("nan")

    def _hidden_line(self) -> str:
        """The shapes of the inducing inputs and of the variational state."""
        parts = []
        params = self.model.parameters()
        induc = {n: tuple(np.shape(v)) for n, v in params.items()
                 if n.rsplit(".", 1)[-1] in ("inducing", "inducing_lengthscale")}
        shapes = sorted(set(induc.values()))
        if len(induc) == 1:
            (n, sh), = induc.items()
            parts.append(f"{n} {sh}")
        elif induc:
            parts.append(f"inducing inputs {len(induc)} x {shapes[0] if len(shapes) == 1 else shapes}")
        parts.append(self._state_shapes())
        return "; ".join(parts)

    def _state_shapes(self) -> str:
        """The variational state's shapes, in words."""
        if self.state is None:
            return "variational state: none"
        return (f"variational state mean {tuple(np.shape(self.state.mean))}, "
                f"chol {tuple(np.shape(self.state.chol))}")

    def _parameter_table(self) -> list:
        """Rows ``name value constraint learned`` of the model's parameters (inducing inputs
        left out), at most :data:`SUMMARY_MAX_PARAMETERS` of them plus a line for the rest."""
        model = self.model
        trans = model.transforms()
        params = model.parameters()
        names = learnable_parameters(model)
        names += [n for n, t in trans.items() if t == "fixed" and n not in names]
        learned = set()
        if self.learned is not None:
            for pattern in self.learned:
                learned.update(matching_parameters(model, pattern))
        rows = []
        for n in names:
            constraint = "fixed (never learned)" if trans[n] == "fixed" else trans[n]
            flag = "-" if self.learned is None else ("yes" if n in learned else "no")
            rows.append((n, _show_value(params[n]), constraint, flag))
        if not rows:
            return ["parameters: none"]
        shown = rows if len(rows) <= SUMMARY_MAX_PARAMETERS else rows[:SUMMARY_MAX_PARAMETERS - 1]
        head = ("parameter", "value", "constraint", "learned")
        w = [max(len(r[k]) for r in shown + [head]) for k in range(3)]
        out = [f"  {head[0]:<{w[0]}}  {head[1]:<{w[1]}}  {head[2]:<{w[2]}}  {head[3]}"]
        out += [f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}" for r in shown]
        if len(shown) < len(rows):
            out.append(f"  ... and {len(rows) - len(shown)} more (fit.model.parameters())")
        return out

    @property
    def diagnostics(self) -> dict:
        """Whether the fixed-point iterates were damped, cycled or had γ clipped (Sheth &
        Khardon 2016, Theorem 1 and §4), with the counts."""
        return {"damped": self.backtracks > 0, "cycled": self.cycles > 0, "clipped": self.clipped > 0,
                "backtracks": self.backtracks, "cycles": self.cycles, "clipped_steps": self.clipped}

    # ---- predictions -------------------------------------------------------------------
    def _X(self, X, offset):
        X = check_X(X, "X")
        D = self.model.input_dim()
        if D is None:
            D = self.input_dim
        if D is not None and X.shape[1] != D:
            raise ValueError(f"X has {X.shape[1]} columns but the model was fitted on {D}")
        return X, check_offset(offset, X.shape[0])

    def predict_f(self, X, offset=None):
        """Latent mean and variance at ``X`` (N, D): two (N,) arrays."""
        X, offset = self._X(X, offset)
        m, v = latent_moments(self.model, self.prior, self.state, X, offset, self.chunk_size)
        return np.asarray(m), np.asarray(v)

    def predict_f_cov(self, X, offset=None):
        """Latent mean and *full* posterior covariance at ``X`` (n, D): an (n,) mean and an
        (n, n) covariance; with Q latent functions (``MultiLatent``) an (n, Q) mean and a (Q, n, n)
        covariance per latent (the posterior is independent across latents).

        In whitened coordinates ``f(X) = Aᵀw + b`` with ``q(w) = N(m, L_V L_Vᵀ)``, so
        ``Cov f = (K_** − AᵀA) + (L_VᵀA)ᵀ(L_VᵀA)``: the prior conditional covariance (the
        kernel's at ``X``, with a full GP's jitter nugget on coinciding rows; zero for a ``GLM``)
        plus the posterior term, by triangular solves only.  Its diagonal is the variance of
        :meth:`predict_f` (up to rounding).  O(n²) memory: for moderate n.
        """
        X, offset = self._X(X, offset)
        if self.state is None:
            raise NotImplementedError(f"{type(self).__name__} has no Gaussian state: predict_f_cov is not available")
        mean, cov = _latent_mean_cov(self.model, self.prior, self.state, X)
        mean, cov = np.asarray(mean), np.asarray(cov)
        if offset is not None:
            mean = mean + (offset if mean.ndim == 1 else offset[:, None])
        return mean, cov

    def predict_y(self, X, offset=None):
        """Predictive mean and variance of the observation at ``X``: two (N,) arrays.

        For Bernoulli the mean is ``P(y = 1)``; for ordinal it is the expected level.
        """
        m, v = self.predict_f(X, offset)
        mean, var = likelihood_call(self.model.likelihood, "predict_mean_and_var", m, v)
        return np.asarray(mean), np.asarray(var)

    def predict_proba(self, X, offset=None):
        """Class probabilities: (N, 2) for Bernoulli (columns: negative, positive class),
        (N, L) for ordinal levels 0..L−1, (N, C) for Softmax."""
        m, v = self.predict_f(X, offset)
        return self._class_probabilities(m, v)

    def _class_probabilities(self, m, v):
        """Class probabilities under the model's likelihood (its ``class_probabilities``) of
        latents with means ``m`` and variances ``v``: one row per row of ``m``."""
        return np.asarray(likelihood_call(self.model.likelihood, "class_probabilities", m, v))

    def log_predictive_density(self, X, y, offset=None):
        """Per-point ``log p(y* | data)`` at inputs ``X``: an (N,) array."""
        X, offset = self._X(X, offset)
        y = self.model.likelihood.validate(y)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries")
        m, v = latent_moments(self.model, self.prior, self.state, X, offset, self.chunk_size)
        return np.asarray(likelihood_call(self.model.likelihood, "predictive_log_density", y, m, v))


# ---- full covariance -----------------------------------------------------------------------

def _single_mean_cov(model, prior, mean, chol, X):
    At, b, _ = model.project(prior, X)
    B = chol.T @ At  # L_Vᵀ A, (d, n)
    cov = model.conditional_cov(prior, X, At) + B.T @ B
    return mean @ At + b, 0.5 * (cov + cov.T)


@jit
def _latent_mean_cov(model, prior, state, X):
    """Mean and full covariance of the latent(s) at ``X`` (see :meth:`FitResult.predict_f_cov`)."""
    if state.mean.ndim == 2:  # Q latent blocks
        parts = [_single_mean_cov(lat, pc, state.mean[q], state.chol[q], X)
                 for q, (lat, pc) in enumerate(zip(model.latents, prior))]
        return jnp.stack([p[0] for p in parts], axis=1), jnp.stack([p[1] for p in parts])
    return _single_mean_cov(model, prior, state.mean, state.chol, X)


# ---- jitter --------------------------------------------------------------------------------

def effective_jitter(model, prior=None, X=None) -> float:
    """The relative jitter ``j`` that the Cholesky factorisation of ``model``'s prior used (see
    :func:`gpvi.models.base.cholesky`: ``j·s·I`` added, ``s`` the mean prior variance, ``j``
    starting at ``model.jitter`` and growing tenfold on failure); the largest over the latents of
    a ``MultiLatent``; NaN for a model without jitter (``GLM``).

    ``prior`` is the model's prior cache on its training inputs (a full GP's holds the nugget
    ``j·s`` it added; a sparse GP's Cholesky factor ``L`` gives it as the mean of
    ``diag(L Lᵀ) − diag(K_ZZ)``); without it ``K_ZZ`` (sparse GP) or ``K(X, X)`` on the training
    inputs ``X`` (full GP) is factorised again.  Each model answers for itself
    (:meth:`gpvi.models.base.Model.relative_jitter`).
    """
    return model.relative_jitter(prior, X)


# ---- formatting ----------------------------------------------------------------------------

def _num(x, digits: int = 10) -> str:
    """A float with ``digits`` significant digits (``nan``, ``inf`` as such)."""
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return str(x)


def _clip(text, limit: int = 110) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show_value(value) -> str:
    """A parameter's value: a scalar, a vector of at most 8 entries, else its shape and range."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim == 0:
        return f"{float(a):.6g}"
    if a.ndim == 1 and a.size <= 8:
        return "[" + ", ".join(f"{v:.4g}" for v in a) + "]"
    if a.size == 0:
        return f"shape {a.shape}"
    return f"shape {a.shape}, min {a.min():.4g}, max {a.max():.4g}"


def _describe_likelihood(lik) -> str:
    """The likelihood's class with its string settings (``Bernoulli (link=logit)``) and class count."""
    if lik is None:
        return "none"
    extra = [f"{f.name}={getattr(lik, f.name)}" for f in dataclasses.fields(lik)
             if f.metadata.get("static") and isinstance(getattr(lik, f.name), str)]
    for attr in ("num_classes", "num_levels", "reference"):
        v = getattr(lik, attr, None)
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            extra.append(f"{attr}={int(v)}")
    inner = getattr(lik, "likelihood", None)
    if inner is not None and inner is not lik:
        extra.insert(0, f"of {_describe_likelihood(inner)}")
    return type(lik).__name__ + (f" ({', '.join(extra)})" if extra else "")
