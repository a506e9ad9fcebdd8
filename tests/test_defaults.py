"""The estimators' default kernel start (gpvi._defaults): median distance, isotropic then ARD."""
import numpy as np
import pytest
import scipy.spatial.distance

import gpvi
from gpvi._defaults import ard_from, isotropic_start, median_distance


def test_median_distance_is_scipys(rng):
    X = rng.normal(size=(200, 5))
    assert median_distance(X) == pytest.approx(np.median(scipy.spatial.distance.pdist(X)), rel=1e-10)
    assert median_distance(np.ones((5, 3))) == 1.0  # all rows equal


def test_ard_from_isotropic():
    k = ard_from(isotropic_start(np.eye(4)), 4)
    assert np.asarray(k.lengthscale).shape == (4,)
    np.testing.assert_allclose(np.asarray(k.lengthscale), np.sqrt(2.0))


@pytest.mark.slow
def test_default_classifier_learns_in_many_dimensions(rng):
    """40 standardised features, the class set by two of them.  Lengthscales all started at 1
    put the typical squared distance at 2·40 (K ≈ I); the median-distance start does not."""
    N, D = 100, 40
    X = rng.normal(size=(N, D))
    y = (X[:, 0] + X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(int)  # not separable
    est = gpvi.GPClassifier().fit(X, y)
    ls = np.asarray(est.fit_result_.model.kernel.lengthscale)
    assert ls.shape == (D,)  # ARD after the isotropic stage
    Xt = rng.normal(size=(300, D))
    acc = np.mean(est.predict(Xt) == (Xt[:, 0] + Xt[:, 1] > 0))
    assert acc > 0.75
    assert np.min(ls[:2]) < np.median(ls[2:])  # the two relevant features are the short ones
