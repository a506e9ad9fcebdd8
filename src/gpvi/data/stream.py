"""Data streams: fixed-size minibatches of rows from memory, memory-mapped ``.npy`` files,
Parquet or CSV files, or any iterator of batches.

A *source* knows how to produce the rows of one epoch as a sequence of raw blocks
``(X, y, offset)`` (NumPy, any number of rows each); :meth:`Stream.minibatches` cuts them into
:class:`Batch` es of exactly ``batch_size`` rows, the last one padded (``mask`` 0 on padding), so
that one compiled program serves every batch.  Nothing here knows about models or engines: the
stochastic engines (``engines/sfp.py``, ``engines/svi.py``) consume the batches.

Shuffling (per epoch, reproducible from ``seed`` and the epoch number):

- in-memory arrays: a full random permutation of the rows each epoch;
- ``.npy`` memory maps and Parquet files: the order of *blocks* of rows (``block_rows``
  contiguous rows of a memory map, the file's row groups for Parquet) is permuted, and rows are
  shuffled within a buffer of about ``buffer_rows`` rows (several blocks) before being cut into
  batches — random access into a file larger than memory would be far slower than reading it
  in order, so the shuffle is local (as in TensorFlow's ``shuffle`` buffer);
- CSV files are read in order (pyarrow's streaming reader has no random access), shuffled only
  within the buffer;
- user iterators: the batches are used in the order given, rows shuffled within the buffer.

Bad data raise ``ValueError`` naming the batch (its index within the epoch) and the row.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

__all__ = ["Batch", "Stream", "StreamObjective", "from_arrays", "from_npy", "from_parquet", "from_csv",
           "from_iterator", "as_stream"]

DEFAULT_BUFFER_ROWS = 1 << 16
DEFAULT_BLOCK_ROWS = 1 << 16


class Batch(NamedTuple):
    """One minibatch of exactly ``batch_size`` rows (NumPy arrays).

    ``X`` (B, D), ``y`` (B,), ``offset`` (B,) and ``mask`` (B,) with 1 on real rows and 0 on
    the padding of the last batch of an epoch (padding repeats the batch's first row so every
    term stays finite).  ``rows`` is the number of real rows, ``index`` the batch's position in
    its epoch (from 0), ``epoch`` the epoch (from 0), ``last`` whether it ends the epoch.
    """

    X: np.ndarray
    y: np.ndarray
    offset: np.ndarray
    mask: np.ndarray
    rows: int
    index: int
    epoch: int
    last: bool


def _check_batch_size(batch_size, num_rows):
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if num_rows is not None and batch_size > num_rows:
        raise ValueError(f"batch_size {batch_size} is larger than the number of rows N = {num_rows}")
    return int(batch_size)


class Stream:
    """Base class of data sources; see the module docstring.

    Subclasses implement :meth:`_blocks` (the raw blocks of one epoch) and set ``num_rows``
    (None when unknown) and ``num_features``.
    """

    num_rows: int | None = None
    num_features: int | None = None
    buffer_rows: int = DEFAULT_BUFFER_ROWS
    name: str = "stream"

    def _blocks(self, epoch: int, rng: np.random.Generator | None) -> Iterator[tuple]:
        raise NotImplementedError

    def minibatches(self, batch_size: int, *, epoch: int = 0, seed: int = 0,
                    shuffle: bool = True) -> Iterator[Batch]:
        """The batches of one pass over the data (epoch ``epoch``), each of exactly
        ``batch_size`` rows (the last padded, see :class:`Batch`)."""
        B = _check_batch_size(batch_size, self.num_rows)
        rng = np.random.default_rng([int(seed), int(epoch)]) if shuffle else None
        buf_rows = max(int(self.buffer_rows), B)
        pending: list[tuple] = []
        npending = 0
        index = 0
        seen = 0  # rows of the epoch handed on so far (for row numbers in messages)
        D = self.num_features

        def emit(X, y, off, last):
            nonlocal index
            r = X.shape[0]
            mask = np.ones(B)
            if r < B:
                pad = B - r
                X = np.concatenate([X, np.repeat(X[:1], pad, 0)])
                y = np.concatenate([y, np.repeat(y[:1], pad)])
                off = np.concatenate([off, np.repeat(off[:1], pad)])
                mask[r:] = 0.0
            b = Batch(X, y, off, mask, r, index, int(epoch), last)
            index += 1
            return b

        def drain(final):
            # Shuffle the buffered rows and cut them into batches; keep the remainder unless final.
            nonlocal pending, npending
            X = np.concatenate([p[0] for p in pending])
            y = np.concatenate([p[1] for p in pending])
            off = np.concatenate([p[2] for p in pending])
            if rng is not None:
                perm = rng.permutation(X.shape[0])
                X, y, off = X[perm], y[perm], off[perm]
            n_full = X.shape[0] // B
            out = [(X[i * B:(i + 1) * B], y[i * B:(i + 1) * B], off[i * B:(i + 1) * B]) for i in range(n_full)]
            rest = (X[n_full * B:], y[n_full * B:], off[n_full * B:])
            if final:
                if rest[0].shape[0]:
                    out.append(rest)
                pending, npending = [], 0
            else:
                pending = [rest] if rest[0].shape[0] else []
                npending = rest[0].shape[0]
            return out

        queue: list = []
        for k, raw in enumerate(self._blocks(int(epoch), rng)):
            # errors name the source's own batch (block) k: a user's batch, a row group, ...
            X, y, off = _check_block(raw, D, k, seen, self.name)
            if D is None:
                D = self.num_features = X.shape[1]
            seen += X.shape[0]
            if X.shape[0] == 0:
                continue
            pending.append((X, y, off))
            npending += X.shape[0]
            if npending >= buf_rows:
                queue.extend(drain(False))
                # hand on all but the last full batch: the next one may turn out to be the last
                while len(queue) > 1:
                    yield emit(*queue.pop(0), last=False)
        if pending:
            queue.extend(drain(True))
        if not queue:
            raise ValueError(f"{self.name}: epoch {epoch} produced no rows (an exhausted or empty source)")
        if self.num_rows is not None and seen != self.num_rows:
            raise ValueError(f"{self.name}: epoch {epoch} produced {seen} rows, expected N = {self.num_rows} "
                             "(the data changed while streaming)")
        if self.num_rows is None and B > seen:
            raise ValueError(f"batch_size {B} is larger than the number of rows N = {seen}")
        for i, q in enumerate(queue):
            yield emit(*q, last=i == len(queue) - 1)

    def count_rows(self) -> int:
        """The number of rows N (one pass without shuffling when the source does not know it)."""
        if self.num_rows is None:
            n = 0
            for raw in self._blocks(0, None):
                n += np.shape(raw[0])[0]
            self.num_rows = n
        return self.num_rows

    def head(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first ``rows`` rows (or all, if fewer) in file order: ``(X, y, offset)``, e.g. for
        k-means placement of inducing inputs."""
        got, n = [], 0
        for raw in self._blocks(0, None):
            # (every batch must have the first one's columns when the source does not say how many)
            D = self.num_features if self.num_features is not None or not got else got[0][0].shape[1]
            X, y, off = _check_block(raw, D, len(got), n, self.name)
            got.append((X, y, off))
            n += X.shape[0]
            if n >= rows:
                break
        if not got:
            raise ValueError(f"{self.name}: the source produced no rows")
        X, y, off = (np.concatenate([g[k] for g in got])[:rows] for k in range(3))
        return X, y, off


def _check_block(raw, D, batch, row0, name):
    """``(X, y, offset)`` of one raw block as float64 arrays, checked: rectangular, matching
    lengths, finite.  Errors name the batch index and the row (counted from the epoch's start)."""
    if not isinstance(raw, (tuple, list)) or len(raw) not in (2, 3):
        raise ValueError(f"{name}: batch {batch} must be a tuple (X, y) or (X, y, offset), got {type(raw).__name__}")
    try:
        X = np.asarray(raw[0], dtype=np.float64)
        y = np.asarray(raw[1], dtype=np.float64)
        off = np.zeros(y.shape[:1]) if len(raw) == 2 or raw[2] is None else np.asarray(raw[2], dtype=np.float64)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name}: batch {batch} is ragged or not numeric: {err}") from None
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{name}: batch {batch} has X of shape {X.shape}; expected (rows, D)")
    if D is not None and X.shape[1] != D:
        raise ValueError(f"{name}: batch {batch} has {X.shape[1]} columns; earlier batches had {D} (ragged stream)")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(f"{name}: batch {batch} has {X.shape[0]} rows of X but y of shape {y.shape} (ragged batch)")
    if off.shape != y.shape:
        raise ValueError(f"{name}: batch {batch} has offset of shape {off.shape}; expected {y.shape}")
    for what, a in (("X", X), ("y", y), ("offset", off)):
        bad = ~np.isfinite(a)
        if bad.any():
            r = int(np.flatnonzero(bad.reshape(a.shape[0], -1).any(axis=1))[0])
            raise ValueError(f"{name}: batch {batch}, row {r} (row {row0 + r} of the epoch) has a NaN or "
                             f"infinite value in {what}")
    return X, y, off


# ---- in-memory arrays -------------------------------------------------------------------------

class ArrayStream(Stream):
    """Rows of in-memory arrays; each epoch a full random permutation (see :func:`from_arrays`)."""

    def __init__(self, X, y, offset=None, name="arrays"):
        X, y, off = _check_block((X, y, offset), None, 0, 0, name)
        if X.shape[0] == 0:
            raise ValueError(f"{name}: X has no rows")
        self.X, self.y, self.offset = X, y, off
        self.num_rows, self.num_features = X.shape
        self.name = name
        self.buffer_rows = self.num_rows  # the whole array is the shuffle buffer

    def _blocks(self, epoch, rng):
        # The permutation is applied by minibatches' buffer shuffle (one buffer = all rows).
        yield self.X, self.y, self.offset


def from_arrays(X, y, offset=None) -> ArrayStream:
    """A stream over in-memory ``X`` (N, D), ``y`` (N,) and optional ``offset`` (N,)."""
    return ArrayStream(X, y, offset)


# ---- files ------------------------------------------------------------------------------------

class _FileStream(Stream):
    """Remembers size and modification time of its files and refuses to read changed ones."""

    def _remember(self, paths):
        from gpvi.data.sources import Watched

        self._watch = Watched([p for p in paths if p is not None])

    def _check_unchanged(self):
        self._watch.check()


def _permuted(n, rng):
    return rng.permutation(n) if rng is not None else np.arange(n)


class SourceStream(Stream):
    """Minibatches from a random-access :class:`gpvi.data.sources.Source` (``.npy`` memory maps,
    Parquet row groups, arrays): the source's blocks in a random order each epoch, rows shuffled
    within the buffer.  The batch executors of :mod:`gpvi.data.executors` read the same sources."""

    def __init__(self, source, *, buffer_rows=DEFAULT_BUFFER_ROWS):
        self.source = source
        self.name = source.describe()
        self.num_rows = int(source.num_rows)
        self.num_features = int(source.num_cols)
        self.buffer_rows = int(buffer_rows)
        if self.buffer_rows < 1:
            raise ValueError(f"{self.name}: buffer_rows must be positive")

    def _blocks(self, epoch, rng):
        self.source.check_unchanged()
        for j in _permuted(self.source.num_blocks, rng):
            yield self.source.read_block(int(j))
        self.source.check_unchanged()


class NpyStream(SourceStream):
    """Memory-mapped ``.npy`` files (see :func:`from_npy`)."""

    def __init__(self, X_path, y_path, offset_path=None, *, block_rows=DEFAULT_BLOCK_ROWS,
                 buffer_rows=DEFAULT_BUFFER_ROWS):
        from gpvi.data.sources import NpySource

        super().__init__(NpySource(X_path, y_path, offset_path, block_rows=block_rows), buffer_rows=buffer_rows)


def from_npy(X_path, y_path, offset_path=None, *, block_rows=DEFAULT_BLOCK_ROWS,
             buffer_rows=DEFAULT_BUFFER_ROWS) -> NpyStream:
    """A stream over memory-mapped ``.npy`` files: ``X`` (N, D), ``y`` (N,), optional offset
    (N,).  Blocks of ``block_rows`` contiguous rows are read in a random order and shuffled
    within a buffer of ``buffer_rows`` rows."""
    return NpyStream(X_path, y_path, offset_path, block_rows=block_rows, buffer_rows=buffer_rows)


def _table_columns(names, x_columns, y_column, offset_column, where):
    if y_column not in names:
        raise ValueError(f"{where}: no column {y_column!r} (y_column); columns: {names}")
    if offset_column is not None and offset_column not in names:
        raise ValueError(f"{where}: no column {offset_column!r} (offset_column); columns: {names}")
    if x_columns is None:
        x_columns = [c for c in names if c not in (y_column, offset_column)]
    x_columns = list(x_columns)
    missing = [c for c in x_columns if c not in names]
    if missing:
        raise ValueError(f"{where}: no column(s) {missing} (x_columns); columns: {names}")
    if not x_columns:
        raise ValueError(f"{where}: no feature columns")
    return x_columns


def _table_to_arrays(table, x_columns, y_column, offset_column):
    from gpvi.data.sources import numeric_column

    X = np.column_stack([numeric_column(table, c) for c in x_columns]) if x_columns \
        else np.zeros((table.num_rows, 0))
    y = numeric_column(table, y_column)
    off = None if offset_column is None else numeric_column(table, offset_column)
    return X, y, off


class ParquetStream(SourceStream):
    """A Parquet file read one row group at a time (see :func:`from_parquet`)."""

    def __init__(self, path, y_column, x_columns=None, offset_column=None, *, buffer_rows=DEFAULT_BUFFER_ROWS):
        import pyarrow.parquet as pq

        from gpvi.data.sources import ParquetSource

        where = f"parquet stream {os.fspath(path)!r}"
        if not Path(path).is_file():
            raise ValueError(f"{where}: file {os.fspath(path)!r} does not exist")
        try:
            names = pq.ParquetFile(path).schema_arrow.names
        except Exception as err:  # pyarrow's ArrowInvalid and friends
            raise ValueError(f"{where}: cannot read as Parquet: {err}") from None
        x_columns = _table_columns(names, x_columns, y_column, offset_column, where)
        super().__init__(ParquetSource(path, target=y_column, features=x_columns, offset=offset_column),
                         buffer_rows=buffer_rows)
        self.x_columns, self.y_column, self.offset_column = x_columns, y_column, offset_column
        self.num_row_groups = self.source.num_blocks


def from_parquet(path, y_column, x_columns=None, offset_column=None, *,
                 buffer_rows=DEFAULT_BUFFER_ROWS) -> ParquetStream:
    """A stream over a Parquet file, read one row group at a time (row groups in a random
    order each epoch, rows shuffled within a buffer of ``buffer_rows``).  ``x_columns``
    defaults to every column but ``y_column`` and ``offset_column``."""
    return ParquetStream(path, y_column, x_columns, offset_column, buffer_rows=buffer_rows)


class CsvStream(_FileStream):
    """A CSV file read in blocks by pyarrow's streaming reader (see :func:`from_csv`)."""

    def __init__(self, path, y_column, x_columns=None, offset_column=None, *, block_bytes=1 << 24,
                 buffer_rows=DEFAULT_BUFFER_ROWS, num_rows=None):
        self.name = f"csv stream {os.fspath(path)!r}"
        self._remember([path])
        self.path = Path(path)
        self.block_bytes = int(block_bytes)
        reader = self._reader()
        names = reader.schema.names
        self.x_columns = _table_columns(names, x_columns, y_column, offset_column, self.name)
        self.y_column, self.offset_column = y_column, offset_column
        self.num_features = len(self.x_columns)
        self.buffer_rows = int(buffer_rows)
        self.num_rows = num_rows

    def _reader(self):
        import pyarrow.csv as pcsv

        try:
            return pcsv.open_csv(self.path, read_options=pcsv.ReadOptions(block_size=self.block_bytes))
        except Exception as err:
            raise ValueError(f"{self.name}: cannot read as CSV: {err}") from None

    def _blocks(self, epoch, rng):
        self._check_unchanged()
        reader = self._reader()
        k = 0
        while True:
            try:
                rb = reader.read_next_batch()
            except StopIteration:
                break
            except Exception as err:
                raise ValueError(f"{self.name}, block {k}: {err}") from None
            try:
                yield _table_to_arrays(rb, self.x_columns, self.y_column, self.offset_column)
            except ValueError as err:
                raise ValueError(f"{self.name}, block {k}: {err}") from None
            k += 1
        self._check_unchanged()


def from_csv(path, y_column, x_columns=None, offset_column=None, *, block_bytes=1 << 24,
             buffer_rows=DEFAULT_BUFFER_ROWS, num_rows=None) -> CsvStream:
    """A stream over a CSV file read in blocks of ``block_bytes`` (in file order; rows shuffled
    within a buffer of ``buffer_rows``).  ``num_rows`` is counted by a first pass if not given."""
    s = CsvStream(path, y_column, x_columns, offset_column, block_bytes=block_bytes,
                  buffer_rows=buffer_rows, num_rows=num_rows)
    s.count_rows()
    return s


# ---- user iterators ---------------------------------------------------------------------------

class IteratorStream(Stream):
    """Batches from a user's iterable (see :func:`from_iterator`)."""

    def __init__(self, source, num_rows=None, *, buffer_rows=DEFAULT_BUFFER_ROWS):
        self.name = "iterator stream"
        self.source = source
        self._used = False
        if num_rows is not None and (isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer))
                                     or num_rows < 1):
            raise ValueError(f"num_rows must be a positive int or None, got {num_rows!r}")
        self.num_rows = None if num_rows is None else int(num_rows)
        self.buffer_rows = int(buffer_rows)

    def _iterate(self):
        src = self.source
        if callable(src):
            it = src()
        elif iter(src) is src:  # a one-shot iterator (generator): one epoch only
            if self._used:
                raise ValueError(f"{self.name}: the iterator is exhausted (it was consumed by an earlier pass); "
                                 "pass a function that returns a fresh iterator for each epoch")
            it = src
        else:
            it = iter(src)
        self._used = True
        return iter(it)

    def _blocks(self, epoch, rng):
        replay, self._replay = getattr(self, "_replay", None), None
        if replay is not None:
            # head() took these batches from a one-shot iterator: hand them on first
            blocks, it = replay
            yield from blocks
            yield from it
            return
        yield from self._iterate()

    def head(self, rows):
        src = self.source
        if callable(src) or iter(src) is not src or self._used:
            return super().head(rows)
        # a one-shot iterator: keep what is read here for the first epoch
        it = self._iterate()
        blocks, n = [], 0
        for raw in it:
            blocks.append(raw)
            n += np.shape(raw[0])[0]
            if n >= rows:
                break
        self._replay = (blocks, it)
        got = [_check_block(raw, self.num_features, k, 0, self.name) for k, raw in enumerate(blocks)]
        if not got:
            raise ValueError(f"{self.name}: the source produced no rows")
        return tuple(np.concatenate([g[k] for g in got])[:rows] for k in range(3))


def from_iterator(source: Iterable | Callable[[], Iterable], num_rows: int | None = None, *,
                  buffer_rows=DEFAULT_BUFFER_ROWS) -> IteratorStream:
    """A stream over batches ``(X, y)`` or ``(X, y, offset)`` of any sizes.

    ``source`` is a re-iterable (a list), a function returning a fresh iterator for each epoch,
    or a one-shot iterator (then only one pass is possible; a second raises ``ValueError``).
    ``num_rows`` (N) is needed by the stochastic engines' N/B scaling; if None it is counted
    by one extra pass, which a one-shot iterator cannot afford.
    """
    return IteratorStream(source, num_rows, buffer_rows=buffer_rows)


def as_stream(data, y=None, offset=None, **kw) -> Stream:
    """``data`` as a :class:`Stream`: a Stream unchanged; arrays ``(X, y)``; a ``.npy`` /
    ``.parquet`` / ``.csv`` path (then ``y`` names the target: the y file or the y column)."""
    if isinstance(data, Stream):
        return data
    if isinstance(data, (str, os.PathLike)):
        p = Path(data)
        suf = "".join(p.suffixes[-2:]).lower() if p.suffix.lower() == ".gz" else p.suffix.lower()
        if suf == ".npy":
            return from_npy(p, y, offset, **kw)
        if suf in (".parquet", ".pq"):
            return from_parquet(p, y, offset_column=offset, **kw)
        if suf in (".csv", ".tsv", ".csv.gz"):
            return from_csv(p, y, offset_column=offset, **kw)
        raise ValueError(f"cannot stream {str(p)!r}: expected a .npy, .parquet or .csv file")
    if y is None:
        return from_iterator(data, **kw)
    return from_arrays(data, y, offset)


class StreamObjective(NamedTuple):
    """The VLB of ``model`` on data read as a :class:`Stream` of minibatches: what a minibatch
    engine (``sfp``, ``svi``) takes as its ``objective`` when the data are not in memory
    (:func:`gpvi.fit_stream`).  Unlike an in-memory :class:`gpvi.objective.Objective` it gives
    no full-data VLB: the engine's trace then holds each epoch's mean minibatch estimate, and
    its result's gap is NaN."""

    model: object
    stream: Stream


class MappedStream(Stream):
    """``source`` with ``fn(X, y, offset) -> (X, y, offset)`` applied to every raw block (e.g.
    standardisation); see :meth:`Stream.map`."""

    def __init__(self, source: Stream, fn):
        self.source, self.fn = source, fn
        self.name = source.name
        self.num_rows, self.num_features = source.num_rows, source.num_features
        self.buffer_rows = source.buffer_rows

    def _blocks(self, epoch, rng):
        for raw in self.source._blocks(epoch, rng):
            X, y = raw[0], raw[1]
            off = raw[2] if len(raw) > 2 and raw[2] is not None else np.zeros(np.shape(y)[:1])
            yield self.fn(np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64),
                          np.asarray(off, dtype=np.float64))

    def count_rows(self):
        self.num_rows = self.source.count_rows()
        return self.num_rows


def _map(self, fn) -> MappedStream:
    """This stream with ``fn(X, y, offset) -> (X, y, offset)`` applied to every block of rows
    as it is read (NumPy; e.g. standardisation or ``log`` of an exposure column)."""
    return MappedStream(self, fn)


Stream.map = _map
