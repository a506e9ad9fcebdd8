"""Executors of the data pass: in-process over a block source, or on a Dask cluster.

Every batch engine needs from the data only the three sums of :mod:`gpvi.objective` per pass
(and, when hyperparameters are learned, ``Σ E_i`` with its gradient in them).  These sums
decompose over blocks of rows, so a pass is a *map* — each block of a :class:`~gpvi.data.sources.Source`
to its partial sums — followed by a *combine*, :func:`gpvi.objective.add_partials`, which adds
the parts pairwise in a tree fixed by the number of blocks alone.  The result therefore does not
depend on the number of workers or the order in which they finish.

- :class:`InProcess` computes the blocks one after another in this process, reading the next
  block in a background thread while the current one computes, and keeps the blocks (and their
  projections ``a_i``) in memory up to the budget ``cache_bytes``; blocks beyond it are read and
  projected again in every pass.
- :class:`DaskExecutor` (``pip install "gpvi[dask]"``) reads every block once on a
  ``dask.distributed`` worker, keeps it there across passes, and sends each pass's
  ``(model, prior, state)`` to the workers; only partial sums travel back.  A worker lost during
  a pass has its blocks re-read from the source and its tasks rerun by the scheduler, and since
  each block's sums are computed by the same program from the same rows, the result equals an
  undisturbed run.

:class:`BlockObjective` puts either executor behind the :class:`~gpvi.objective.Objective`
interface, so the engines and the hyperparameter driver run on it unchanged.  This module never
imports Dask itself: a ``distributed.Client`` is recognised by duck typing.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from gpvi.models.base import SparseGP
from gpvi.objective import sparse_envelope_expected, sparse_envelope_kl
from gpvi.objective import DEFAULT_CACHE_BYTES, DEFAULT_CHUNK, Chunks, Objective, Sums, expected_pass, data_pass, add_partials, expected_in_hyperparameters, finish_sums, num_blocks, split_rows
from gpvi.data.sources import Source
from gpvi._watchdog import paused
from gpvi._compile import jit

__all__ = ["InProcess", "DaskExecutor", "BlockObjective", "resolve_executor", "block_layout"]


# ---- one block: rows → padded chunks → partial sums ----------------------------------------------
def block_layout(source: Source, chunk_size: int):
    """``(C, n)``: every block is padded to C chunks of n rows, one compiled shape for all."""
    n = max(1, min(int(chunk_size), source.max_block_rows))
    return -(-source.max_block_rows // n), n


def load_block(source: Source, j: int, layout, likelihood) -> Chunks:
    """Block ``j`` of ``source`` as NumPy :class:`~gpvi.objective.Chunks` of shape ``layout``;
    the observations are checked by ``likelihood`` (an error names the block's first row)."""
    X, y, off = source.read_block(j)
    try:
        y = likelihood.validate(y)
    except ValueError as e:
        raise ValueError(f"{source.describe()}, block {j} (rows {source.block_starts[j]}–"
                         f"{source.block_starts[j + 1] - 1}): {e}") from None
    C, n = layout
    rows = X.shape[0]
    pad = C * n - rows
    off = np.zeros(rows) if off is None else off

    def padded(a):
        a = np.concatenate([a, np.repeat(a[:1], pad, axis=0)]) if pad else a
        return a.reshape((C, n) + a.shape[1:])

    mask = np.concatenate([np.ones(rows), np.zeros(pad)]).reshape(C, n)
    return Chunks(padded(X), padded(np.asarray(y, np.float64)), padded(off), mask)


def _no_proj(chunks):
    return jnp.zeros(chunks.X.shape[:1] + (0,))


@partial(jit, static_argnames=("cached", "blocks", "want_hessian", "clip_gamma"))
def _block_sums(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma):
    proj = proj if cached else _no_proj(chunks)
    return data_pass(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma)


@partial(jit, static_argnames=("cached", "blocks"))
def _block_expected(model, prior, chunks, proj, state, cached, blocks):
    proj = proj if cached else _no_proj(chunks)
    return expected_pass(model, prior, chunks, proj, state, cached, blocks)


def _expected_from_theta(theta, template, prior_X, chunks, state, blocks):
    from gpvi._module import unflatten_params

    model = unflatten_params(template, theta)
    if type(model) is SparseGP:  # q held fixed over the inducing values, as in memory (sparse_envelope)
        return sparse_envelope_expected(model, chunks, state)
    return expected_in_hyperparameters(model, model.prior_cache(prior_X), chunks, state, blocks)


def _neg_sparse_kl(theta, template, state):
    from gpvi._module import unflatten_params

    return -sparse_envelope_kl(unflatten_params(template, theta), state)


_sparse_kl_and_grad = jit(jax.value_and_grad(_neg_sparse_kl))


_block_hyper = jit(jax.value_and_grad(_expected_from_theta), static_argnames=("blocks",))


def block_partial(kind, chunks, proj, arrays, statics):
    """The partial result of one block: ``kind`` is ``"sums"``, ``"vlb"`` or ``"hyper"``;
    ``arrays`` the pass's array arguments (a pytree that may be placed on a device), ``statics``
    its Python-valued ones."""
    if kind == "sums":
        (model, prior, state), (cached, blocks, want_hessian, clip_gamma) = arrays, statics
        return _block_sums(model, prior, chunks, proj, state, cached, blocks, want_hessian, clip_gamma)
    if kind == "vlb":
        (model, prior, state), (cached, blocks) = arrays, statics
        return _block_expected(model, prior, chunks, proj, state, cached, blocks)
    (theta, template, prior_X, state), (blocks,) = arrays, statics
    return _block_hyper(theta, template, prior_X, chunks, state, blocks)


@partial(jit, static_argnames=("blocks",))
def _project(model, prior, chunk_X, blocks):
    pcache = model.pass_cache(prior)

    def one(Xc):
        At, b, c = model.project_many(pcache, Xc)
        return split_rows(At, blocks), b, c
    return jax.lax.map(one, chunk_X)


def _to_numpy_arrays(args):
    arrays, statics = args
    return _to_numpy(arrays), statics


def _to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


# ---- executors -------------------------------------------------------------------------------------
class InProcess:
    """The data pass in this process (see the module docstring).

    ``prefetch``: read the next block in a background thread while the current one computes.
    ``devices``: JAX devices to spread the blocks over (block j on ``devices[j % len]``, kept
    there across passes; each pass's arguments are copied to every device once), e.g.
    ``jax.devices("gpu")``.  Default: JAX's default device only.  JAX dispatches asynchronously,
    so blocks on different devices compute at the same time.
    """

    name = "in-process"

    def __init__(self, prefetch: bool = True, devices=None):
        self.prefetch = bool(prefetch)
        if devices is not None:
            devices = list(devices)
            if not devices or not all(hasattr(d, "platform") for d in devices):
                raise ValueError(f"devices must be a non-empty list of JAX devices, got {devices!r}")
        self.devices = devices

    def open(self, source, layout, likelihood, cache_bytes=DEFAULT_CACHE_BYTES):
        """A plan of passes over ``source`` (kept for the whole fit, across hyperparameters)."""
        return _InProcessPlan(self, source, layout, likelihood, cache_bytes)


class _InProcessPlan:
    def __init__(self, ex, source, layout, likelihood, cache_bytes):
        self.ex, self.source, self.layout, self.likelihood = ex, source, layout, likelihood
        self.model = self.prior = self.blocks = None
        self.cache = {}  # block → (chunks on the device, projections or None)
        # What one row costs to keep: its data (D + 3 floats: inputs, target, offset, mask) and,
        # when its projection is kept too, d + 2 floats more.
        self._row_bytes = 8 * (source.num_cols + 3)
        self._budget = int(cache_bytes)

    def configure(self, model, prior, d, blocks):
        """Use ``model`` and its ``prior`` from now on: kept projections are dropped (they
        depend on the hyperparameters), kept rows stay."""
        self.model, self.prior, self.blocks = model, prior, blocks
        self.cache = {j: (ch, None) for j, (ch, _) in self.cache.items()}
        C, n = self.layout
        rows = C * n
        with_proj = rows * (self._row_bytes + 8 * (d + 2))
        raw = rows * self._row_bytes
        nb = self.source.num_blocks
        # Keep projections of as many blocks as fit; then raw rows of as many more as fit.
        self.n_proj = int(min(nb, self._budget // max(with_proj, 1)))
        left = self._budget - self.n_proj * with_proj
        self.n_raw = int(min(nb - self.n_proj, max(left, 0) // max(raw, 1)))

    def _device(self, j):
        devs = self.ex.devices
        return None if devs is None else devs[j % len(devs)]

    def _get(self, j):
        chunks, proj = self.cache.get(j, (None, None))
        if chunks is None:
            chunks = jax.device_put(load_block(self.source, j, self.layout, self.likelihood), self._device(j))
        if proj is None and j < self.n_proj:
            dev = self._device(j)
            model, prior = (self.model, self.prior) if dev is None else jax.device_put((self.model, self.prior), dev)
            proj = _project(model, prior, chunks.X, self.blocks)
        if j < self.n_proj + self.n_raw:
            self.cache[j] = (chunks, proj)
        return chunks, proj, proj is not None

    def map(self, kind, args_for):
        """Partial results of every block in block order; ``args_for(cached)`` gives the
        ``(arrays, statics)`` arguments for a block with or without kept projections."""
        self.source.check_unchanged()
        nb = self.source.num_blocks
        out = []
        arrays, _ = args_for(False)
        devs = self.ex.devices
        on = {d: jax.device_put(arrays, d) for d in devs} if devs is not None else None
        pool = concurrent.futures.ThreadPoolExecutor(1) if self.ex.prefetch and nb > 1 else None
        try:
            nxt = pool.submit(self._get, 0) if pool else None
            for j in range(nb):
                entry = nxt.result() if pool else self._get(j)
                if pool and j + 1 < nb:
                    nxt = pool.submit(self._get, j + 1)
                chunks, proj, cached = entry
                a = arrays if on is None else on[self._device(j)]
                out.append(block_partial(kind, chunks, proj if cached else jnp.zeros(()), a, args_for(cached)[1]))
        finally:
            if pool:
                pool.shutdown(wait=True, cancel_futures=True)
        if on is not None:  # to one device before adding up
            out = jax.device_put(out, devs[0])
        return out

    def close(self):
        self.cache.clear()


_RETRYABLE = {"FutureCancelledError", "CancelledError", "KilledWorker", "CommClosedError"}


def _identity(x):
    return x


def _dask_load(source, j, layout, likelihood):
    return load_block(source, j, layout, likelihood)


_malloc_tuned = False


def _tune_malloc():
    """Undo, once per worker process, what ``MALLOC_TRIM_THRESHOLD_`` does to glibc's allocator.

    dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``; setting it also freezes
    glibc's mmap threshold at 128 KiB, so every XLA temporary above that (a chunk's features are
    ~5 MB) is mapped and unmapped, page faults and all, on every call.  Measured on one 65 536-row
    block (M = 300): 0.43 s in a worker against 0.17 s in the client process, 2.4× the CPU time.
    Raising both thresholds with ``mallopt`` gives 0.17 s there too.  Linux/glibc only; elsewhere
    (or without the variable) nothing is changed."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: glibc's maximum on 64-bit
        libc.mallopt(-1, 128 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def _dask_partial(kind, chunks, args):
    _tune_malloc()
    return _to_numpy(block_partial(kind, jax.tree_util.tree_map(jnp.asarray, chunks), jnp.zeros(()), *args))


class DaskExecutor:
    """The data pass on a ``dask.distributed`` cluster (``client`` a ``distributed.Client``).

    Blocks are read on the workers once and kept there (``persist``); a pass sends the
    model, prior and state once to every worker and maps the blocks to partial sums, which
    are added here in a fixed order.  ``retries``: how many times a pass task is rerun after
    a worker failure before the error is raised.
    """

    name = "dask"

    def __init__(self, client, retries: int = 3):
        if not (hasattr(client, "submit") and hasattr(client, "scatter") and hasattr(client, "gather")):
            raise ValueError(f"executor: expected a dask.distributed Client, got {type(client).__name__}")
        self.client = client
        self.retries = int(retries)

    def open(self, source, layout, likelihood, cache_bytes=None):
        """A plan of passes over ``source``: its blocks are read onto the workers now and kept
        there for the whole fit (``cache_bytes`` does not apply: worker memory holds them).
        A ``ValueError`` if the client is closed (Dask's own ``ClosedClientError`` said only that
        it could not send a message)."""
        status = getattr(self.client, "status", "running")
        if status in ("closing", "closed"):
            raise ValueError(f"executor: the dask.distributed Client is {status}; connect a new one "
                             "(distributed.Client(...)) or fit in this process (executor=None or 'local')")
        return _DaskPlan(self, source, layout, likelihood)


class _DaskPlan:
    def __init__(self, ex, source, layout, likelihood):
        self.ex, self.source = ex, source
        self.args = (layout, likelihood)
        self._load()

    def _load(self):
        # Nothing is scattered: data a worker holds only because it was scattered there is gone
        # for good when that worker dies, whereas the result of a task whose inputs are in its
        # own description is recomputed by the scheduler.  So the source (and, in map, each
        # pass's arguments) travel inside tasks.
        client, source = self.ex.client, self.source
        src = client.submit(_identity, source, pure=False)
        self.blocks_f = [client.submit(_dask_load, src, j, *self.args, pure=False, retries=self.ex.retries)
                         for j in range(source.num_blocks)]

    def configure(self, model, prior, d, blocks):
        pass

    def map(self, kind, args_for):
        self.source.check_unchanged()
        client = self.ex.client
        for attempt in range(self.ex.retries + 1):
            args = client.submit(_identity, _to_numpy_arrays(args_for(False)), pure=False)
            futs = [client.submit(_dask_partial, kind, b, args, pure=False, retries=self.ex.retries)
                    for b in self.blocks_f]
            try:
                with paused():  # the work is done in the cluster's processes
                    return client.gather(futs)
            except Exception as e:  # a lost worker can cancel a pass; rerun it, from re-read blocks if need be
                if attempt == self.ex.retries or type(e).__name__ not in _RETRYABLE:
                    raise
                if any(f.status in ("error", "cancelled", "lost") for f in self.blocks_f):
                    self._load()

    def close(self):
        for f in self.blocks_f:
            f.release()
        self.blocks_f = []


def resolve_executor(executor):
    """``None``/``"local"`` → :class:`InProcess`; ``"devices"`` → :class:`InProcess` over every
    device of JAX's default backend; a ``distributed.Client`` → :class:`DaskExecutor`; an executor
    instance passes through."""
    if executor is None or (isinstance(executor, str) and executor in ("local", "in-process")):
        return InProcess()
    if isinstance(executor, (InProcess, DaskExecutor)):
        return executor
    if isinstance(executor, str) and executor == "devices":
        return InProcess(devices=jax.devices())
    if isinstance(executor, str) and executor == "dask":
        raise ValueError('executor="dask" needs a cluster: pass executor=distributed.Client(...) '
                         '(pip install "gpvi[dask]")')
    if hasattr(executor, "submit") and hasattr(executor, "scatter") and hasattr(executor, "gather"):
        return DaskExecutor(executor)
    raise ValueError("executor must be None, 'local' (in this process), 'devices' (every JAX device), "
                     "a dask.distributed Client, "
                     f"or a gpvi.data.executors executor; got {executor!r}")


@jit
def _prior(model, X):
    from gpvi.objective import all_finite

    prior = model.prior_cache(X)
    return prior, all_finite(prior)


_finish = jit(finish_sums, static_argnames=("blocks", "want_hessian"))


class BlockObjective(Objective):
    """An :class:`~gpvi.objective.Objective` whose data pass runs block by block over a
    :class:`~gpvi.data.sources.Source` on an executor (see the module docstring).

    ``prior_X``: the inputs the model's prior needs (all training inputs for a full GP, unused
    otherwise).  Per-row engines (``dual``, ``laplace``) need the rows in memory and do not run on
    it; :func:`gpvi.fit` says so.
    """

    def __init__(self, model, source: Source, *, executor=None, plan=None, prior_X=None,
                 chunk_size=DEFAULT_CHUNK, cache_bytes=DEFAULT_CACHE_BYTES, blocks: int | None = None):
        self.model = model
        self.source = source
        self.num_data = int(source.num_rows)
        shape_X = np.broadcast_to(0.0, (source.num_rows, source.num_cols))
        self.dim = model.num_weights(shape_X)
        self.blocks = num_blocks(self.dim) if blocks is None else int(blocks)
        if not 1 <= self.blocks <= self.dim:
            raise ValueError(f"blocks must be between 1 and the number of weights ({self.dim}), got {blocks!r}")
        self.prior_X = jnp.zeros((0, source.num_cols)) if prior_X is None else jnp.asarray(prior_X)
        self.prior, self._prior_finite = _prior(model, self.prior_X)
        self.check_prior()  # before a plan of its own is opened
        self.cached = False
        self._owns_plan = plan is None
        if plan is None:  # a plan of its own (fit() shares one plan among the objectives of a fit)
            plan = resolve_executor(executor).open(source, block_layout(source, chunk_size), model.likelihood,
                                                   cache_bytes)
        self.plan = plan
        self.plan.configure(model, self.prior, self.dim, self.blocks)
        self.num_evaluations = 0

    @property
    def chunks(self):
        raise AttributeError("a BlockObjective has no in-memory chunks: its rows are read block by block")

    def sums(self, state, want_hessian: bool = True, clip_gamma: bool = False) -> Sums:
        self.num_evaluations += 1
        model, prior, blocks = self.model, self.prior, self.blocks
        parts = self.plan.map("sums", lambda cached: ((model, prior, state),
                                                      (cached, blocks, want_hessian, clip_gamma)))
        total = add_partials(jax.tree_util.tree_map(jnp.asarray, parts))
        return Sums(*_finish(total, state, blocks, want_hessian))

    def vlb(self, state):
        self.num_evaluations += 1
        from gpvi.models.base import kl_standard_normal

        parts = self.plan.map("vlb", lambda cached: ((self.model, self.prior, state), (cached, self.blocks)))
        return add_partials([jnp.asarray(p) for p in parts]) - kl_standard_normal(state.mean, state.chol)

    def neg_vlb_and_grad(self, theta, template, state):
        """``(−VLB, −∂VLB/∂θ)`` at the unconstrained hyperparameters ``theta`` (a dict, see
        :func:`gpvi._module.flatten_params`) of ``template``, with ``state`` held fixed: the
        whitened state, or for a sparse GP ``q(u)`` over the inducing values
        (:func:`gpvi.objective.sparse_envelope`, as the in-memory search does)."""
        from gpvi.models.base import kl_standard_normal

        parts = self.plan.map("hyper", lambda cached: ((theta, template, self.prior_X, state), (self.blocks,)))
        val, grad = add_partials(jax.tree_util.tree_map(jnp.asarray, parts))
        if type(template) is SparseGP:  # the KL of q(u) held over the inducing values depends on θ
            neg_kl, g_kl = _sparse_kl_and_grad(theta, template, state)
            val, grad = val + neg_kl, jax.tree_util.tree_map(jnp.add, grad, g_kl)
        else:
            val = val - kl_standard_normal(state.mean, state.chol)
        return -val, jax.tree_util.tree_map(lambda g: -g, grad)

    def close(self):
        """Release what the plan keeps (blocks in memory or on workers) if this objective owns it."""
        if self._owns_plan:
            self.plan.close()

