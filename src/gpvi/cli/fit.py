"""``gpvi fit``: fit a model to a table and write the model file with its preprocessing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gpvi import engines, kernels as _kernels
from gpvi.fitting import defaults as _defaults
from gpvi.cli.common import (CLASSIFIERS, CLI_FORMAT, LOG_LINK, STANDARDISED_TARGET, UsageError,
                             check_writable, default_out, describe_model, file_version, refuse_overwriting_input,
                             remember_output, save_model, show_progress, split, support_error)
from gpvi.cli.table import check_magnitude, choose_likelihood, encode_target, exposure_column, feature_matrix, read_table


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

    X = feature_matrix(table, features)
    if lik_name is None:  # --likelihood not given: chosen from the target (choose_likelihood)
        lik_name, why = choose_likelihood(table, target, args)
        args.likelihood = lik_name
        if not args.quiet:
            print(f"gpvi fit: no --likelihood given: {why}", flush=True)
    several = engines.names(latents=True)  # the engines that fit several latent functions
    if lik_name == "softmax" and args.engine not in several + [engines.auto.AUTO]:
        raise UsageError(f"--likelihood softmax (one latent GP per class) runs on --engine "
                         f"{' or '.join(several)}, not {args.engine}")
    y, labels = encode_target(table, target, lik_name, split(args.levels), args.positive)
    if lik_name in STANDARDISED_TARGET:
        check_magnitude(table, target, y, "target column")
    elif lik_name in LOG_LINK:
        check_magnitude(table, target, y, "target column", "its mean overflows")
    offset = None
    if args.exposure:
        if lik_name not in LOG_LINK:
            raise UsageError(f"--exposure applies to poisson and exponential, not {lik_name}")
        offset = np.log(exposure_column(table, args.exposure))

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
            model = _defaults.build_model(kind, likelihood, mean0, Xs, inducing=M)
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
