"""Predictions from a fitted variational posterior, in chunks of rows."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .objective import State, make_chunks

__all__ = ["latent_moments"]


@jax.jit
def _moments(model, prior, state, X, offset):
    def one(args):
        Xc, oc = args
        A, b, c = model.project(prior, Xc)
        AL = A @ state.chol
        return A @ state.mean + b + oc, c + jnp.sum(AL**2, 1)

    return jax.lax.map(one, (X, offset))


def latent_moments(model, prior, state: State, X, offset=None, chunk_size: int = 4096):
    """Mean and variance (each (N,)) of the latent ``f(X)`` under the variational posterior."""
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    ch = make_chunks(X, None, offset, chunk_size)
    m, v = _moments(model, prior, state, ch.X, ch.offset)
    return m.reshape(-1)[:N], v.reshape(-1)[:N]
