"""Mapping a function over latent blocks without batched LAPACK calls.

A model with Q latent functions keeps its variational state as Q stacked blocks, and every
per-latent step (a Cholesky factor, a triangular solve, a gap estimate) is the single-latent
one applied to each block.  ``jax.vmap`` would turn those steps into *batched* LAPACK custom
calls, and on XLA:CPU a batched call whose work exceeds about 2·10⁵ flops splits its batch into
sub-tasks on the intra-op thread pool and blocks its own pool thread until they finish
(``ParallelBatchMap`` in jaxlib's ``lapack_kernels.cc``).  When as many such calls run at once
as the pool has threads — which XLA's concurrency-optimised scheduler does with independent
operations, and two Python threads fitting at once can do too — every pool thread waits for
sub-tasks that no thread is free to run: the process hangs for ever at 0 % CPU (seen with
jax/jaxlib 0.10.2 on two cores, in most multiclass fits).

:func:`map_latents` applies the function to each block separately (a sequential ``lax.map``;
a single block is called directly), so every LAPACK call in gpvi's programs is unbatched and
runs inline on the thread that starts it.  ``tests/integration/test_hang.py`` checks the compiled programs of the
multi-latent fits for batched LAPACK calls.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["map_latents", "UNROLL_LIMIT"]

# Up to this many blocks the map is unrolled (one copy of the body per block, which XLA may run
# side by side); beyond it a sequential lax.map keeps the program's size independent of Q.
# Unrolling three or more blocks bought no parallelism on two cores and cost compilation and
# copies: with lax.map for Q = 3 (2026-11-29, 2-core AMD EPYC, jax 0.10.2) the USPS 4-7-9 learned
# fit compiled its programs in 8.6 s against 11.5 s and ran its natural steps in 1.0 s against 1.7
# s, iris's first GPClassifier fit with an empty cache took 4.6–4.8 s against 5.0–5.5 s, and
# the second fits of iris, wine and 10-class digits were within noise (benchmarks/README.md,
# "The deadlock cure").  Up to 16 blocks were unrolled before.
UNROLL_LIMIT = 1


def _num_blocks(args) -> int:
    leaves = jax.tree.leaves(args)
    if not leaves:
        raise ValueError("map_latents needs at least one array argument")
    sizes = {int(jnp.shape(leaf)[0]) for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"map_latents: the arguments' leading (latent) axes differ: {sorted(sizes)}")
    return sizes.pop()


def map_latents(fn, *args, unroll_limit: int | None = None):
    """``fn`` applied to the blocks ``args[q]`` (every array leaf indexed on its leading axis),
    results stacked on a new leading axis: ``jax.vmap(fn)(*args)`` without batching ``fn``'s
    operations.  ``None`` arguments (empty pytrees) pass through as ``None``.  Up to
    ``unroll_limit`` blocks (default :data:`UNROLL_LIMIT`) the map is unrolled, beyond it a
    ``lax.map``; the two can differ in the last bits."""
    Q = _num_blocks(args)
    if Q > (UNROLL_LIMIT if unroll_limit is None else unroll_limit):
        return jax.lax.map(lambda a: fn(*a), args)
    outs = [fn(*jax.tree.map(lambda leaf, q=q: leaf[q], args)) for q in range(Q)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
