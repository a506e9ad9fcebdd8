"""The variational state ``State(mean, chol)`` (whitened coordinates, prior ``N(0, I)``), the data
sums an engine reads (:class:`Sums`), the chunks of rows they are taken over (:class:`Chunks`), and
the helpers for several latent blocks."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gpvi._batching import map_latents
from gpvi.models.base import kl_standard_normal


DEFAULT_CHUNK = 2048
DEFAULT_CACHE_BYTES = 512 * 2**20


class State(NamedTuple):
    """Variational parameters: ``q(w) = N(mean, chol cholᵀ)``; shapes (d,) and (d, d).

    ``chol`` must be lower triangular (the KL term reads ``log det V`` from its diagonal);
    :func:`gpvi.fit` re-factorises a user-supplied ``init``.
    """

    mean: jax.Array
    chol: jax.Array


class Sums(NamedTuple):
    """The VLB and the data sums at one state.

    ``grad = Σ ρ_i a_i − m`` is ∂VLB/∂m and ``S = Σ λ_i a_i a_iᵀ``, so that
    ``∂VLB/∂V = (S + V⁻¹ − I)/2``.  With ``clip_gamma`` the matrix is instead
    ``Σ min(λ_i, 0) a_i a_iᵀ`` (γ = −λ clipped at 0, for non-log-concave likelihoods).
    """

    vlb: jax.Array
    grad: jax.Array
    S: jax.Array
    #: Each row's curvature in the means of its Q latents, ``∂²E_i/∂m_i∂m_iᵀ`` (C, n, Q, Q),
    #: zero on padding; only for latents that the likelihood couples (``Objective.coupled``),
    #: where the joint Newton direction needs it (:func:`coupled_direction`).  Else ``None``.
    rows_h: jax.Array | None = None
    #: ``tr(S V)`` (per latent), from the pass's marginal variances (``Σ λ_i a_iᵀ V a_i``), for
    #: the gap estimate; ``None`` where the sums were not taken by :meth:`Objective.sums`.
    trSV: jax.Array | None = None


class Chunks(NamedTuple):
    """Rows split into equal chunks, padded; ``mask`` is 1 on real rows, 0 on padding."""

    X: jax.Array  # (C, n, D)
    y: jax.Array  # (C, n)
    offset: jax.Array  # (C, n)
    mask: jax.Array  # (C, n)


def prior_state(d: int, num_latents: int | None = None) -> State:
    """The prior ``N(0, I)`` as a state (the default starting point); with ``num_latents = Q``
    (a model with latent blocks, :mod:`gpvi.models.multilatent`) a batch of Q blocks, mean (Q, d) and
    chol (Q, d, d)."""
    # built in NumPy and transferred with jax.device_put: jnp.zeros/jnp.eye, and jnp.asarray of a
    # host array, would each compile a small program for every new d
    if num_latents is None:
        return State(*jax.device_put((np.zeros(d), np.eye(d))))
    return State(*jax.device_put((np.zeros((num_latents, d)), np.broadcast_to(np.eye(d), (num_latents, d, d)).copy())))


# ---- several latent functions --------------------------------------------------------------
# A state whose mean is (Q, d) holds Q independent latent blocks (gpvi.models.multilatent): every
# per-latent operation below is the single-latent one mapped over the leading axis with
# map_latents (block by block, never a batched LAPACK call: see gpvi._batching), chosen at trace
# time from the static number of dimensions, so a single-latent model runs exactly the program
# it always ran.  The likelihood sees each row's Q latents together.


def is_batched(state) -> bool:
    """Whether ``state`` holds several latent blocks (mean (Q, d))."""
    return state.mean.ndim == 2


def per_latent(fn, batched: bool, *args):
    """``fn(*args)``, or mapped over the leading (latent) axis of every argument."""
    return map_latents(fn, *args) if batched else fn(*args)


def per_latent_products(fn, batched: bool, *args):
    """:func:`per_latent` for an ``fn`` made of matrix products and element-wise operations
    only (no LAPACK call): batched with ``jax.vmap``.  XLA then runs batched dots on the
    stacked operands, where :func:`~gpvi._batching.map_latents` slices each latent's block out
    of them, and XLA:CPU copies every such slice (on USPS 4-7-9, three latents at d = 1233,
    those copies were a fifth of a data pass).  A LAPACK call inside ``fn`` would become a
    batched one, which can hang XLA:CPU (see :mod:`gpvi._batching`;
    ``tests/integration/test_hang.py`` checks the multi-latent programs for them)."""
    return jax.vmap(fn)(*args) if batched else fn(*args)


def kl_state(state) -> jax.Array:
    """``KL(q || prior)`` summed over latent blocks (the prior is ``N(0, I)`` in each)."""
    return jnp.sum(per_latent_products(kl_standard_normal, is_batched(state), state.mean, state.chol))
