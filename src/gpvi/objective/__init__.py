"""The variational lower bound and its data sums, taken in chunks of rows.

Everything an engine needs from the data is three sums over observations
(DESIGN §1): ``Σ E_i`` (scalar), ``Σ ρ_i a_i`` (vector) and ``Σ λ_i a_i a_iᵀ`` (matrix).
:class:`Objective` computes them with a ``lax.scan`` over fixed-size chunks of rows, so the
working memory is O(chunk·d + d²) whatever N is.  When the projections ``a_i`` of all rows fit
in ``cache_bytes`` they are computed once and kept, which saves the kernel evaluation in every
later pass; otherwise they are recomputed chunk by chunk (for the sparse GP the pass then sums in
the raw kernel features and maps the sums through L⁻¹ once, see :func:`data_pass`).  Either way
they are held in row blocks (see :func:`num_blocks`), so that the two O(n·d²) products of a pass
skip the zero half of the triangular covariance factor and the upper half of the symmetric
``Σ λ_i a_i a_iᵀ``.

The variational state is ``State(mean, chol)`` with ``V = chol cholᵀ`` in the whitened
coordinates of :mod:`gpvi.models` (prior ``N(0, I)``).

The package's modules: :mod:`~gpvi.objective.state` (State, Sums, Chunks, several latent blocks),
:mod:`~gpvi.objective.chunks` (rows in chunks and size buckets), :mod:`~gpvi.objective.blocks`
(projections in row blocks), :mod:`~gpvi.objective.passes` (one pass over the data),
:mod:`~gpvi.objective.newton` (the joint Newton direction of coupled latents),
:mod:`~gpvi.objective.vlb` (:class:`Objective`), :mod:`~gpvi.objective.hyper` (the VLB as a
function of the hyperparameters) and :mod:`~gpvi.objective.minibatch` (one scaled minibatch).
Every public name is importable from ``gpvi.objective`` itself.
"""
from __future__ import annotations

from gpvi.objective.state import (Chunks, DEFAULT_CACHE_BYTES, DEFAULT_CHUNK, State, Sums, is_batched, kl_state,
                                  per_latent, prior_state)
from gpvi.objective.chunks import (MULTI_LATENT_BUCKET_MAX, as_device_array, bucketable, chunk_setup, make_chunks,
                                   pads_rows, prior_inputs, training_chunks)
from gpvi.objective.blocks import (assemble_gram, assemble_rows, block_edges, block_gram, block_matvec, block_sum_squares,
                                   block_vecmat, chunk_projection, marginals_stacked, num_blocks, pass_projection,
                                   raw_marginals, raw_operator, split_gram, split_rows, stacked_state, trim_triangular,
                                   zero_gram)
from gpvi.objective.passes import (add_partials, all_finite, data_pass, data_sums, expected_pass, expected_vlb,
                                   finish_sums, latent_moments_of_rows)
from gpvi.objective.newton import coupled_direction
from gpvi.objective.vlb import Objective
from gpvi.objective.hyper import (expected_in_hyperparameters, full_gp_latents, sparse_envelope,
                                  sparse_envelope_expected, sparse_envelope_kl, vlb_envelope, vlb_in_hyperparameters)
from gpvi.objective.minibatch import (minibatch_projection, minibatch_sums, minibatch_vlb, split_batch)

__all__ = ["State", "Sums", "Chunks", "Objective", "make_chunks", "prior_state", "minibatch_sums", "minibatch_vlb"]
