"""The ``gpvi`` command line: ``gpvi fit``, ``gpvi predict``, ``gpvi demo`` and ``gpvi cache``.

``gpvi fit DATA --target COL --likelihood NAME`` fits a model to a CSV (or Parquet) file and
writes a model file that also records the feature columns, their standardisation and the
label coding, so that ``gpvi predict MODEL DATA`` applies the same preprocessing to new rows.
Without ``--likelihood`` the likelihood is chosen from the target (:func:`_choose_likelihood`:
class labels give bernoulli or, for 3 to 50 classes, softmax; other numbers gaussian) and a
line says which.
``gpvi demo`` fits a Poisson sparse GP to the coal-mining disaster counts that ship with
gpvi, with the ``fpi`` and ``gradient`` engines, and prints and plots the comparison.
``gpvi cache info`` shows the on-disk cache of compiled programs (directory, size, limit) and
``gpvi cache clear`` empties it (see :mod:`gpvi._compile`).

Bad input (a missing file or column, a missing or non-numeric value, a feature or numeric target
value beyond ±1e150, which standardising would overflow, labels outside the
likelihood's support, a corrupt model file, an output path that is an input or cannot be
written, an unknown option value) gives one line ``gpvi: error: …`` on stderr and exit code 2.
Output files are written atomically (a temporary file in the same folder, renamed into place),
so a failed or interrupted run leaves any previous file intact.  An interrupt (Ctrl-C) gives the
one line ``gpvi: interrupted`` and exit code 130, whatever the command was doing.
:func:`main` takes the argument list and returns the exit code, so it can be called in-process.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import difflib
import gzip
import io
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from gpvi import kernels as _kernels
from gpvi.fitting import defaults as _defaults
from gpvi.cli.common import (AUTO_INTEGER_CLASSES, CLASSIFIERS, CLI_FORMAT, CLI_VERSION, LIKELIHOODS, LOG_LINK, MAX_CLASSES, MULTI_LATENT_ENGINES, OUTPUTS, PARQUET_SUFFIXES, STANDARDISED_TARGET, UsageError, check_writable, default_out, describe_model, file_version, refuse_overwriting_input, remember_output, save_model, show_progress, split, support_error)

__all__ = ["main", "read_table", "LIKELIHOODS", "MODELS"]

EXIT_BAD_INPUT = 2
EXIT_FIT_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C

#: The values of ``gpvi fit --model``: sparse GP, full GP, Bayesian GLM, or auto (the default).
MODELS = ("sparse", "full", "glm", "auto")  # the default: auto (gpvi.fitting.defaults.model_kind)
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


def _numeric(table: Table, name: str, what: str = "column") -> np.ndarray:
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


def _check_magnitude(table: Table, name: str, arr: np.ndarray, what: str, why: str = "standardising it overflows"):
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


def _features(table: Table, names) -> np.ndarray:
    """The feature columns ``names`` as an (N, D) float64 array, each checked to be numeric,
    finite and within the range that standardising can handle (before it is standardised)."""
    cols = []
    for c in names:
        col = _numeric(table, c, "feature column")
        _check_magnitude(table, c, col, "feature column")
        cols.append(col)
    return np.column_stack(cols)


def _fmt_label(v) -> str:
    if isinstance(v, str):
        return v.strip()
    v = float(v)
    return str(int(v)) if v.is_integer() else repr(v)


def _labels(table: Table, name: str):
    """Target values as label strings (numbers normalised, so '1' and '1.0' are one label), and
    their float values when all of them are numbers (else None)."""
    vals = table.require(name, "target column")
    if isinstance(vals, np.ndarray):
        _numeric(table, name, "target column")  # reports missing values
        return [_fmt_label(v) for v in vals], vals.astype(np.float64)
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
        return [_fmt_label(v) for v in num], num
    return [str(v) for v in out], None


def _sort_labels(labels, numeric):
    uniq = sorted(set(labels))
    if numeric is not None:
        uniq = sorted(uniq, key=float)
    return uniq


# ---------------------------------------------------------------------------------------------
# Targets and models
# ---------------------------------------------------------------------------------------------
def _shown(labels, n=6):
    return ", ".join(repr(u) for u in labels[:n]) + (", …" if len(labels) > n else "")


def _too_many_classes(target, uniq):
    return UsageError(f"target column {target!r} has {len(uniq)} distinct labels ({_shown(uniq)}): more than the "
                      f"{MAX_CLASSES} classes softmax takes (one latent GP per class); for a numeric target give "
                      "--likelihood gaussian, poisson or ordinal")


def _encode_target(table, target, lik, levels=None, positive=None):
    """(y codes for gpvi.fit, labels list or None)."""
    if lik == "softmax":
        if levels or positive is not None:
            raise UsageError("--levels and --positive do not apply to --likelihood softmax (its classes are "
                             "the target's distinct labels, in sorted order)")
        labels, numeric = _labels(table, target)
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
        labels, numeric = _labels(table, target)
        uniq = _sort_labels(labels, numeric)
        if len(uniq) != 2:
            if len(uniq) < 2:
                raise UsageError(f"target column {target!r} has only one label {uniq[0]!r}: {lik} needs two "
                                 "classes in the training data")
            raise UsageError(f"target column {target!r} has {len(uniq)} distinct labels ({_shown(uniq)}) but {lik} "
                             "needs exactly 2 (use --likelihood softmax for several classes, ordinal for ordered "
                             "levels)")
        if positive is not None:
            positive = _fmt_label(float(positive)) if numeric is not None and _is_number(positive) else positive
            if positive not in uniq:
                raise UsageError(f"--positive {positive!r} is not one of the labels {uniq} of target column {target!r}")
            uniq = [u for u in uniq if u != positive] + [positive]
        y = np.array([1.0 if v == uniq[1] else 0.0 for v in labels])
        return y, uniq
    if lik == "ordinal":
        if positive is not None:
            raise UsageError("--positive applies to --likelihood bernoulli/probit")
        labels, numeric = _labels(table, target)
        if levels:
            order = [_fmt_label(float(v)) if numeric is not None and _is_number(v) else v for v in levels]
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
        return _numeric(table, target, "target column"), None
    except UsageError as err:
        if "non-numeric" in str(err):
            raise UsageError(f"{err}: {lik} needs numbers (for class labels use bernoulli, probit, "
                             "softmax or ordinal)") from None
        raise


def _choose_likelihood(table, target, args):
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
    labels, numeric = _labels(table, target)
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
    classes = f" ({_shown(uniq)})"
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


def _exposure(table, name, note=""):
    table.require(name, "exposure column", note)
    expo = _numeric(table, name, "exposure column")
    if np.any(expo <= 0):
        i = int(np.flatnonzero(expo <= 0)[0])
        raise UsageError(f"exposure column {name!r} has a non-positive value {expo[i]:g} on "
                         f"{table.where(i)} of {table.path}")
    return expo




def _remove_stray_temporaries():
    """Remove the temporary files of :func:`gpvi.io.atomic_write` for this command's outputs that
    this process still has open.  An interrupt that lands between the temporary file's creation
    and the start of the write's own clean-up (inside :func:`tempfile.mkstemp`, 1 in 60 tries
    with the interrupt sent as the file appears) leaves it behind; the output itself is intact.
    Only files open in this process are touched, so another process's write is never disturbed.
    Linux (``/proc/self/fd``) only; elsewhere nothing is done."""
    fds = "/proc/self/fd"
    if not OUTPUTS or not os.path.isdir(fds):
        return
    with contextlib.suppress(OSError):
        for fd in os.listdir(fds):
            try:
                target = os.readlink(os.path.join(fds, fd))
            except OSError:
                continue
            folder, name = os.path.split(target)
            for out in OUTPUTS:
                if (folder == os.path.dirname(out) and name.startswith(f".{os.path.basename(out)}.")
                        and name.endswith(".tmp")):
                    with contextlib.suppress(OSError):
                        os.unlink(target)


def _open_output(path: Path):
    """Open ``path`` for writing in binary mode with :func:`gpvi.io.atomic_write`: a regular
    file (or a new one) is replaced atomically through any symlink to it, so an error or an
    interrupt leaves a previous file intact; a device or pipe (``/dev/null``, ``/dev/stdout``) is
    written in place."""
    from gpvi.io import atomic_write

    return atomic_write(path, "wb")


def cmd_fit(args) -> int:
    import gpvi

    if args.model is None:  # the default: auto, or sparse when --inducing is given
        args.model = "sparse" if args.inducing is not None else "auto"
    kernel_spec = _kernel_spec(args)
    if args.stream:
        from gpvi.cli import stream as _cli_stream

        return _cli_stream.cmd_fit_stream(args)
    args.engine = args.engine or "fpi"

    out = Path(args.out) if args.out else default_out(args.data)
    refuse_overwriting_input(out, "the model file", {"data file": args.data})
    check_writable(out, "the model file")
    remember_output(out)
    table = read_table(args.data)
    lik_name = args.likelihood
    target = args.target
    table.require(target, "target column")
    drop = set(split(args.drop))
    for c in sorted(drop):
        table.require(c, "--drop column")
    used = {target} | ({args.exposure} if args.exposure else set())
    if args.features:
        features = split(args.features)
        for c in features:
            table.require(c, "feature column")
            if c in used:
                raise UsageError(f"column {c!r} cannot be both a feature and the target/exposure")
    else:
        features = [c for c in table.columns if c not in used and c not in drop]
    if not features:
        raise UsageError(f"{table.path} has no feature columns besides the target {target!r}")

    X = _features(table, features)
    if lik_name is None:  # --likelihood not given: chosen from the target (_choose_likelihood)
        lik_name, why = _choose_likelihood(table, target, args)
        args.likelihood = lik_name
        if not args.quiet:
            print(f"gpvi fit: no --likelihood given: {why}", flush=True)
    if lik_name == "softmax" and args.engine not in MULTI_LATENT_ENGINES:
        raise UsageError(f"--likelihood softmax (one latent GP per class) runs on --engine "
                         f"{' or '.join(MULTI_LATENT_ENGINES)}, not {args.engine}")
    y, labels = _encode_target(table, target, lik_name, split(args.levels), args.positive)
    if lik_name in STANDARDISED_TARGET:
        _check_magnitude(table, target, y, "target column")
    elif lik_name in LOG_LINK:
        _check_magnitude(table, target, y, "target column", "its mean overflows")
    offset = None
    if args.exposure:
        if lik_name not in LOG_LINK:
            raise UsageError(f"--exposure applies to poisson and exponential, not {lik_name}")
        offset = np.log(_exposure(table, args.exposure))

    # The default model and fit are gpvi.fitting.defaults, which the estimators use too: the
    # same data give the same model, kernel, standardisation, starting values and fit.
    likelihood, mean0 = _defaults.likelihood_start(lik_name, y, levels=len(labels) if labels else None,
                                                   offset=offset)
    try:
        likelihood.validate(y)  # support check, reported with the column's name
    except ValueError as err:
        raise support_error(target, err) from None

    N, D = X.shape
    x_mean, x_scale = _defaults.standardise_inputs(X)
    Xs = (X - x_mean) / x_scale
    y_mean, y_scale = 0.0, 1.0
    if lik_name in STANDARDISED_TARGET:
        y_mean, y_scale = _defaults.standardise_target(y)
        y = (y - y_mean) / y_scale

    kind = args.model if args.model == "glm" else _defaults.model_kind(N, likelihood, args.model)
    if args.inducing is not None and kind != "sparse":
        raise UsageError(f"--inducing applies to --model sparse, not {kind}"
                         + (f" (--model auto chose a full GP for {N} rows)" if args.model == "auto" else ""))
    intercept = False
    latent_offset = 0.0
    two_stage = False
    if kind == "glm":
        if args.kernel is not None or args.ard is not None:
            raise UsageError("--kernel and --ard apply to GP models, not --model glm")
        intercept = lik_name != "ordinal"  # for ordinal the bin edges play the intercept's part
        if intercept:
            Xs = np.column_stack([Xs, np.ones(N)])
        latent_offset = mean0 if lik_name in LOG_LINK else 0.0  # the intercept takes a class base rate
        if getattr(likelihood, "num_latents", 1) > 1:  # softmax: one GLM per class, each with its intercept
            from gpvi.models.multilatent import MultiLatent

            model = MultiLatent(tuple(gpvi.GLM(likelihood=None, prior_variance=1.0)
                                      for _ in range(likelihood.num_latents)), likelihood)
        else:
            model = gpvi.GLM(likelihood=likelihood, prior_variance=1.0)
    else:
        M = None
        if kind == "sparse":
            M = _defaults.inducing_count(Xs) if args.inducing is None else args.inducing
            if M < 1:
                raise UsageError(f"--inducing must be a positive number of inducing inputs, got {M}")
        if kernel_spec is None:  # the default kernel (RBF, ARD), searched in two stages where it helps
            two_stage = _defaults.uses_two_stages(likelihood, D, default_kernel=True, learn_all=args.learn)
            model = _defaults.build_model(kind, likelihood, mean0, Xs, inducing=M, two_stage=two_stage)
        else:  # --kernel: started at the default's lengthscale (median distance), searched in one stage
            kernel = _kernels.kernel_from_spec(kernel_spec, D, ard=args.ard is not False,
                                               lengthscale=_defaults.median_distance(Xs))
            model = _defaults.build_model(kind, likelihood, mean0, Xs, kernel=kernel, inducing=M)
    if latent_offset:
        offset = (offset if offset is not None else 0.0) + np.full(N, latent_offset)

    learn = (_defaults.learned_parameters(model) or False) if args.learn else False
    hyperprior = _defaults.hyperprior(args.hyperprior, model, likelihood, D, engine=args.engine, learn=learn)
    fit, _ = _defaults.fit_default(model, Xs, y, fit=gpvi.fit, learn=learn, two_stage=two_stage,
                                   engine=args.engine, tol=args.tol, max_iter=args.max_iter,
                                   max_rounds=args.max_rounds, offset=offset, seed=args.seed,
                                   progress=show_progress(args), hyperprior=hyperprior)
    extra = {
        "format": CLI_FORMAT, "version": file_version(lik_name), "model": kind, "likelihood": lik_name,
        "target": target, "features": features, "x_mean": x_mean.tolist(), "x_scale": x_scale.tolist(),
        "y_mean": y_mean, "y_scale": y_scale, "labels": labels, "intercept": intercept,
        "latent_offset": latent_offset, "exposure": args.exposure or None, "data": str(args.data),
        "hyperprior": args.hyperprior if hyperprior else "none",
    }
    save_model(fit, out, extra)
    if not args.quiet:
        kernel_desc = None if kernel_spec is None else f"kernel {kernel_spec}" + (
            "" if args.ard is False else ", ARD")
        training = None
        if lik_name in CLASSIFIERS:  # the training error rate, as gpvi predict reports it on test data
            wrong = int(np.sum(np.argmax(fit.predict_proba(Xs, offset), axis=1) != y.astype(int)))
            training = f"error rate {wrong / N:.4g} ({wrong} of {N} rows misclassified)"
        _print_fit_summary(fit, extra, table, out, args.max_rounds, kernel_desc, training)
    return 0


def _kernel_spec(args):
    """The ``--kernel`` spec to build (normalised), or None for the default kernel (no --kernel,
    ``--kernel rbf`` with ARD); a UsageError for an unknown name, a malformed spec or --stream."""
    if args.kernel is None and args.ard is None:
        return None
    if args.stream:
        raise UsageError("--kernel and --ard apply to gpvi fit without --stream (a streamed fit uses the ARD RBF "
                         "kernel)")
    spec = "rbf" if args.kernel is None else args.kernel
    try:
        _kernels.kernel_from_spec(spec, 1)  # checks the names and the syntax
    except ValueError as err:
        raise UsageError(f"--kernel: {err}") from None
    spec = "".join(spec.split()).lower()
    return None if spec == "rbf" and args.ard is not False else spec


def _fmt(v):
    return f"{float(v):.4g}"


def _print_fit_summary(fit, extra, table, out, max_rounds, kernel_desc=None, training=None):
    kind, lik = extra["model"], extra["likelihood"]
    features = extra["features"]
    described = describe_model(fit, kind)
    if kernel_desc is not None:  # --kernel
        described = described.replace("RBF ARD kernel", kernel_desc)
    print(f"gpvi fit: {described}, {lik} likelihood, engine {fit.engine}")
    tgt = f"target {extra['target']!r}"
    if extra["labels"] is not None:
        tgt += " (" + ", ".join(f"{lab} = {k}" for k, lab in enumerate(extra["labels"])) + ")"
    print(f"  data          {table.path}: {table.nrows} rows, {len(features)} feature(s), {tgt}")
    if fit.hyperparameter_rounds:
        print(f"  iterations    {fit.hyperparameter_rounds} hyperparameter rounds (L-BFGS-B, each running {fit.engine} "
              f"to convergence), {fit.evaluations} passes over the data; final {fit.engine} run: "
              f"{fit.iterations} iteration(s)")
    else:
        print(f"  iterations    {fit.iterations} {fit.engine} iteration(s), {fit.evaluations} passes over the data")
    print(f"  converged     {'yes' if fit.converged else 'NO'} ({fit.message})")
    if fit.hyperparameter_rounds and fit.hyperparameter_rounds >= max_rounds:
        print(f"  note          the hyperparameter optimiser stopped at --max-rounds {max_rounds}; raise it for a better fit")
    print(f"  VLB           {fit.vlb:.6g} nats")
    if training is not None:
        print(f"  training      {training}")
    print(f"  time          {fit.seconds:.2f} s")
    print("  hyperparameters (features standardised" +
          ("; target standardised" if lik in STANDARDISED_TARGET else "") + ")")
    rows = []  # (name, value text)
    for name, value in fit.model.parameters().items():
        if name == "inducing" or name.endswith(".inducing"):
            continue
        arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
        if name.endswith("lengthscale") and arr.size == len(features) and arr.size > 1:
            if arr.size <= 10:
                rows += [(f"{name}[{f}]", _fmt(v)) for f, v in zip(features, arr)]
            else:
                lo, hi = int(np.argmin(arr)), int(np.argmax(arr))
                rows.append((name, f"{arr.size} values: min {_fmt(arr[lo])} ({features[lo]}), "
                                   f"median {_fmt(np.median(arr))}, max {_fmt(arr[hi])} ({features[hi]})"))
        elif arr.size == 1:
            rows.append((name, _fmt(arr[0])))
        else:
            rows.append((name, "[" + ", ".join(_fmt(v) for v in arr) + "]"))
    width = max([32] + [len(name) + 2 for name, _ in rows])  # names of several latents run longer
    for name, text in rows:
        print(f"    {name.ljust(width)}{text}")
    print(f"wrote model to {out}")


# ---------------------------------------------------------------------------------------------
# gpvi predict
# ---------------------------------------------------------------------------------------------
def _load_cli_model(path):
    import gpvi

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: no such file")
    if p.is_dir():
        raise UsageError(f"{path} is a directory, not a model file")
    try:
        obj, extra = gpvi.io.load(p, with_extra=True)
    except OSError:
        raise  # reported by main as "FILE: reason"
    except ValueError as err:
        raise UsageError(_plain(err)) from None
    except Exception as err:  # a damaged or crafted file must not end in a traceback
        raise UsageError(f"{path} is not a readable gpvi model file ({type(err).__name__}: "
                         f"{_plain(err) or 'no details'})") from None
    if not isinstance(obj, gpvi.FitResult) or extra.get("format") != CLI_FORMAT:
        raise UsageError(f"{path} was not written by `gpvi fit` (it has no column information); "
                         "load it in Python with gpvi.io.load")
    _check_cli_extra(extra, obj, path)
    return obj, extra


def _check_cli_extra(extra: dict, fit, path):
    """Check the column information ``gpvi fit`` stored (types, lengths, finiteness, agreement
    with the model's inputs) before ``predict`` uses any of it: a crafted file must be one line,
    not a ``TypeError`` from comparing a string version or a ``KeyError`` from a missing field."""
    def damaged(what):
        return UsageError(f"{path} is a damaged gpvi model file: {what}")

    def number(v, positive=False):
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and (v > 0 or not positive))

    version = extra.get("version")
    if type(version) is not int or version < 1:
        raise damaged(f"its command-line format version must be a positive integer, got {version!r}")
    if version > CLI_VERSION:
        raise UsageError(f"{path} was written by a newer gpvi; upgrade gpvi")
    feats = extra.get("features")
    if not isinstance(feats, list) or not feats or not all(isinstance(c, str) for c in feats):
        raise damaged("'features' must be a non-empty list of column names")
    for key, positive in (("x_mean", False), ("x_scale", True)):
        vals = extra.get(key)
        if not (isinstance(vals, list) and len(vals) == len(feats) and all(number(v, positive) for v in vals)):
            raise damaged(f"{key!r} must hold {len(feats)} finite numbers" + (" > 0" if positive else ""))
    if not (number(extra.get("y_mean")) and number(extra.get("y_scale"), True)
            and number(extra.get("latent_offset", 0.0))):
        raise damaged("'y_mean', 'y_scale' (> 0) and 'latent_offset' must be finite numbers")
    if not isinstance(extra.get("intercept"), bool):
        raise damaged("'intercept' must be true or false")
    if extra.get("model") not in ("sparse", "full", "glm") or extra.get("likelihood") not in LIKELIHOODS:
        raise damaged(f"unknown model {extra.get('model')!r} or likelihood {extra.get('likelihood')!r}")
    if not isinstance(extra.get("target"), str) or not isinstance(extra.get("exposure"), (str, type(None))):
        raise damaged("'target' must be a column name and 'exposure' a column name or null")
    labels = extra.get("labels")
    if labels is not None and not (isinstance(labels, list) and labels
                                   and all(isinstance(v, (str, int, float)) for v in labels)):
        raise damaged("'labels' must be null or a non-empty list of labels")
    latents = getattr(getattr(fit.model, "likelihood", None), "num_latents", 1)
    if extra["likelihood"] == "softmax":
        if version < 2:
            raise damaged(f"softmax models have command-line format version 2 or later, got {version}")
        if not isinstance(labels, list) or len(labels) != latents or len(set(map(str, labels))) != len(labels):
            raise damaged(f"'labels' must list the {latents} distinct classes of its softmax model")
    elif latents != 1:
        raise damaged(f"its model has {latents} latent functions but its likelihood is {extra['likelihood']!r}")
    if fit.input_dim is not None and fit.input_dim != len(feats) + extra["intercept"]:
        raise damaged(f"the model takes {fit.input_dim} inputs but the file names {len(feats)} feature column(s)"
                      + (" and an intercept" if extra["intercept"] else ""))


def _design(table, extra, model_path):
    for c in extra["features"]:
        if c not in table.columns:
            table.require(c, "feature column", f" (used to fit {model_path})")
    X = _features(table, extra["features"])
    Xs = (X - np.asarray(extra["x_mean"])) / np.asarray(extra["x_scale"])
    if extra["intercept"]:
        Xs = np.column_stack([Xs, np.ones(Xs.shape[0])])
    offset = None
    if extra.get("exposure"):
        offset = np.log(_exposure(table, extra["exposure"], f" (used to fit {model_path})"))
    if extra.get("latent_offset"):
        offset = (offset if offset is not None else 0.0) + np.full(Xs.shape[0], extra["latent_offset"])
    return Xs, offset


def predict_columns(fit, extra, Xs, offset) -> dict:
    """The columns ``gpvi predict`` writes, as a dict of (N,) arrays / lists."""
    lik = extra["likelihood"]
    if lik == "softmax":  # one probability per class and the most probable class (no mean of y)
        labels = extra["labels"]
        proba = np.asarray(fit.predict_proba(Xs, offset))
        cols = {f"p_{lab}": proba[:, k] for k, lab in enumerate(labels)}
        cols["label"] = [labels[k] for k in np.argmax(proba, axis=1)]
        return cols
    lm, lv = fit.predict_f(Xs, offset)
    mean, var = fit.predict_y(Xs, offset)
    s, mu = extra["y_scale"], extra["y_mean"]
    if lik in STANDARDISED_TARGET:
        mean, var = mean * s + mu, var * s**2
        lm, lv = lm * s + mu, lv * s**2
    cols = {"mean": mean, "variance": var, "latent_mean": lm, "latent_variance": lv}
    if lik in CLASSIFIERS:
        labels = extra["labels"]
        proba = fit.predict_proba(Xs, offset)
        for k, lab in enumerate(labels):
            cols[f"p_{lab}"] = proba[:, k]
        cols["label"] = [labels[k] for k in np.argmax(proba, axis=1)]
    return cols


def _score(fit, extra, table, Xs, offset, cols):
    """One line of test metrics when the data has the target column, else None."""
    import gpvi

    target, lik = extra["target"], extra["likelihood"]
    if target not in table.columns:
        return None
    try:
        if lik in CLASSIFIERS:
            labels, _ = _labels(table, target)
            index = {lab: k for k, lab in enumerate(extra["labels"])}
            unknown = sorted(set(labels) - set(index))
            if unknown:
                rows = sum(v in set(unknown) for v in labels)
                return (f"target column {target!r} not scored: {rows} row(s) have labels {_shown(unknown, 5)} that "
                        f"are not among the model's classes ({_shown(extra['labels'], 8)})")
            codes = np.array([float(index[v]) for v in labels])
            err = float(np.mean(np.asarray(cols["label"]) != np.asarray(labels)))
            lpd = fit.log_predictive_density(Xs, codes, offset)
            return f"scored on target {target!r} ({codes.size} rows): error rate {err:.4g}, NLPD {gpvi.metrics.nlpd(lpd):.4g}"
        y = _numeric(table, target, "target column")
        s, mu = extra["y_scale"], extra["y_mean"]
        lpd = fit.log_predictive_density(Xs, (y - mu) / s, offset) - math.log(s)
        mae = gpvi.metrics.mae(y, cols["mean"])
        return f"scored on target {target!r} ({y.size} rows): MAE {mae:.4g}, NLPD {gpvi.metrics.nlpd(lpd):.4g}"
    except (UsageError, ValueError) as err:
        return f"target column {target!r} not scored: {err}"


def _format_cell(v):
    if isinstance(v, str):
        return v
    return repr(float(v))


def _write_csv(cols: dict, write):
    """Write ``cols`` as CSV through ``write(str)``, in pieces of about 1 MB."""
    names = list(cols)
    n = len(next(iter(cols.values())))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    columns = [cols[k] for k in names]
    for i in range(n):
        w.writerow([_format_cell(c[i]) for c in columns])
        if buf.tell() >= 1 << 20:
            write(buf.getvalue())
            buf.seek(0)
            buf.truncate()
    write(buf.getvalue())


def _write_table(cols: dict, out):
    """Write ``cols`` as CSV (or Parquet, by the suffix) to ``out``, or CSV to stdout when ``out``
    is None.  A file is written atomically (see :func:`_open_output`)."""
    if out is None:
        _write_csv(cols, sys.stdout.write)
        sys.stdout.flush()
        return
    out = Path(out)
    if out.suffix.lower() in PARQUET_SUFFIXES:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError('writing Parquet files needs pyarrow, which is not installed: '
                             'pip install "gpvi[parquet]"') from None
        table = pa.table({k: (list(v) if isinstance(v, list) else np.asarray(v)) for k, v in cols.items()})
        with _open_output(out) as fh:
            pq.write_table(table, fh)
        return
    with _open_output(out) as fh:
        _write_csv(cols, lambda text: fh.write(text.encode("utf-8")))


def cmd_predict(args) -> int:
    out = Path(args.out) if args.out and args.out != "-" else None
    if out is not None:
        refuse_overwriting_input(out, "the output file", {"model file": args.model, "data file": args.data})
        check_writable(out, "the predictions")
        remember_output(out)
    fit, extra = _load_cli_model(args.model)
    table = read_table(args.data)
    keep = split(args.keep)
    for c in keep:
        table.require(c, "--keep column")
    Xs, offset = _design(table, extra, args.model)
    pred = predict_columns(fit, extra, Xs, offset)
    cols = {}
    for c in keep:
        v = table.columns[c]
        cols[c] = [_fmt_label(x) if not isinstance(x, str) and x is not None else (x or "") for x in v]
    for k, v in pred.items():
        cols[k if k not in cols else f"{k}_pred"] = v
    _write_table(cols, out)
    if not args.quiet:
        line = _score(fit, extra, table, Xs, offset, pred)
        where = str(out) if out is not None else "stdout"
        print(f"gpvi predict: {table.nrows} predictions ({', '.join(pred)}) written to {where}", file=sys.stderr)
        if line:
            print(line, file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# gpvi demo
# ---------------------------------------------------------------------------------------------
def run_demo(out_dir=".", inducing: int = 25, plot: bool = True, echo=print):
    """Fit the bundled coal-mining counts with fpi and gradient; returns a dict of results."""
    import gpvi
    from gpvi.datasets import coal_mining_counts

    t_start = time.perf_counter()
    years, counts = coal_mining_counts()
    test = (np.arange(years.size) % 5) == 4  # every 5th year held out: 1855, 1860, …
    X = years[:, None].astype(np.float64)
    y = counts.astype(np.float64)
    Xtr, ytr, Xte, yte = X[~test], y[~test], X[test], y[test]
    if not 1 <= inducing <= Xtr.shape[0]:
        raise UsageError(f"--inducing must be between 1 and {Xtr.shape[0]} (the training years), got {inducing}")
    Z = np.linspace(years[0], years[-1], inducing)[:, None]
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=10.0),
                          likelihood=gpvi.likelihoods.Poisson(), inducing=Z, mean=float(np.log(ytr.mean())))
    echo(f"gpvi demo: British coal-mining disasters 1851-1962 ({int(counts.sum())} events, shipped with gpvi; "
         "Apache-2.0, see gpvi/data/NOTICE.md)")
    echo(f"yearly counts, {Xtr.shape[0]} years for training and {Xte.shape[0]} held out (every 5th year); "
         f"Poisson sparse GP, RBF kernel, {inducing} inducing inputs; kernel variance, lengthscale and mean learned")
    fits, rows = {}, []
    for engine in ("fpi", "gradient"):
        # Compile first (same shapes, so the same XLA programs), so the timing compares engines.
        gpvi.fit(model, Xtr, ytr, engine=engine, learn_hyperparameters=True, max_rounds=2, max_iter=5)
        secs, fit = np.inf, None
        for _ in range(3):  # best of 3 (the fits take a fraction of a second); its trace is plotted
            t = time.perf_counter()
            trial = gpvi.fit(model, Xtr, ytr, engine=engine, learn_hyperparameters=True, tol=1e-8)
            if time.perf_counter() - t < secs:
                secs, fit = time.perf_counter() - t, trial
        mean, _ = fit.predict_y(Xte)
        rows.append((engine, fit.hyperparameter_rounds, fit.evaluations, fit.vlb, gpvi.metrics.mae(yte, mean),
                     gpvi.metrics.nlpd(fit.log_predictive_density(Xte, yte)), secs))
        fits[engine] = fit
    base_rate = ytr.mean()
    from scipy.stats import poisson

    base_mae = gpvi.metrics.mae(yte, np.full(yte.size, base_rate))
    base_nlpd = float(-np.mean(poisson.logpmf(yte, base_rate)))
    echo("")
    header = f"{'engine':<10}{'rounds':>7}{'data passes':>13}{'VLB (nats)':>13}{'test MAE':>10}{'test NLPD':>11}{'seconds':>9}"
    echo(header)
    echo("-" * len(header))
    for engine, rounds, passes, vlb, mae, nlpd, secs in rows:
        echo(f"{engine:<10}{rounds:>7}{passes:>13}{vlb:>13.4f}{mae:>10.3f}{nlpd:>11.3f}{secs:>9.3f}")
    echo(f"{'constant':<10}{'':>7}{'':>13}{'':>13}{base_mae:>10.3f}{base_nlpd:>11.3f}{'':>9}")
    echo("")
    echo("rounds: L-BFGS-B iterations on the hyperparameters, each running the engine to convergence (warm-started);")
    echo("data passes: passes over the training data by the engine, all runs included; constant: the training")
    echo("mean rate, for comparison.  Seconds: best of 3 fits, excluding JAX compilation (each engine was run")
    echo("once before timing).")
    p = fits["fpi"].model.parameters()
    echo(f"learned (fpi): kernel variance {float(p['kernel.variance']):.3g}, lengthscale "
         f"{float(p['kernel.lengthscale']):.3g} years, mean log-rate {float(p['mean']):.3g}")
    png = None
    if plot:
        png = Path(out_dir) / "gpvi-demo.png"
        _demo_plot(fits, Xtr, ytr, Xte, yte, png)
        echo(f"wrote {png} (VLB against time for both engines; posterior disaster rate)")
    echo(f"total time {time.perf_counter() - t_start:.1f} s, JAX compilation included")
    return {"fits": fits, "rows": rows, "png": png}


def _demo_plot(fits, Xtr, ytr, Xte, yte, png):
    from matplotlib.figure import Figure

    from gpvi.plots import plot_posterior_1d, plot_traces

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.4])
    plot_traces(fits, ax=ax1)
    ax1.set_title("VLB during hyperparameter learning")
    plot_posterior_1d(fits["fpi"], Xtr, ytr, ax=ax2)
    ax2.plot(Xte[:, 0], yte, "x", color="tab:orange", markersize=5, label="held-out years")
    ax2.set_xlabel("year")
    ax2.set_ylabel("disasters per year")
    ax2.set_title("Posterior disaster rate (fpi)")
    ax2.legend(loc="upper right")
    fig.savefig(png, dpi=110)


def cmd_demo(args) -> int:
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file, not a folder")
    plot = not args.no_plot
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError('gpvi demo draws its plot with matplotlib, which is not installed: '
                             'pip install "gpvi[plot]" (or run gpvi demo --no-plot)') from None
        out_dir.mkdir(parents=True, exist_ok=True)
    echo = (lambda *a, **k: None) if args.quiet else print
    run_demo(out_dir, inducing=args.inducing, plot=plot, echo=echo)
    return 0


# ---------------------------------------------------------------------------------------------
# gpvi cache
# ---------------------------------------------------------------------------------------------
CACHE_ACTIONS = ("info", "clear")


def _megabytes(n: int) -> str:
    """A size in bytes as ``1.5 MB`` (MiB), ``12.3 kB`` (KiB) or ``0 bytes``."""
    if n >= 2**20:
        return f"{n / 2**20:.1f} MB"
    return f"{n / 2**10:.1f} kB" if n >= 2**10 else f"{n} bytes"


def cmd_cache(args) -> int:
    from gpvi import _compile

    if args.action == "clear":
        count, size = _compile.clear_cache()
        if not args.quiet:
            print(f"gpvi cache: removed {count} compiled program(s), {_megabytes(size)}, from {_compile.cache_dir()}")
        return 0
    info = _compile.cache_info()
    if not args.quiet:
        print(f"gpvi cache: {info['directory']}")
        print(f"  size          {info['entries']} compiled program(s), {_megabytes(info['bytes'])} "
              f"(limit {_megabytes(info['limit_bytes'])}, set by {_compile.MAX_MB_ENV})")
        print(f"  state         {'on' if info['active'] else info['note']}")
    return 0


def _check_configuration():
    """The cache's environment variables, read at import (gpvi._compile): a bad value is the
    command's one error line."""
    from gpvi import _compile

    problem = _compile.config_error()
    if problem:
        raise UsageError(problem)


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse parser whose usage errors are one line on stderr and exit code 2 (no usage dump:
    it runs to many lines; ``gpvi COMMAND -h`` shows it)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"gpvi: error: {_one_line(message)} (see `{self.prog} -h`)\n")


def _choice(what: str, choices):
    """An argparse ``type`` that accepts one of ``choices`` (case-insensitively) and otherwise
    says, in one line, what was given, the nearest choice and all of them."""
    def parse(value: str) -> str:
        v = value.strip().lower()
        if v in choices:
            return v
        hint = difflib.get_close_matches(v, choices, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise argparse.ArgumentTypeError(f"unknown {what} {value!r}{extra}; choose from {', '.join(choices)}")

    parse.__name__ = what
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``gpvi`` argument parser (sub-commands fit, predict, demo and cache)."""
    from gpvi import __version__

    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true",
                        help="no progress display and no summary (errors are still reported)")
    parser = _Parser(
        prog="gpvi", description="Variational inference for GPs and latent Gaussian models with any likelihood.",
        epilog="Run `gpvi COMMAND -h` for the options of a command.")
    parser.add_argument("--version", action="version", version=f"gpvi {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    f = sub.add_parser("fit", parents=[common], help="fit a model to a CSV or Parquet file and write a model file",
                       description="Fit a model to DATA (CSV with a header line, or Parquet). Features are "
                                   "standardised; every column except the target is a feature unless "
                                   "--features/--drop say otherwise. Without --likelihood it is chosen from the "
                                   "target, and a line says which: text labels are classes (2: bernoulli; 3 to "
                                   f"{MAX_CLASSES}: softmax); numbers that are all integers with at most "
                                   f"{AUTO_INTEGER_CLASSES} distinct values are class labels too; other numbers "
                                   "give gaussian regression (--levels implies ordinal, --positive bernoulli; "
                                   "--stream and --exposure need --likelihood).")
    f.add_argument("data", metavar="DATA", help="CSV (.csv, .tsv, optionally .gz) or Parquet (.parquet) file")
    f.add_argument("-t", "--target", required=True, metavar="COL", help="the column to predict")
    f.add_argument("-l", "--likelihood", type=_choice("likelihood", LIKELIHOODS), default=None, metavar="NAME",
                   help="one of: " + ", ".join(LIKELIHOODS) + " (softmax: multiclass, one latent GP per class, "
                        f"at most {MAX_CLASSES} classes, engines {' or '.join(MULTI_LATENT_ENGINES)}; "
                        "default: chosen from the target, see above)")
    f.add_argument("-m", "--model", type=_choice("model", MODELS), default=None, metavar="KIND",
                   help="auto (default; sparse when --inducing is given): a full GP when N <= 1000 for gaussian, "
                        "laplace and studentt and N <= 500 for the other likelihoods, else sparse; or sparse GP, "
                        "full GP, Bayesian GLM")
    from gpvi import engines

    f.add_argument("-e", "--engine", type=_choice("engine", engines.names()), default=None, metavar="ENGINE",
                   help="inference engine: " + ", ".join(engines.names()) + " (default fpi; sfp with --stream, "
                        "which takes " + ", ".join(engines.names(streams=True)) + ")")
    f.add_argument("-M", "--inducing", type=int, metavar="M",
                   help="inducing inputs of the sparse GP (default min(200, distinct rows)), placed by k-means; "
                        "implies --model sparse unless --model says otherwise")
    f.add_argument("-o", "--out", metavar="MODEL", help="model file to write (default: DATA with suffix .gpvi)")
    f.add_argument("--features", metavar="COLS", help="comma-separated feature columns (default: all but the target)")
    f.add_argument("--drop", metavar="COLS", help="comma-separated columns to leave out of the features")
    f.add_argument("--exposure", metavar="COL", help="exposure column for poisson/exponential (offset log COL)")
    f.add_argument("--levels", metavar="L1,L2,...", help="order of the ordinal levels, lowest first "
                   "(default: the integers from the smallest to the largest label)")
    f.add_argument("--positive", metavar="LABEL", help="the positive class for bernoulli/probit "
                   "(default: the larger number, or the later label in sorted order)")
    f.add_argument("--kernel", metavar="SPEC",
                   help="kernel of the GP: " + ", ".join(_kernels.SPEC_NAMES) + " (rq: rational quadratic; "
                        "polynomial: degree 2) joined by + and * (* binds tighter), e.g. rbf+periodic or "
                        "matern52*linear; lengthscales (and periods) start at the median distance between "
                        "standardised rows (default: rbf, with the isotropic-then-ARD search)")
    f.add_argument("--ard", action=argparse.BooleanOptionalAction, default=None,
                   help="one lengthscale per feature for the stationary kernels of --kernel (default: --ard; "
                        "--no-ard: one shared lengthscale, and without --kernel an isotropic rbf)")
    f.add_argument("--learn", action=argparse.BooleanOptionalAction, default=True,
                   help="learn kernel and likelihood hyperparameters (default: --learn)")
    f.add_argument("--hyperprior", choices=["weak", "none"], default=_defaults.HYPERPRIOR,
                   help="priors on the learned hyperparameters: 'weak' (default) log-normal priors on the kernel "
                        "variance (median 1), lengthscales (median sqrt(D)) and regression noise (median 0.1), for "
                        "the standardised data (gpvi.priors.weak; engines fpi, fpb, gradient, dual, laplace); "
                        "'none': the bound alone")
    f.add_argument("--tol", type=float, default=1e-6, help="relative VLB tolerance (default 1e-6)")
    f.add_argument("--max-iter", type=int, default=None,
                   help="iteration limit of each engine run: steps, or minibatch steps of sfp/svi/ivsgpr "
                        "(default: the engine's own, 500 steps; sfp and svi end after their epochs)")
    f.add_argument("--max-rounds", type=int, default=100,
                   help="iteration limit of the hyperparameter optimiser (default 100)")
    f.add_argument("--seed", type=int, default=0, help="seed of the k-means placement of inducing inputs")
    f.add_argument("--stream", action="store_true",
                   help="read DATA in row groups/blocks and fit by a stochastic engine (sfp, svi): for files "
                        "larger than memory")
    f.add_argument("--batch-size", type=int, metavar="B", help="--stream: rows per minibatch (default min(N, 1024))")
    f.add_argument("--epochs", type=int, default=2, help="--stream: passes over the data (default 2)")
    f.add_argument("--init-rows", type=int, default=100_000,
                   help="--stream: rows at the head of DATA used for scalings and k-means (default 100000)")
    f.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", parents=[common], help="predict with a model file; writes CSV",
                       description="Predict at the rows of DATA with a model written by `gpvi fit`. Writes "
                                   "columns mean, variance (of y), latent_mean, latent_variance, and for "
                                   "bernoulli/probit/ordinal a probability column p_<label> per class and the "
                                   "most probable label; for softmax the p_<label> columns and label only. When "
                                   "DATA has the target column, test metrics (error rate and NLPD for classes) "
                                   "are printed to stderr.")
    p.add_argument("model", metavar="MODEL", help="model file written by gpvi fit")
    p.add_argument("data", metavar="DATA", help="CSV or Parquet file with the model's feature columns")
    p.add_argument("-o", "--out", metavar="FILE", help="output file, CSV (or .parquet); default: stdout")
    p.add_argument("--keep", metavar="COLS", help="comma-separated input columns to copy to the output (e.g. an id)")
    p.set_defaults(func=cmd_predict)

    d = sub.add_parser("demo", parents=[common], help="fit the bundled coal-mining data with fpi and gradient",
                       description="Fit a Poisson sparse GP to the yearly coal-mining disaster counts that ship "
                                   "with gpvi, with the fpi and gradient engines; print a table and write "
                                   "gpvi-demo.png.")
    d.add_argument("--out-dir", default=".", metavar="DIR", help="folder for gpvi-demo.png (default: current)")
    d.add_argument("-M", "--inducing", type=int, default=25, metavar="M", help="inducing inputs (default 25)")
    d.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib needed)")
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("cache", parents=[common], help="show or clear the on-disk cache of compiled programs",
                       description="gpvi keeps compiled programs on disk so that a new run loads instead of "
                                   "compiling: in $XDG_CACHE_HOME/gpvi/jax (~/.cache/gpvi/jax), or the folder "
                                   "GPVI_COMPILATION_CACHE names (0 turns it off); least recently used programs "
                                   "are removed beyond GPVI_COMPILATION_CACHE_MAX_MB megabytes (default 256).")
    c.add_argument("action", nargs="?", default="info", type=_choice("cache action", CACHE_ACTIONS),
                   metavar="ACTION", help="info (default): print the folder, its size and limit; clear: remove "
                                          "every compiled program from it")
    c.set_defaults(func=cmd_cache)
    return parser


def _one_line(msg) -> str:
    return " ".join(_plain(msg).split())


_PICKLE_ADVICE = re.compile(r"\s*If you trust the file you can load it unsafely.*?(pickle\.load\(\)`?\.?|$)", re.S)


def _plain(msg) -> str:
    """``msg`` without NumPy's advice to load a file "unsafely" with ``allow_pickle``: gpvi never
    unpickles a file, and a user must not be told to."""
    text = str(msg)
    if "pickle" not in text:
        return text
    text = _PICKLE_ADVICE.sub("", text)
    text = text.replace("This file contains pickled (object) data.",
                        "it holds pickled Python objects, which gpvi never loads")
    return text.replace("Object arrays cannot be loaded when allow_pickle=False",
                        "it holds Python objects (pickled data), which gpvi never loads")


def _run(argv) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, usage errors (exit 2)
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    try:
        _check_configuration()
        return args.func(args)
    except UsageError as err:
        print(f"gpvi: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except np.linalg.LinAlgError as err:
        print(f"gpvi: error: the fit failed: {_one_line(err)}", file=sys.stderr)
        return EXIT_FIT_FAILED
    except ValueError as err:  # gpvi's own input checks (model files, data, settings)
        print(f"gpvi: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        print(f"gpvi: error: {where}{_one_line(err.strerror or err)}", file=sys.stderr)
        return EXIT_BAD_INPUT


class _InterruptGuard:
    """How the ``gpvi`` command ends on SIGINT (Ctrl-C): exit code 130 after the one line
    ``gpvi: interrupted``, whatever it was doing, and without a crash.

    * The first SIGINT raises KeyboardInterrupt in the main thread as usual, so that ``finally``
      blocks run (an atomic write removes its temporary file); :func:`main` catches it and calls
      :meth:`exit`, which flushes stdout and stderr and ends the process with :func:`os._exit`.
      A normal interpreter exit is what crashed (SIGSEGV after the message): the
      interrupt can arrive while XLA compiles a program on a thread of its own (the main thread
      waits for it interruptibly), and the exit then destroyed the XLA client under that thread.
    * Python swallows an exception raised in a garbage-collector callback (JAX registers one) or
      in ``__del__``, printing "Exception ignored in …"; the command would then run on.  Such a
      swallowed KeyboardInterrupt is caught by a ``sys.unraisablehook`` and delivered again.
    * Further SIGINTs are ignored while the first unwinds, so they cannot cut its clean-up short.
    * A watchdog thread ends the process itself when the main thread has not reported the
      interrupt :attr:`GRACE` seconds after it, e.g. because it is inside one long compiled call.
    """

    GRACE = 2.0

    def __init__(self):
        self.interrupted = threading.Event()
        self.reported = threading.Event()  # the interrupt is being reported, or the command is done
        self.redeliver = threading.Event()
        self.exiting = threading.Lock()  # held by whichever thread prints the line and exits
        self.pending = False  # a KeyboardInterrupt is on its way up the main thread
        self.watchdog = None
        self.previous_hook = sys.unraisablehook

    def install(self) -> bool:
        """Take over SIGINT, unless it is ignored (a background job of a shell script: it stays
        ignored) or handled by someone else, or this is not the main thread."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False
        if not _set_sigint(self.on_signal):
            return False
        sys.unraisablehook = self.on_unraisable
        # Started now, not in the handler: the main thread may be interrupted while it holds
        # threading's own locks, which starting a thread takes.
        self.watchdog = threading.Thread(target=self.watch, name="gpvi-interrupt", daemon=True)
        self.watchdog.start()
        return True

    def on_signal(self, signum, frame):
        """SIGINT handler: raise KeyboardInterrupt, unless one is already on its way."""
        if self.pending or self.reported.is_set():
            return
        self.pending = True
        self.interrupted.set()
        raise KeyboardInterrupt

    def on_unraisable(self, unraisable):
        """A KeyboardInterrupt swallowed by Python (in a gc callback or ``__del__``) is delivered
        again, silently; anything else goes to the previous hook."""
        if issubclass(unraisable.exc_type, KeyboardInterrupt) and not self.reported.is_set():
            self.pending = False
            self.redeliver.set()
            return
        self.previous_hook(unraisable)

    def watch(self):
        """From the first interrupt on: deliver swallowed interrupts again (from outside the
        callback that swallowed them), and exit after GRACE seconds if the main thread has not
        reported the interrupt by then."""
        self.interrupted.wait()
        deadline = time.monotonic() + self.GRACE
        while not self.reported.wait(0.01):
            if self.redeliver.is_set():
                self.redeliver.clear()
                os.kill(os.getpid(), signal.SIGINT)
            if time.monotonic() > deadline:
                self.exit()

    def finish(self):
        """The command is done: a late SIGINT no longer changes its outcome (nor turns into a
        traceback while the interpreter exits)."""
        self.reported.set()
        _set_sigint(signal.SIG_IGN)

    def exit(self):
        """Print ``gpvi: interrupted``, flush stdout and stderr, and end the process (exit 130)
        without the interpreter's teardown.  Called by one thread; another one blocks here."""
        self.reported.set()
        _set_sigint(signal.SIG_IGN)  # a no-op outside the main thread
        self.exiting.acquire()
        with contextlib.suppress(Exception):
            _remove_stray_temporaries()
            print("gpvi: interrupted", file=sys.stderr)
        _flush_std()
        os._exit(EXIT_INTERRUPTED)


def _set_sigint(handler) -> bool:
    """Install ``handler`` for SIGINT; False where that is not allowed (outside the main thread)."""
    try:
        signal.signal(signal.SIGINT, handler)
        return True
    except (ValueError, OSError):  # not the main thread
        return False


def _flush_std():
    """Flush stdout and stderr before :func:`os._exit` (which skips it), ignoring a closed pipe."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def main(argv=None, *, exit_on_interrupt: bool | None = None) -> int:
    """Run the ``gpvi`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    An interrupt (SIGINT, Ctrl-C) prints ``gpvi: interrupted`` and gives exit code 130.  With
    ``exit_on_interrupt`` (the default when ``argv`` is None, i.e. when run as the ``gpvi``
    command) the process then ends at once with :func:`os._exit`, after flushing stdout and
    stderr, and interrupts that Python would swallow are honoured: see :class:`_InterruptGuard`.
    Nothing is lost by skipping the interpreter's teardown: output files are
    written atomically, so an interrupted write leaves the previous file.
    """
    if exit_on_interrupt is None:
        exit_on_interrupt = argv is None
    guard = _InterruptGuard() if exit_on_interrupt else None
    OUTPUTS.clear()
    try:
        if guard is not None:
            guard.install()
        code = _run(argv)
    except KeyboardInterrupt:
        if guard is not None:
            guard.exit()  # does not return
        _remove_stray_temporaries()
        print("gpvi: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if guard is not None:
        guard.finish()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
