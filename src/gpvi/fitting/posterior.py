"""The result of :func:`gpvi.fit`: :class:`FitResult`, the fitted posterior with its predictions
and how the fit obtained it.  A Gaussian posterior is a ``FitResult``; the mixture posterior
(``posterior="mog"``) is its subclass :class:`gpvi.fitting.mog.MoGResult`, with the same
predictions, trace and model files."""
from __future__ import annotations

import dataclasses

import numpy as np

from gpvi.fitting.predict import latent_moments, likelihood_call
from gpvi.fitting.problem import check_offset
from gpvi.models.base import Model, check_X
from gpvi.objective import DEFAULT_CHUNK, State

__all__ = ["FitResult"]


@dataclasses.dataclass
class FitResult:
    """A fitted variational posterior and how it was obtained.

    Every :func:`gpvi.fit` returns one: for ``posterior="mog"`` it is the subclass
    :class:`gpvi.fitting.mog.MoGResult`, whose ``state`` is None (the posterior is its mixture
    components) and whose predictions are those of the mixture.

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
    extras : engine-specific numbers of the last engine run (see ``EngineResult.extras``).
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
