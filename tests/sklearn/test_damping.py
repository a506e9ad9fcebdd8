"""Damped fixed-point steps are reported by the estimators and warned about when they dominate."""
import warnings

import pytest

import gpvi
from gpvi.sklearn.damping import DampingWarning, damped_share, warn_if_dominated


def _data(rng, N=40):
    X = rng.normal(size=(N, 2))
    return X, (X[:, 0] > 0).astype(int)  # separable


def test_ill_conditioned_fit_warns(rng):
    # A logistic GP with kernel variance 1e8 on separable labels: I − Σλaaᵀ has eigenvalues
    # from 1 to ~1e3, natural-gradient steps overshoot and are damped throughout.
    X, y = _data(rng)
    est = gpvi.GPClassifier(gpvi.kernels.RBF(variance=1e8), learn_hyperparameters=False, max_iter=60)
    with pytest.warns(DampingWarning, match="damped .* steps"):
        est.fit(X, y)
    assert est.n_damped_steps_ == est.fit_result_.backtracks > 0
    assert damped_share(est.fit_result_) >= 0.25


def test_well_conditioned_fit_does_not_warn(rng):
    X, y = _data(rng)
    y[:8] = 1 - y[:8]  # not separable
    with warnings.catch_warnings():
        warnings.simplefilter("error", DampingWarning)
        est = gpvi.GPClassifier(learn_hyperparameters=False).fit(X, y)
    assert est.n_damped_steps_ == est.fit_result_.backtracks


class _Result:
    engine = "fpi"

    def __init__(self, backtracks, evaluations):
        self.backtracks, self.evaluations = backtracks, evaluations


@pytest.mark.parametrize("backtracks, evaluations, warns", [
    (49, 50, False),  # too few to matter
    (50, 200, True),  # a quarter of the passes
    (50, 201, False),
    (0, 0, False),
])
def test_threshold(backtracks, evaluations, warns):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert warn_if_dominated(_Result(backtracks, evaluations)) is warns
    assert len(w) == int(warns)
