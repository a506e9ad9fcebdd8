"""Shared test settings: JAX on CPU in float64 (gpvi switches x64 on at import)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import gpvi  # noqa: E402,F401  (enables float64 before any test builds arrays)
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)
