"""Rows in fixed-size chunks (:func:`make_chunks`, padded to size buckets so that programs are
shared), the device copy of the inputs, and what an Objective precomputes once (:func:`chunk_setup`)."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gpvi.models.base import GLM, SparseGP
from gpvi.objective.state import Chunks, DEFAULT_CHUNK
from gpvi.objective.blocks import trim_triangular, split_rows
from gpvi.objective.passes import all_finite
from gpvi._compile import jit


def make_chunks(X, y=None, offset=None, chunk_size: int = DEFAULT_CHUNK, bucketed: bool = False) -> Chunks:
    """Split (N, D) inputs and (N,) targets/offsets into padded (C, n, ·) chunks.

    The fewest chunks of at most ``chunk_size`` rows, all of one size ``n``: padding is then
    under C rows, where chunks of exactly ``chunk_size`` rows would pad up to ``chunk_size − 1``
    (N = 2049 would cost two full chunks; at N = 20 000 the 2.4 % padding cost ~4 % of a pass).
    With ``bucketed``, ``n`` is rounded up to :func:`gpvi._compile.bucket` (at most
    ``chunk_size``), so that nearby N share one chunk shape and hence one compiled program.
    """
    X = np.asarray(X, dtype=np.float64)
    N = X.shape[0]
    C = -(-N // int(max(1, chunk_size)))
    n = -(-N // C) if C else 1
    if bucketed:
        from gpvi._compile import bucket

        n = max(n, min(bucket(n), int(chunk_size)))
    pad = C * n - N
    y = np.zeros(N) if y is None else np.asarray(y, dtype=np.float64)
    offset = np.zeros(N) if offset is None else np.asarray(offset, dtype=np.float64)

    def padded(a):
        if pad:
            # Pad with copies of the first row so padded terms stay finite; the mask drops them.
            a = np.concatenate([a, np.repeat(a[:1], pad, axis=0)], axis=0)
        return a.reshape((C, n) + a.shape[1:])

    mask = np.concatenate([np.ones(N), np.zeros(pad)])
    # jax.device_put, not jnp.asarray: see as_device_array
    return Chunks(*jax.device_put((padded(X), padded(y), padded(offset), mask.reshape(C, n))))





@partial(jit, static_argnames=("cached", "blocks"))
def chunk_setup(model, X, chunk_X, cached, blocks):
    """The prior cache, whether it is finite, and (``cached``) the projections of all chunks in
    row blocks — one compiled program for everything an :class:`Objective` precomputes."""
    prior = model.prior_cache(X)
    finite = all_finite(prior)
    train = training_chunks(model, prior, X, chunk_X, blocks) if cached else None
    if train is not None:
        return prior, finite, train
    if cached:
        pcache = model.pass_cache(prior)

        def one(Xc):
            At, b, c = model.project_many(pcache, Xc)
            return split_rows(At, blocks), b, c
        return prior, finite, jax.lax.map(one, chunk_X)
    return prior, finite, jnp.zeros(chunk_X.shape[:1] + (0,))


def training_chunks(model, prior, X, chunk_X, blocks):
    """The projections of all chunks, in row blocks, gathered from
    :meth:`gpvi.models.Model.training_projection` where the model has one (the full GP:
    ``At = Lᵀ``, no triangular solve per chunk); ``None`` otherwise.

    Only for a model that is not :func:`bucketable`, whose chunks are the prior's own inputs
    ``X`` padded with copies of row 0 (:func:`make_chunks`)."""
    train = None if bucketable(model) else model.training_projection(prior)
    if train is None:
        return None
    N, (C, n) = X.shape[0], chunk_X.shape[:2]
    idx = np.concatenate([np.arange(N), np.zeros(C * n - N, int)]).reshape(C, n)
    At, b, c = (jnp.moveaxis(t[..., idx], -2, 0) for t in train)
    rows = split_rows(At, blocks)
    if C == 1 and blocks > 1 and model.triangular_training_projection():
        # one chunk holding the rows in order (padding after them): row block j is zero before
        # column e_j, and the passes skip those zeros (gpvi.objective.blocks.trim_triangular)
        rows = trim_triangular(rows)
    return rows, b, c


def as_device_array(X) -> jax.Array:
    """``X`` as a float64 device array.  A host (NumPy) array is transferred with
    ``jax.device_put``: ``jnp.asarray`` of a host array stages it through a small compiled
    program specialised to its shape (jax 0.10), so every new training-set size compiled one
    more program even when the fit's own programs were shared through a size bucket."""
    if isinstance(X, jax.Array) and X.dtype == jnp.float64:
        return X
    return jax.device_put(np.asarray(X, dtype=np.float64))


#: Largest training set whose rows are padded to a size bucket for a model of several latents
#: (:func:`pads_rows`).  Padding costs up to 20 % more rows per pass, and a pass of Q latents
#: costs Q times one latent's: a three-class softmax sparse GP on 3 000 rows (two chunks of
#: 1 500 padded to 1 720) took 0.86-0.90 s per fit instead of 0.73-0.81 s.  Below this size the
#: passes take milliseconds and a new compiled shape seconds, so sharing programs wins.
MULTI_LATENT_BUCKET_MAX = 1024


def pads_rows(model, num_rows: int) -> bool:
    """Whether the data sums of ``model`` on ``num_rows`` rows are taken over rows padded to a
    size bucket: a :func:`bucketable` model, and for several latents only up to
    :data:`MULTI_LATENT_BUCKET_MAX` rows."""
    if not bucketable(model):
        return False
    return getattr(model, "latents", None) is None or int(num_rows) <= MULTI_LATENT_BUCKET_MAX


def bucketable(model) -> bool:
    """Whether ``model``'s data sums are taken over rows padded to a size bucket
    (:func:`gpvi._compile.bucket`): the sparse GP and the GLM, whose weights do not depend on
    N, and a :class:`~gpvi.models.multilatent.MultiLatent` of such latents.  (A full GP has one
    weight per row: padding would change its prior; see :mod:`gpvi.fitting.collapsed` for the
    Gaussian case, where padding is exact.)"""
    latents = getattr(model, "latents", None)
    if latents is not None:
        return all(type(l) in (SparseGP, GLM) for l in latents)
    return type(model) in (SparseGP, GLM)


def prior_inputs(model, X, chunks: Chunks):
    """The inputs :meth:`Model.prior_cache` is compiled for: the padded rows of ``chunks`` for a
    :func:`bucketable` model (which ignores them), so its shape is the bucket's, else ``X``."""
    return chunks.X.reshape((-1,) + chunks.X.shape[2:]) if bucketable(model) else X
