"""Predictions from a fitted variational posterior, in chunks of rows."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._batching import map_latents
from gpvi.objective import State, make_chunks
from gpvi._compile import jit

__all__ = ["latent_moments", "likelihood_call"]

#: Latent blocks up to which the prediction's map over them is unrolled (see ``_moments``).
PREDICT_UNROLL_LIMIT = 16


def _chunk_moments(mean, chol, At, b, c, oc):
    V = chol @ chol.T
    return mean @ At + b + oc, c + jnp.sum((V @ At) * At, 0)


@jit
def _moments(model, prior, state, X, offset):
    def one(args):
        Xc, oc = args
        At, b, c = model.project(prior, Xc)
        if state.mean.ndim == 2:  # Q latent blocks: (n, Q) marginals
            # unrolled up to 16 latents, as when the stored model files of
            # tests/integration/test_model_files.py were written: saved models predict bit for bit
            # (lax.map changes the last bits, 1e-15 relative)
            m, v = map_latents(lambda *a: _chunk_moments(*a, oc), state.mean, state.chol, At, b, c,
                               unroll_limit=PREDICT_UNROLL_LIMIT)
            return m.T, v.T
        return _chunk_moments(state.mean, state.chol, At, b, c, oc)

    return jax.lax.map(one, (X, offset))


def latent_moments(model, prior, state: State, X, offset=None, chunk_size: int = 2048):
    """Mean and variance (each an (N,) NumPy array; (N, Q) for Q latent functions) of the
    latent ``f(X)`` under the variational posterior."""
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    ch = make_chunks(X, None, offset, chunk_size)
    m, v = _moments(model, prior, state, ch.X, ch.offset)
    tail = np.shape(m)[2:]
    return np.asarray(m).reshape((-1,) + tail)[:N], np.asarray(v).reshape((-1,) + tail)[:N]


@partial(jit, static_argnames=("method",))
def likelihood_call(likelihood, method: str, *args):
    """``likelihood.<method>(*args)``, compiled as one program.

    Called eagerly, a likelihood's predictive formulas would run (and compile) operation by
    operation; jitted they compile once per likelihood class and array shape.
    """
    return getattr(likelihood, method)(*args)
