"""``gpvi predict``: apply a model file's preprocessing to new rows and write the predictions."""
from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path

import numpy as np
from gpvi.cli.common import (CLASSIFIERS, CLI_FORMAT, CLI_VERSION, LIKELIHOODS, PARQUET_SUFFIXES, STANDARDISED_TARGET,
                             UsageError, check_writable, open_output, plain, refuse_overwriting_input,
                             remember_output, split)
from gpvi.cli.table import (exposure_column, feature_matrix, fmt_label, numeric_column, read_table, shown_labels,
                             target_labels)


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
        raise UsageError(plain(err)) from None
    except Exception as err:  # a damaged or crafted file must not end in a traceback
        raise UsageError(f"{path} is not a readable gpvi model file ({type(err).__name__}: "
                         f"{plain(err) or 'no details'})") from None
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
    X = feature_matrix(table, extra["features"])
    Xs = (X - np.asarray(extra["x_mean"])) / np.asarray(extra["x_scale"])
    if extra["intercept"]:
        Xs = np.column_stack([Xs, np.ones(Xs.shape[0])])
    offset = None
    if extra.get("exposure"):
        offset = np.log(exposure_column(table, extra["exposure"], f" (used to fit {model_path})"))
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
            labels, _ = target_labels(table, target)
            index = {lab: k for k, lab in enumerate(extra["labels"])}
            unknown = sorted(set(labels) - set(index))
            if unknown:
                rows = sum(v in set(unknown) for v in labels)
                return (f"target column {target!r} not scored: {rows} row(s) have labels {shown_labels(unknown, 5)} that "
                        f"are not among the model's classes ({shown_labels(extra['labels'], 8)})")
            codes = np.array([float(index[v]) for v in labels])
            err = float(np.mean(np.asarray(cols["label"]) != np.asarray(labels)))
            lpd = fit.log_predictive_density(Xs, codes, offset)
            return f"scored on target {target!r} ({codes.size} rows): error rate {err:.4g}, NLPD {gpvi.metrics.nlpd(lpd):.4g}"
        y = numeric_column(table, target, "target column")
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
    is None.  A file is written atomically (see :func:`open_output`)."""
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
        with open_output(out) as fh:
            pq.write_table(table, fh)
        return
    with open_output(out) as fh:
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
        cols[c] = [fmt_label(x) if not isinstance(x, str) and x is not None else (x or "") for x in v]
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
