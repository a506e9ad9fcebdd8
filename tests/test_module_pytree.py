"""Regression test: distinct Module classes with the same fields must not share compiled code.

With ``jax.tree_util.register_dataclass`` (jax 0.10) the treedefs of two such classes compared
equal, and a jitted function called on many classes ran another class's compiled program for
about one call in six.
"""
import jax
import numpy as np
import pytest

from gpvi.likelihoods import Likelihood


@pytest.mark.slow
def test_jit_cache_distinguishes_classes_with_same_fields():
    classes = []
    for i in range(100):
        def log_prob(self, y, f, i=i):
            return -(y - f) ** 2 * (i + 1)
        classes.append(type(f"Lik{i}", (Likelihood,), {"log_prob": log_prob}))

    @jax.jit
    def g(lik, y, f):
        return lik.log_prob(y, f)

    got = np.array([float(g(c(), 1.0, 0.0)) for c in classes])
    np.testing.assert_array_equal(got, -np.arange(1, 101))
