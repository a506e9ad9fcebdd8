"""Where the rows of a fit come from, read block by block: arrays, ``.npy`` files, Parquet.

A *source* hands out the training rows ``(X, y, offset)`` as numbered *blocks* of consecutive
rows, each read on its own (:meth:`Source.read_block`), so that a data pass never needs more
than a block of the data in memory and a block can be read by whichever process computes its
partial sums (see :mod:`gpvi.data.executors`).

- :class:`ArraySource` — in-memory arrays (the default path of :func:`gpvi.fit`).
- :class:`NpySource` — ``.npy`` files opened as memory maps; pages are read as blocks need them.
- :class:`ParquetSource` — a Parquet file read one row group at a time (pyarrow); its blocks are
  its row groups.

File sources record each file's size and modification time when opened and check them before
every read and every pass (:meth:`Source.check_unchanged`): a file that changes or disappears
between passes raises a ``ValueError`` naming it, because continuing would silently mix sums over
two different data sets.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["Source", "ArraySource", "NpySource", "ParquetSource", "DEFAULT_BLOCK_ROWS"]

#: Rows per block of the array and ``.npy`` sources: 32 chunks of the default 2048 rows.
DEFAULT_BLOCK_ROWS = 65_536


class Source:
    """Rows ``(X, y, offset)`` in numbered blocks.

    Subclasses set ``num_rows``, ``num_cols``, ``has_offset`` and ``block_starts`` (the first
    row of every block plus ``num_rows`` at the end) and implement :meth:`_read`.
    """

    num_rows: int
    num_cols: int
    has_offset: bool = False
    block_starts: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_starts) - 1

    @property
    def max_block_rows(self) -> int:
        return int(np.max(np.diff(self.block_starts)))

    def describe(self) -> str:
        return type(self).__name__

    def check_unchanged(self) -> None:
        """Raise ``ValueError`` if the data behind the source changed since it was opened."""

    def read_block(self, j: int):
        """``(X (n, D), y (n,), offset (n,) or None)`` of block ``j`` as float64 arrays, checked
        for non-finite inputs (the error names the row in the whole data set)."""
        if not 0 <= j < self.num_blocks:
            raise IndexError(f"block {j} of {self.describe()} does not exist ({self.num_blocks} blocks)")
        self.check_unchanged()
        start = self.block_starts[j]
        X, y, off = self._read(j)
        y = np.asarray(y)  # in the likelihood's coding; checked by the likelihood where it is used
        X = np.ascontiguousarray(X, dtype=np.float64).reshape(len(y), -1)
        if X.shape[1] != self.num_cols:
            raise ValueError(f"{self.describe()}: block {j} has {X.shape[1]} input columns, expected {self.num_cols}")
        _check_finite(X, f"{self.describe()} X", start)
        if off is not None:
            off = np.ascontiguousarray(off, dtype=np.float64)
            _check_finite(off[:, None], f"{self.describe()} offset", start)
        return X, y, off

    def read_all(self):
        """All rows at once (for models whose prior needs every input, the full GP)."""
        parts = [self.read_block(j) for j in range(self.num_blocks)]
        X = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        off = np.concatenate([p[2] for p in parts]) if self.has_offset else None
        return X, y, off

    def _read(self, j):
        raise NotImplementedError


def _check_finite(X, what, start):
    bad = ~np.isfinite(X)
    if bad.any():
        i, k = np.argwhere(bad)[0]
        raise ValueError(f"{what} has a NaN or infinite value in row {start + int(i)}, column {int(k)}")


def _even_blocks(N, block_rows):
    block_rows = int(block_rows)
    if block_rows < 1:
        raise ValueError(f"block_rows must be a positive int, got {block_rows!r}")
    return tuple(range(0, N, block_rows)) + (N,)


class ArraySource(Source):
    """In-memory arrays ``X`` (N, D), ``y`` (N,), optional ``offset`` (N,), in blocks of
    ``block_rows`` rows."""

    def __init__(self, X, y, offset=None, *, block_rows: int = DEFAULT_BLOCK_ROWS):
        X = np.asarray(X, dtype=np.float64)
        X = X[:, None] if X.ndim == 1 else X
        y = np.asarray(y)
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise ValueError(f"ArraySource needs X (N, D) and y (N,), got shapes {X.shape} and {y.shape}")
        if X.shape[0] == 0:
            raise ValueError("ArraySource: X is empty")
        self.X, self.y = X, y
        self.offset = None if offset is None else np.asarray(offset, dtype=np.float64).reshape(-1)
        if self.offset is not None and self.offset.shape != y.shape:
            raise ValueError(f"ArraySource: offset must have one entry per row ({len(y)}), got {self.offset.shape}")
        self.num_rows, self.num_cols = X.shape
        self.has_offset = self.offset is not None
        self.block_starts = _even_blocks(self.num_rows, block_rows)

    def _read(self, j):
        a, b = self.block_starts[j], self.block_starts[j + 1]
        return self.X[a:b], self.y[a:b], None if self.offset is None else self.offset[a:b]


class Watched:
    """Size and modification time of files, checked on demand."""

    def __init__(self, paths):
        self.paths = [str(Path(p)) for p in paths]
        self.stamps = [self._stamp(p) for p in self.paths]

    @staticmethod
    def _stamp(p):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise ValueError(f"data file {p} does not exist") from None
        return st.st_size, st.st_mtime_ns

    def check(self):
        for p, s in zip(self.paths, self.stamps):
            try:
                st = os.stat(p)
            except FileNotFoundError:
                raise ValueError(f"data file {p} disappeared while it was being read (during a fit or "
                                 "stream); going on would mix two data sets") from None
            if (st.st_size, st.st_mtime_ns) != s:
                raise ValueError(f"data file {p} changed while it was being read (size or modification time "
                                 "differ from when it was opened); refusing to mix two versions of the data")


class NpySource(Source):
    """``.npy`` files opened as memory maps: ``X`` (N, D) and ``y`` (N,), optional ``offset`` (N,).

    Only the pages of the block being read are loaded, so a pass over a file larger than memory
    keeps one block resident at a time (the OS may keep more in its page cache).
    """

    def __init__(self, X, y, offset=None, *, block_rows: int = DEFAULT_BLOCK_ROWS):
        paths = [X, y] + ([offset] if offset is not None else [])
        self._watch = Watched(paths)
        self._paths = tuple(self._watch.paths)
        self._open()
        if self._X.ndim not in (1, 2) or self._y.ndim != 1 or self._X.shape[0] != self._y.shape[0]:
            raise ValueError(f"NpySource: X {self._paths[0]} must be (N, D) and y {self._paths[1]} (N,) with the "
                             f"same N, got shapes {self._X.shape} and {self._y.shape}")
        if self._off is not None and self._off.shape != self._y.shape:
            raise ValueError(f"NpySource: offset {self._paths[2]} must have shape {self._y.shape}, got {self._off.shape}")
        self.num_rows = int(self._y.shape[0])
        if self.num_rows == 0:
            raise ValueError(f"NpySource: {self._paths[1]} holds no rows")
        self.num_cols = 1 if self._X.ndim == 1 else int(self._X.shape[1])
        self.has_offset = self._off is not None
        self.block_starts = _even_blocks(self.num_rows, block_rows)

    def _open(self):
        mm = [np.load(p, mmap_mode="r") for p in self._paths]
        self._X, self._y = mm[0], mm[1]
        self._off = mm[2] if len(mm) > 2 else None

    def __getstate__(self):  # memory maps are reopened where the source is unpickled (a worker)
        d = dict(self.__dict__)
        d["_X"] = d["_y"] = d["_off"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._watch.check()
        self._open()

    def describe(self):
        return f"NpySource({self._paths[0]})"

    def check_unchanged(self):
        self._watch.check()

    def _read(self, j):
        a, b = self.block_starts[j], self.block_starts[j + 1]
        return (np.array(self._X[a:b]), np.array(self._y[a:b]),
                None if self._off is None else np.array(self._off[a:b]))


class ParquetSource(Source):
    """A Parquet file read one row group at a time (needs pyarrow: ``pip install "gpvi[parquet]"``).

    ``target`` names the column of observations; ``features`` the input columns (default: every
    other numeric column except ``offset``); ``offset`` an optional column of latent offsets.
    Each row group is one block; write the file with row groups of 10⁴–10⁶ rows.
    """

    def __init__(self, path, target: str, features=None, offset: str | None = None):
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pragma: no cover - pyarrow is in the test extras
            raise ImportError('ParquetSource needs pyarrow: pip install "gpvi[parquet]"') from e
        self._watch = Watched([path])
        self.path = self._watch.paths[0]
        meta = pq.ParquetFile(self.path).metadata
        names = list(meta.schema.names)
        for what, col in (("target", target), ("offset", offset)):
            if col is not None and col not in names:
                raise ValueError(f"ParquetSource: {what} column {col!r} is not in {self.path} (columns: {names})")
        if features is None:
            features = [c for c in names if c not in (target, offset)]
        else:
            features = [features] if isinstance(features, str) else list(features)
            missing = [c for c in features if c not in names]
            if missing:
                raise ValueError(f"ParquetSource: feature columns {missing} are not in {self.path} (columns: {names})")
        if not features:
            raise ValueError(f"ParquetSource: no feature columns in {self.path}")
        self.target, self.features, self.offset_column = target, features, offset
        self.num_rows = int(meta.num_rows)
        if self.num_rows == 0:
            raise ValueError(f"ParquetSource: {self.path} holds no rows")
        self.num_cols = len(features)
        self.has_offset = offset is not None
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._groups = [i for i, s in enumerate(sizes) if s > 0]
        self.block_starts = tuple(np.concatenate([[0], np.cumsum([sizes[i] for i in self._groups])]).tolist())

    def describe(self):
        return f"ParquetSource({self.path})"

    def check_unchanged(self):
        self._watch.check()

    def _read(self, j):
        import pyarrow.parquet as pq

        cols = self.features + [self.target] + ([self.offset_column] if self.offset_column else [])
        table = pq.ParquetFile(self.path).read_row_group(self._groups[j], columns=cols)
        try:
            X = np.column_stack([numeric_column(table, c) for c in self.features])
            off = numeric_column(table, self.offset_column) if self.offset_column else None
            col = table.column(self.target)
            if col.null_count:
                raise ValueError(f"column {self.target!r} has {col.null_count} missing value(s)")
            y = col.to_numpy(zero_copy_only=False)  # in the likelihood's coding (labels may be text)
        except ValueError as err:
            raise ValueError(f"{self.describe()}, row group {self._groups[j]}: {err}") from None
        return X, y, off


def numeric_column(table, c):
    """Column ``c`` of a pyarrow table as float64; missing or non-numeric values are errors."""
    a = table.column(c)
    if a.null_count:
        raise ValueError(f"column {c!r} has {a.null_count} missing value(s)")
    try:
        return a.to_numpy(zero_copy_only=False).astype(np.float64)
    except Exception as err:  # pyarrow raises its own types
        raise ValueError(f"column {c!r} is not numeric: {err}") from None
