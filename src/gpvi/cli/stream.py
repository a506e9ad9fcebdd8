"""``gpvi fit --stream``: fit a file larger than memory by the stochastic engines, reading it in
row groups (Parquet) or blocks (CSV) and never holding more than a shuffle buffer of rows.

Called by :func:`gpvi.cli.fit.cmd_fit` for ``--stream``; the model file it writes
has the CLI's usual fields, so ``gpvi predict`` uses it unchanged.  What a stream cannot offer:
feature and target scalings come from the first ``--init-rows`` rows (not the whole file);
targets must already be numbers in the likelihood's support (0/1 for bernoulli/probit; text
labels and ordinal levels need the in-memory path); ``--exposure`` is not supported yet.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from gpvi.cli.common import (CLI_FORMAT, LOG_LINK, PARQUET_SUFFIXES, STANDARDISED_TARGET, UsageError, check_writable,
                             default_out, describe_model, file_version, make_likelihood, refuse_overwriting_input,
                             remember_output, save_model, show_progress, split, support_error)



def cmd_fit_stream(args) -> int:
    import gpvi
    from gpvi import stream as gstream

    engine = args.engine or "sfp"
    if engine not in gpvi.engines.names(streams=True):
        raise UsageError(f"--stream needs --engine {' or '.join(gpvi.engines.names(streams=True))}, not {engine}")
    if args.likelihood is None:
        raise UsageError("--stream needs --likelihood: it is chosen from the target only when the whole file is "
                         "read (without --stream)")
    if args.likelihood == "softmax":
        raise UsageError("--stream does not support --likelihood softmax (multiclass) yet: the stochastic engines "
                         "fit one latent function; fit in memory without --stream")
    if args.likelihood == "ordinal":
        raise UsageError("--stream does not support ordinal targets yet (fit in memory without --stream)")
    if args.exposure:
        raise UsageError("--stream does not support --exposure yet (fit in memory without --stream)")
    if args.levels or args.positive is not None:
        raise UsageError("--levels and --positive need the in-memory path (without --stream)")
    kind = "sparse" if args.model in ("sparse", "auto") else args.model
    if kind == "full":
        raise UsageError("--stream needs --model sparse or glm: a full GP has one weight per row")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be a positive number of rows, got {args.batch_size}")
    if args.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
    out = Path(args.out) if args.out else default_out(args.data)
    refuse_overwriting_input(out, "the model file", {"data file": args.data})
    check_writable(out, "the model file")
    remember_output(out)
    p = Path(args.data)
    if not p.exists():
        raise UsageError(f"{args.data}: no such file")
    target = args.target
    drop = set(split(args.drop))
    features = split(args.features) or None
    parquet = p.suffix.lower() in PARQUET_SUFFIXES
    try:
        if parquet:
            import pyarrow.parquet as pq

            names = pq.ParquetFile(p).schema_arrow.names
        else:
            import pyarrow.csv as pcsv

            names = pcsv.open_csv(p).schema.names
    except Exception as err:  # pyarrow's own error types
        raise UsageError(f"{args.data} could not be read: {str(err).splitlines()[0]}") from None
    if target not in names:
        raise UsageError(f"target column {target!r} not found in {args.data}; its columns are {names[:12]}")
    for c in sorted(drop) + (features or []):
        if c not in names:
            raise UsageError(f"column {c!r} not found in {args.data}")
    if features is None:
        features = [c for c in names if c != target and c not in drop]
    if target in features:
        raise UsageError(f"column {target!r} cannot be both a feature and the target")
    if not features:
        raise UsageError(f"{args.data} has no feature columns besides the target {target!r}")
    src = (gstream.from_parquet(p, target, features) if parquet else gstream.from_csv(p, target, features))
    N = src.count_rows()
    B = min(N, 1024) if args.batch_size is None else args.batch_size
    if args.init_rows < 1:  # (before the head of the file is read and scaled)
        raise UsageError(f"--init-rows must be a positive number of rows, got {args.init_rows}")
    if B > N:
        raise UsageError(f"--batch-size {B} is larger than the {N} rows of {args.data}")

    # scalings from the head of the file (a stream has no cheap whole-file statistics)
    X0, y0, _ = src.head(min(args.init_rows, N))
    from gpvi.models.base import X_ABS_MAX

    for j, name in enumerate(features):  # before the scalings, which would overflow (NumPy warnings)
        big = np.flatnonzero(np.abs(X0[:, j]) > X_ABS_MAX)
        if big.size:
            raise UsageError(f"feature column {name!r} has value {X0[big[0], j]:.6g} in row {int(big[0]) + 1} of "
                             f"{args.data}: gpvi takes values up to ±{X_ABS_MAX:.0e} (standardising it overflows "
                             "beyond that); rescale the column (e.g. divide it by a power of ten)")
    x_mean = X0.mean(0)
    x_scale = X0.std(0)
    x_scale = np.where(x_scale > 0, x_scale, 1.0)
    lik_name = args.likelihood
    likelihood = make_likelihood(lik_name)
    labels = None
    if lik_name in ("bernoulli", "probit"):
        vals = set(np.unique(y0).tolist())
        if not vals <= {0.0, 1.0}:
            raise UsageError(f"target column {target!r}: --stream needs 0/1 labels for {lik_name}, "
                             f"found {sorted(vals)[:5]}")
        labels = ["0", "1"]
    try:
        likelihood.validate(y0)
    except ValueError as err:
        raise support_error(target, err) from None
    y_mean, y_scale = 0.0, 1.0
    if lik_name in STANDARDISED_TARGET:
        y_mean, y_scale = float(y0.mean()), float(y0.std()) or 1.0
    mean0 = 0.0
    if lik_name in LOG_LINK:
        mean0 = float(np.log(max(float(y0.mean()), 1e-3)))
    D = len(features)
    intercept = kind == "glm"
    latent_offset = mean0 if kind == "glm" else 0.0

    def scale_block(X, y, off):
        Xs = (X - x_mean) / x_scale
        if intercept:
            Xs = np.column_stack([Xs, np.ones(len(y))])
        return Xs, (y - y_mean) / y_scale, off + latent_offset

    data = src.map(scale_block)
    if intercept:
        data.num_features = D + 1
    if kind == "glm":
        model = gpvi.GLM(likelihood=likelihood, prior_variance=1.0)
    else:
        kernel = gpvi.kernels.RBF(variance=1.0, lengthscale=np.full(D, math.sqrt(D)))
        M = args.inducing if args.inducing is not None else min(200, N)
        if M < 1:
            raise UsageError(f"--inducing must be a positive number of inducing inputs, got {M}")
        model = gpvi.SparseGP(kernel=kernel, likelihood=likelihood, inducing=int(M), mean=mean0)
    learn = gpvi.learnable_parameters(model) if args.learn else False
    show = not args.quiet

    done = [0]

    def on_epoch(steps, vlb, seconds):
        # the engines record once per epoch (no full-data pass over a stream)
        done[0] += 1
        if show:
            print(f"  epoch {done[0]}/{args.epochs}: VLB estimate {vlb:.6g} nats, {steps} steps, "
                  f"{steps * B / max(seconds, 1e-9):.3g} rows/s", file=sys.stderr)

    fit = gpvi.fit_stream(model, data, engine=engine, batch_size=B, epochs=args.epochs,
                          learn_hyperparameters=learn or False, seed=args.seed, init_rows=args.init_rows,
                          progress=show_progress(args), callback=on_epoch)
    if fit.extras.get("interrupted"):
        raise KeyboardInterrupt  # the command's usual Ctrl-C exit (130), no model file
    extra = {
        "format": CLI_FORMAT, "version": file_version(lik_name), "model": kind, "likelihood": lik_name,
        "target": target, "features": features, "x_mean": x_mean.tolist(), "x_scale": x_scale.tolist(),
        "y_mean": y_mean, "y_scale": y_scale, "labels": labels, "intercept": intercept,
        "latent_offset": latent_offset, "exposure": None, "data": str(args.data),
    }
    save_model(fit, out, extra)
    if show:
        rate = fit.extras.get("rows_per_second", float("nan"))
        print(f"gpvi fit --stream: {describe_model(fit, kind)}, {lik_name} likelihood, engine {engine}")
        print(f"  data          {args.data}: {N} rows, {D} feature(s), target {target!r}, read in "
              f"{'row groups' if parquet else 'blocks'}")
        print(f"  passes        {fit.extras['epochs']:g} epoch(s), {fit.extras['steps']} minibatch steps of {B} rows, "
              f"{rate:.3g} rows/s")
        print(f"  VLB           {fit.vlb:.6g} nats (mean minibatch estimate over the last epoch)")
        print(f"  time          {fit.seconds:.2f} s")
        print(f"wrote model to {out}")
    return 0
