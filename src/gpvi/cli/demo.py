"""``gpvi demo``: the bundled coal-mining counts fitted by fpi and gradient, printed and plotted."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from gpvi.cli.common import (UsageError)


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
