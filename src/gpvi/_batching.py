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

:func:`map_latents` applies the function to each block separately (a static unrolled loop, or
``lax.map`` for many blocks), so every LAPACK call in gpvi's programs is unbatched and runs
inline on the thread that starts it; independent blocks can still run in parallel, as separate
operations scheduled by XLA.  ``tests/integration/test_hang.py`` checks the compiled programs of the
multi-latent fits for batched LAPACK calls.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["map_latents", "UNROLL_LIMIT"]

# Up to this many blocks the map is unrolled (one copy of the body per block, which XLA may run
# side by side); beyond it a sequential lax.map keeps the program's size independent of Q.
UNROLL_LIMIT = 16


def _num_blocks(args) -> int:
    leaves = jax.tree.leaves(args)
    if not leaves:
        raise ValueError("map_latents needs at least one array argument")
    sizes = {int(jnp.shape(leaf)[0]) for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"map_latents: the arguments' leading (latent) axes differ: {sorted(sizes)}")
    return sizes.pop()


def map_latents(fn, *args):
    """``fn`` applied to the blocks ``args[q]`` (every array leaf indexed on its leading axis),
    results stacked on a new leading axis: ``jax.vmap(fn)(*args)`` without batching ``fn``'s
    operations.  ``None`` arguments (empty pytrees) pass through as ``None``."""
    Q = _num_blocks(args)
    if Q > UNROLL_LIMIT:
        return jax.lax.map(lambda a: fn(*a), args)
    outs = [fn(*jax.tree.map(lambda leaf, q=q: leaf[q], args)) for q in range(Q)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
