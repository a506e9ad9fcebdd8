"""Reading the command line's tables (CSV, Parquet): numeric columns and features with clear errors on
missing or overflowing values, and the target's labels, coding and likelihood."""
from __future__ import annotations

import csv
import dataclasses
import difflib
import gzip
import math
from pathlib import Path

import numpy as np
from gpvi.cli.common import (AUTO_INTEGER_CLASSES, MAX_CLASSES, PARQUET_SUFFIXES, UsageError, split)


# Cell values that mean "no value" (compared case-insensitively after stripping blanks): what
# spreadsheets, R and pandas write for a missing cell.  "none" is not among them: it is a
# plausible class label.
MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "-nan", "null", "#n/a", "<na>", "?"})



# ---------------------------------------------------------------------------------------------
# Reading tables
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Table:
    """Columns of a data file by name: lists of strings (CSV) or arrays/lists (Parquet)."""

    path: str
    columns: dict
    nrows: int
    lines: list | None = None  # CSV line number of each row (for messages)

    def where(self, i: int) -> str:
        return f"line {self.lines[i]}" if self.lines is not None else f"row {i + 1}"

    def require(self, name: str, what: str = "column", note: str = ""):
        if name not in self.columns:
            hint = difflib.get_close_matches(name, list(self.columns), n=1)
            names = list(self.columns)
            shown = ", ".join(repr(c) for c in names[:12]) + (", …" if len(names) > 12 else "")
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise UsageError(f"{what} {name!r}{note} not found in {self.path}{extra}; its columns are {shown}")
        return self.columns[name]


def read_table(path) -> Table:
    """Read a CSV (``.csv``, ``.tsv``, optionally ``.gz``) or Parquet (``.parquet``) file."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not a data file")
    if p.suffix.lower() in PARQUET_SUFFIXES:
        return _read_parquet(p, str(path))
    return _read_csv(p, str(path))


def _read_csv(p: Path, name: str) -> Table:
    lower = p.name.lower()
    opener = gzip.open if lower.endswith(".gz") else open
    delimiter = "\t" if lower.removesuffix(".gz").endswith(".tsv") else ","
    try:
        with opener(p, "rt", newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            header = None
            for row in reader:
                if row and any(c.strip() for c in row):
                    header = [c.strip() for c in row]
                    break
            if header is None:
                raise UsageError(f"{name} is empty: expected a header line with column names")
            for j, c in enumerate(header):
                if not c:
                    raise UsageError(f"{name}: column {j + 1} of the header line has no name")
            dup = sorted({c for c in header if header.count(c) > 1})
            if dup:
                raise UsageError(f"{name}: the header names column {dup[0]!r} more than once")
            cols = [[] for _ in header]
            lines = []
            end = reader.line_num  # line numbers as a user counts them: the header line is line 1
            for row in reader:
                start, end = end + 1, reader.line_num  # a quoted field may span lines: name the first
                if not row or not any(c.strip() for c in row):
                    continue  # blank line
                if len(row) != len(header):
                    raise UsageError(f"{name} line {start} has {len(row)} fields but the header "
                                     f"has {len(header)} columns")
                for col, v in zip(cols, row):
                    col.append(v)
                lines.append(start)
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not a UTF-8 text CSV file (for Parquet, name it .parquet)") from None
    except (csv.Error, gzip.BadGzipFile, EOFError) as err:
        raise UsageError(f"{name} could not be read as CSV: {err}") from None
    if not lines:
        raise UsageError(f"{name} has a header but no data rows")
    return Table(name, dict(zip(header, cols)), len(lines), lines)


def _read_parquet(p: Path, name: str) -> Table:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError('reading Parquet files needs pyarrow, which is not installed: '
                         'pip install "gpvi[parquet]"') from None
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as err:
        raise UsageError(f"{name} is not a readable Parquet file: {str(err).splitlines()[0]}") from None
    cols = {}
    for field, col in zip(table.schema, table.columns):
        t = field.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            arr = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
            cols[field.name] = np.asarray(arr, dtype=np.float64)  # nulls become NaN
        else:
            cols[field.name] = col.to_pylist()
    if table.num_rows == 0:
        raise UsageError(f"{name} has no data rows")
    return Table(name, cols, table.num_rows)


def _is_missing(v) -> bool:
    """Whether a cell value means "no value": None, NaN, or one of :data:`MISSING_TOKENS`."""
    if v is None:
        return True
    if isinstance(v, str):
        return v.strip().lower() in MISSING_TOKENS
    return isinstance(v, float) and math.isnan(v)


def _missing_error(table: Table, name: str, what: str, rows) -> UsageError:
    """``missing value in <what> 'name' on line N of FILE`` for the first of ``rows``."""
    i = rows[0]
    vals = table.columns[name]
    v = vals[i]
    shown = f" {v.strip()!r}" if isinstance(v, str) and v.strip() else ""
    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
    return UsageError(f"missing value{shown} in {what} {name!r} on {table.where(i)} of {table.path}{more}")


def numeric_column(table: Table, name: str, what: str = "column") -> np.ndarray:
    """Column ``name`` as float64, or a UsageError naming the column and the first missing,
    non-numeric or non-finite value."""
    vals = table.require(name, what)
    if isinstance(vals, np.ndarray):  # Parquet: nulls are NaN
        arr = vals.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            i = int(bad[0])
            if np.isnan(arr[i]):
                raise _missing_error(table, name, what, np.flatnonzero(np.isnan(arr)).tolist())
            more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
            raise UsageError(f"{what} {name!r} has non-finite value {arr[i]!r} on {table.where(i)} of "
                             f"{table.path}{more}")
        return arr
    try:  # the common case: every cell a finite number
        arr = np.array(vals, dtype=np.float64)
        if np.all(np.isfinite(arr)):
            return arr
    except (ValueError, TypeError):
        pass
    missing, nonnum = [], []
    for i, v in enumerate(vals):
        if _is_missing(v):
            missing.append(i)
        else:
            try:
                float(v)
            except (ValueError, TypeError):
                nonnum.append(i)
    if missing and (not nonnum or missing[0] < nonnum[0]):
        raise _missing_error(table, name, what, missing)
    if nonnum:
        i = nonnum[0]
        more = f" (and {len(nonnum) - 1} more)" if len(nonnum) > 1 else ""
        raise UsageError(f"{what} {name!r} has non-numeric value {vals[i]!r} on {table.where(i)} of "
                         f"{table.path}{more}")
    arr = np.array(vals, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    i = int(bad[0])
    more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
    raise UsageError(f"{what} {name!r} has non-finite value {vals[i]!r} on {table.where(i)} of {table.path}{more}")


def check_magnitude(table: Table, name: str, arr: np.ndarray, what: str, why: str = "standardising it overflows"):
    """A UsageError naming column ``name`` and its first value beyond ±:data:`gpvi.models.X_ABS_MAX`,
    the limit gpvi's models put on their inputs (:func:`gpvi.models.check_input_range`): the
    column's mean and standard deviation would overflow (with NumPy's RuntimeWarnings) when it
    is standardised."""
    from gpvi.models.base import X_ABS_MAX

    big = np.flatnonzero(np.abs(arr) > X_ABS_MAX)
    if big.size:
        i = int(big[0])
        v = table.columns[name][i]
        shown = repr(v.strip()) if isinstance(v, str) else f"{arr[i]:.6g}"
        more = f" (and {big.size - 1} more)" if big.size > 1 else ""
        raise UsageError(f"{what} {name!r} has value {shown} on {table.where(i)} of {table.path}{more}: gpvi "
                         f"takes values up to ±{X_ABS_MAX:.0e} ({why} beyond that); rescale the column "
                         "(e.g. divide it by a power of ten)")


def feature_matrix(table: Table, names) -> np.ndarray:
    """The feature columns ``names`` as an (N, D) float64 array, each checked to be numeric,
    finite and within the range that standardising can handle (before it is standardised)."""
    cols = []
    for c in names:
        col = numeric_column(table, c, "feature column")
        check_magnitude(table, c, col, "feature column")
        cols.append(col)
    return np.column_stack(cols)


def fmt_label(v) -> str:
    if isinstance(v, str):
        return v.strip()
    v = float(v)
    return str(int(v)) if v.is_integer() else repr(v)


def target_labels(table: Table, name: str):
    """Target values as label strings (numbers normalised, so '1' and '1.0' are one label), and
    their float values when all of them are numbers (else None)."""
    vals = table.require(name, "target column")
    if isinstance(vals, np.ndarray):
        numeric_column(table, name, "target column")  # reports missing values
        return [fmt_label(v) for v in vals], vals.astype(np.float64)
    missing = [i for i, v in enumerate(vals) if _is_missing(v)]
    if missing:  # a missing label is not a class of its own
        raise _missing_error(table, name, "target column", missing)
    out = [v.strip() if isinstance(v, str) else v for v in vals]
    try:
        num = np.array(out, dtype=np.float64)
        if not np.all(np.isfinite(num)):
            num = None
    except (ValueError, TypeError):
        num = None
    if num is not None:
        return [fmt_label(v) for v in num], num
    return [str(v) for v in out], None


def _sort_labels(labels, numeric):
    uniq = sorted(set(labels))
    if numeric is not None:
        uniq = sorted(uniq, key=float)
    return uniq


# ---------------------------------------------------------------------------------------------
# Targets and models
# ---------------------------------------------------------------------------------------------
def shown_labels(labels, n=6):
    return ", ".join(repr(u) for u in labels[:n]) + (", …" if len(labels) > n else "")


def _too_many_classes(target, uniq):
    return UsageError(f"target column {target!r} has {len(uniq)} distinct labels ({shown_labels(uniq)}): more than the "
                      f"{MAX_CLASSES} classes softmax takes (one latent GP per class); for a numeric target give "
                      "--likelihood gaussian, poisson or ordinal")


def encode_target(table, target, lik, levels=None, positive=None):
    """(y codes for gpvi.fit, labels list or None)."""
    if lik == "softmax":
        if levels or positive is not None:
            raise UsageError("--levels and --positive do not apply to --likelihood softmax (its classes are "
                             "the target's distinct labels, in sorted order)")
        labels, numeric = target_labels(table, target)
        uniq = _sort_labels(labels, numeric)
        if len(uniq) < 2:
            raise UsageError(f"target column {target!r} has only one label {uniq[0]!r}: softmax needs at least two "
                             "classes in the training data")
        if len(uniq) > MAX_CLASSES:
            raise _too_many_classes(target, uniq)
        index = {lab: k for k, lab in enumerate(uniq)}
        return np.array([float(index[v]) for v in labels]), uniq
    if lik in ("bernoulli", "probit"):
        if levels:
            raise UsageError("--levels applies to --likelihood ordinal; use --positive for bernoulli/probit")
        labels, numeric = target_labels(table, target)
        uniq = _sort_labels(labels, numeric)
        if len(uniq) != 2:
            if len(uniq) < 2:
                raise UsageError(f"target column {target!r} has only one label {uniq[0]!r}: {lik} needs two "
                                 "classes in the training data")
            raise UsageError(f"target column {target!r} has {len(uniq)} distinct labels ({shown_labels(uniq)}) but {lik} "
                             "needs exactly 2 (use --likelihood softmax for several classes, ordinal for ordered "
                             "levels)")
        if positive is not None:
            positive = fmt_label(float(positive)) if numeric is not None and _is_number(positive) else positive
            if positive not in uniq:
                raise UsageError(f"--positive {positive!r} is not one of the labels {uniq} of target column {target!r}")
            uniq = [u for u in uniq if u != positive] + [positive]
        y = np.array([1.0 if v == uniq[1] else 0.0 for v in labels])
        return y, uniq
    if lik == "ordinal":
        if positive is not None:
            raise UsageError("--positive applies to --likelihood bernoulli/probit")
        labels, numeric = target_labels(table, target)
        if levels:
            order = [fmt_label(float(v)) if numeric is not None and _is_number(v) else v for v in levels]
            if len(set(order)) != len(order):
                raise UsageError(f"--levels names a level twice: {levels}")
            unknown = sorted(set(labels) - set(order))
            if unknown:
                raise UsageError(f"target column {target!r} has labels {unknown[:5]} that are not in --levels {order}")
        elif numeric is None:
            shown = sorted(set(labels))[:6]
            raise UsageError(f"target column {target!r} has text labels {shown}: give their order with "
                             "--levels LOW,MID,HIGH")
        elif np.all(numeric == np.round(numeric)):
            lo, hi = int(numeric.min()), int(numeric.max())
            if hi - lo > 1000:
                raise UsageError(f"target column {target!r} spans {hi - lo + 1} integer levels ({lo}..{hi}): too many "
                                 "for an ordinal model (give --levels, or use poisson)")
            order = [str(k) for k in range(lo, hi + 1)]
        else:
            order = _sort_labels(labels, numeric)
        if len(order) < 2:
            raise UsageError(f"target column {target!r} has only one level {order[0]!r}: ordinal needs at least two")
        index = {lab: k for k, lab in enumerate(order)}
        return np.array([float(index[v]) for v in labels]), order
    if levels or positive is not None:
        raise UsageError(f"--levels and --positive apply to classification likelihoods, not {lik}")
    try:
        return numeric_column(table, target, "target column"), None
    except UsageError as err:
        if "non-numeric" in str(err):
            raise UsageError(f"{err}: {lik} needs numbers (for class labels use bernoulli, probit, "
                             "softmax or ordinal)") from None
        raise


def choose_likelihood(table, target, args):
    """``(likelihood name, why)`` for ``gpvi fit`` without --likelihood: ordinal with --levels,
    bernoulli with --positive; otherwise from the target's values: text labels are classes (two:
    bernoulli, three to :data:`MAX_CLASSES`: softmax); numbers that are all integers with at
    most :data:`AUTO_INTEGER_CLASSES` distinct values are class labels too; any other numbers
    are a gaussian regression target.  ``why`` is the one line ``gpvi fit`` prints."""
    if args.exposure:
        raise UsageError("--exposure needs --likelihood poisson or exponential")
    if split(args.levels):
        return "ordinal", "--levels given"
    if args.positive is not None:
        return "bernoulli", "--positive given"
    labels, numeric = target_labels(table, target)
    uniq = _sort_labels(labels, numeric)
    if len(uniq) < 2:
        raise UsageError(f"target column {target!r} has only one value {uniq[0]!r}: there is nothing to learn "
                         "(a classifier needs two classes)")
    if numeric is None:
        what = f"{len(uniq)} distinct text labels"
    elif np.all(numeric == np.round(numeric)) and len(uniq) <= AUTO_INTEGER_CLASSES:
        what = f"{len(uniq)} distinct integer labels (at most {AUTO_INTEGER_CLASSES} are taken for classes)"
    else:
        return "gaussian", (f"target {target!r} holds numbers with {len(uniq)} distinct values, so gaussian "
                            "regression (give --likelihood poisson for counts, studentt or laplace for heavy "
                            "tails)")
    if len(uniq) > MAX_CLASSES:
        raise _too_many_classes(target, uniq)
    classes = f" ({shown_labels(uniq)})"
    if len(uniq) == 2:
        return "bernoulli", f"target {target!r} has {what}{classes}, so bernoulli (binary classification)"
    return "softmax", (f"target {target!r} has {what}{classes}, so softmax (multiclass classification; give "
                       "--likelihood ordinal for ordered levels" + (", poisson for counts" if numeric is not None
                                                                     else "") + ")")


def _is_number(s):
    try:
        float(s)
        return True
    except (TypeError, ValueError):
        return False


def exposure_column(table, name, note=""):
    table.require(name, "exposure column", note)
    expo = numeric_column(table, name, "exposure column")
    if np.any(expo <= 0):
        i = int(np.flatnonzero(expo <= 0)[0])
        raise UsageError(f"exposure column {name!r} has a non-positive value {expo[i]:g} on "
                         f"{table.where(i)} of {table.path}")
    return expo
