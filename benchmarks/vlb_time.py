"""VLB against time: FPi, FPb and GRAD on GLM, GP and sparse GP (Sheth & Khardon 2016, §4, Figs 2–5).

The grid of the paper: models {GLM, full GP on 500 rows, sparse GP with 100 inducing inputs
drawn at random from the data and fixed} × likelihoods {logistic, Poisson, Laplace,
Student-t (ν = 3, σ² = 1/3)} × engines {gradient (GRAD: L-BFGS on m and chol V), fpb, fpi}.

Protocol (paper §4, with the deviations stated in the output):

- features Z-scored (constant columns dropped); GLM: intercept column added, prior
  ``Σ = 0.1·I`` (``0.001·I`` for BlogFeedback, as the paper did for *flares*: with 0.1 the
  Poisson VLB at the starting point overflows, see ``DEVIATIONS``);
- GP / sparse GP: zero mean, RBF kernel whose variance and lengthscale (and the Laplace
  likelihood's scale) are estimated once per data set by maximising the VLB of a full GP on
  200 random rows (``gpvi.fit(..., engine="fpi", learn_hyperparameters=[...])``), then fixed
  and shared by all engines and by the GP and sparse GP cells; the GLM Laplace scale likewise
  from a GLM on 200 rows; Student-t: ``StudentT(df=3, scale=sqrt(1/3))`` (gpvi's
  ``y = f + scale·t_ν``, so ``scale² = σ² = 1/3``), γ clipped at 0 in every fpi/fpb step
  (``clip_gamma="always"``);
- start at ``m = 0, V = I`` in gpvi's whitened coordinates (= the prior), ``V = 0.1·I`` for
  Poisson;
- every engine is compiled first by a short throw-away run on the same objective, then run to
  ``tol = 1e-10`` with a wall-clock budget per run (the run is stopped from its callback when
  the budget is spent; the trace so far is kept).  All engines share one ``gpvi.Objective``
  (projections cached), and BLAS is limited to one thread as in ``gpvi.fit``, so the times are
  optimisation times only.

Data sets (``../shared/data``): logistic — a9a (GLM, 32 561 × 123), MAGIC gamma (GP, sparse
GP on all 19 020 rows); Poisson — BlogFeedback comments (GLM, a random 10 000 rows), abalone
rings (GP, sparse GP on all 4 177); Laplace — kin40k (GLM, 40 000 rows), SARCOS torque 1 (GP,
sparse GP on all 4 449); Student-t — kin40k (GLM; GP; sparse GP on 20 000 rows).

Per cell: best VLB = max over engines; for each engine the final VLB, the time (and iteration)
at which it first gets within ``1e-3·|best|`` of the best VLB (and within ``1e-6·|best|``),
iterations, and fpi's safeguard diagnostics (damped steps, 2-cycles, clipped-γ steps).  The
speed-up of FPi over GRAD is the ratio of the two times to ``1e-3`` relative.  Where FPi is
not faster the markdown says why, from the diagnostics, the per-iteration costs and
Conditions 1 / 2a / 2b of the likelihood (``gpvi.diagnostics.check_conditions`` when present).

Writes ``results/vlb_time.{json,png,md}`` (``--quick``: ``vlb_time_quick.*``, tiny subsets,
2 cells, < 60 s).  Needs ``../shared/data``.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (first: sets JAX_PLATFORMS before JAX is imported)
import datasets as D  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gpvi  # noqa: E402

MODELS = ("glm", "gp", "sparse")
LIKELIHOODS = ("logistic", "poisson", "laplace", "studentt")
ENGINES = ("fpi", "fpb", "gradient")
SEQ = "fpi_seq"  # benchmark-local variant in the paper's order, see fpi_sequential()
ALL_ENGINES = ENGINES + (SEQ,)
MODEL_NAMES = {"glm": "GLM", "gp": "GP", "sparse": "sparse GP"}
LIK_NAMES = {"logistic": "logistic", "poisson": "Poisson", "laplace": "Laplace", "studentt": "Student-t"}
ENGINE_NAMES = {"fpi": "FPi", "fpb": "FPb", "gradient": "GRAD", SEQ: "FPi (m, then V)"}
REL = 1e-3  # "reached the optimum": VLB ≥ best − REL·|best|
REL_TIGHT = 1e-6  # a tighter threshold, reported alongside
TIE = 1.25  # speed-ups within [1/TIE, TIE] are a tie on this (shared, noisy) machine
STUDENT_DF, STUDENT_SIGMA2 = 3.0, 1.0 / 3.0

# Data set of each cell: GLM on a large set, GP (500-row subsample) and sparse GP on another.
DATA = {
    ("glm", "logistic"): "a9a", ("glm", "poisson"): "blogfeedback",
    ("glm", "laplace"): "kin40k", ("glm", "studentt"): "kin40k",
    ("gp", "logistic"): "magic04", ("gp", "poisson"): "abalone",
    ("gp", "laplace"): "sarcos", ("gp", "studentt"): "kin40k",
}
for _lik in LIKELIHOODS:
    DATA[("sparse", _lik)] = DATA[("gp", _lik)]
LOADERS = {
    "a9a": lambda: D.load_a9a(),
    "blogfeedback": lambda: D.load_blogfeedback_counts(None),
    "kin40k": lambda: D.load_kin40k(),
    "magic04": lambda: D.load_magic04(),
    "abalone": lambda: D.load_abalone_counts(),
    "sarcos": lambda: D.load_sarcos(1),
}
REGRESSION = {"kin40k", "sarcos"}  # real targets: standardised too
# Rows of the GLM cells: all, except BlogFeedback (one pass over all 52 397 × 277 rows takes
# seconds on 2 cores, so no engine would get anywhere within the budget): a random 10 000.
GLM_ROWS = {"blogfeedback": 10000}
GLM_PRIOR = {"blogfeedback": 0.001}  # default 0.1 (paper); see DEVIATIONS
DEVIATIONS = [
    ("GLM Poisson on BlogFeedback uses the prior Σ = 0.001·I instead of 0.1·I (the paper made the "
     "same exception for its count data set *flares*): the Z-scored BlogFeedback features are very "
     "heavy-tailed (|h_i|² up to 4.7e5), so with Σ = 0.1·I and V = 0.1·I the latent variance of 4 rows "
     "exceeds 1400 and e^{m+v/2} overflows: the VLB at the prescribed start is −∞ and no engine can run."),
    ("V = I (Poisson: 0.1·I) at the start is taken in gpvi's whitened coordinates, i.e. q starts at the "
     "prior (GLM: V = Σ; GP: V = K).  The paper's vgai code starts at V = I in the original coordinates."),
    ("GLM Poisson uses a random 10 000 of BlogFeedback's 52 397 rows (see GLM_ROWS) so that the engines "
     "get somewhere within the budget on 2 cores."),
    ("GP / sparse GP Laplace cells use SARCOS (torque 1, the 4 449-row GPML test file; sparse GP on all of "
     "it), not kin40k: on 200 kin40k rows the VLB-optimal Laplace scale collapses to b ≈ 0.006–0.016 (the GP "
     "interpolates), which would make the 20 000-row sparse model absurd (VLB ≈ −2.8e6).  Student-t cells "
     "keep kin40k (its scale is fixed).  Regression targets are standardised."),
    ("Hyperparameters are estimated by gpvi itself (VLB maximisation on 200 random rows with fpi), not "
     "with the GPML toolbox; they are fixed afterwards and equal across engines, as in the paper."),
    ("Engines: gpvi's GRAD is SciPy L-BFGS-B on (m, chol V) (the paper used vgai's minFunc L-BFGS); "
     "gpvi's fpi/fpb are safeguarded (a step that lowers the VLB is damped) — the counts are reported."),
    ("gpvi's fpi takes the Newton step on m and the FP step on V jointly from the same point (a "
     "natural-gradient step of size 1); the paper's FPi alternates them (Newton on m, then FP on V at the "
     "new m).  The paper's order is run as an extra, benchmark-local engine (`fpi_seq`) for comparison."),
    "Each run has a wall-clock budget (see config); a run stopped by it is marked 'budget'.",
]
CLAIMS = [
    (("FPi reaches the optimum VLB faster than GRAD in GLM, GP and sparse GP, for all four likelihoods "
      "(Figs 2–5; §4: 'a significant advantage of FPi in all cases')"), "fpi_vs_grad"),
    ("FPb is slower than FPi (§4: 'FPi being the fastest and GRAD and FPb being slower')", "fpb_vs_fpi"),
]
KNOWN_CONDITIONS = {  # Sheth & Khardon 2016, §3–4 (used when gpvi.diagnostics is unavailable)
    "poisson": dict(condition1=True, condition2a=True, condition2b=False),
    "logistic": dict(condition1=True, condition2a=False, condition2b=False),
    "laplace": dict(condition1=True, condition2a=False, condition2b=False),
    "studentt": dict(condition1=False, condition2a=False, condition2b=False),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny subsets, 2 cells (glm:studentt, sparse:poisson), short budgets")
    p.add_argument("--cells", nargs="+", default=None,
                   help="cells as model:likelihood, e.g. gp:logistic sparse:poisson (default: all 12; quick: 2)")
    p.add_argument("--budget", type=float, default=None, help="wall seconds per engine run (default 30; quick 4)")
    p.add_argument("--tol", type=float, default=1e-10, help="engine tolerance (relative VLB change)")
    p.add_argument("--glm-n", type=int, default=None, help="cap on GLM rows (default: all, BlogFeedback 10 000; quick 1000)")
    p.add_argument("--gp-n", type=int, default=None, help="rows of the full-GP cells (default 500; quick 120)")
    p.add_argument("--sparse-n", type=int, default=None, help="cap on sparse-GP rows (default 20000; quick 1500)")
    p.add_argument("--m", type=int, default=None, help="inducing inputs (default 100; quick 20)")
    p.add_argument("--hyper-n", type=int, default=None, help="rows for hyperparameter estimation (default 200; quick 80)")
    p.add_argument("--no-seq", dest="seq", action="store_false",
                   help="skip the benchmark-local FPi variant in the paper's order (m, then V)")
    p.add_argument("--hyper-rounds", type=int, default=None,
                   help="L-BFGS-B iterations of the hyperparameter estimation (default 100; quick 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outdir", default=None, help="where to write the outputs (default benchmarks/results)")
    p.add_argument("--out", default=None, help="output stem (default vlb_time[_quick])")
    a = p.parse_args(argv)
    q = a.quick
    a.budget = a.budget if a.budget is not None else (4.0 if q else 30.0)
    a.glm_n = a.glm_n if a.glm_n is not None else (1000 if q else None)
    a.gp_n = a.gp_n or (120 if q else 500)
    a.sparse_n = a.sparse_n or (1500 if q else 20000)
    a.m = a.m or (20 if q else 100)
    a.hyper_n = a.hyper_n or (80 if q else 200)
    a.hyper_rounds = a.hyper_rounds or (5 if q else 100)
    a.out = a.out or ("vlb_time_quick" if q else "vlb_time")
    if a.cells is None:
        a.cells = ["glm:studentt", "sparse:poisson"] if q else [f"{m}:{k}" for m in MODELS for k in LIKELIHOODS]
    cells = []
    for c in a.cells:
        m, _, k = c.partition(":")
        if m not in MODELS or k not in LIKELIHOODS:
            p.error(f"cell {c!r}: expected model:likelihood with model in {MODELS} and likelihood in {LIKELIHOODS}")
        cells.append((m, k))
    a.cells = cells
    return a


# ---- data and models -----------------------------------------------------------------------
class Data:
    """Loads each data set once; features Z-scored over all its rows, constant columns dropped."""

    def __init__(self):
        self._cache = {}

    def get(self, name):
        if name not in self._cache:
            X, y = LOADERS[name]()
            X = X[:, X.std(axis=0) > 0]
            y = np.asarray(y, np.float64)
            if name in REGRESSION:
                y = (y - y.mean()) / y.std()
            self._cache[name] = (D.zscore(X), y)
        return self._cache[name]


def likelihood(name, scale=None):
    L = gpvi.likelihoods
    if name == "logistic":
        return L.Bernoulli(link="logit")
    if name == "poisson":
        return L.Poisson()
    if name == "laplace":
        return L.Laplace(scale=1.0 if scale is None else scale)
    return L.StudentT(df=STUDENT_DF, scale=math.sqrt(STUDENT_SIGMA2))


def engine_options(lik):
    """fpi/fpb options: Student-t clips γ at 0 in every step (paper §4)."""
    return {"clip_gamma": "always"} if lik == "studentt" else {}


def with_intercept(X):
    return np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)


def median_distance(X, max_rows=1000, seed=0):
    from scipy.spatial.distance import pdist

    if X.shape[0] > max_rows:
        X = X[np.random.default_rng(seed).choice(X.shape[0], max_rows, replace=False)]
    return float(np.median(pdist(X)))


def estimate_hyperparameters(kind, lik, dataset, X, y, args, log):
    """Kernel (and Laplace scale) hyperparameters from ``args.hyper_n`` random rows, by VLB
    maximisation with fpi (the paper used GPML on 200 rows).  GLM: only the Laplace scale."""
    rng = np.random.default_rng([args.seed, 11, len(dataset), LIKELIHOODS.index(lik)])
    idx = rng.choice(X.shape[0], min(args.hyper_n, X.shape[0]), replace=False)
    Xs, ys = X[idx], y[idx]
    t = time.perf_counter()
    if kind == "glm":
        if lik != "laplace":
            return {}
        model = gpvi.GLM(likelihood=likelihood(lik), prior_variance=GLM_PRIOR.get(dataset, 0.1))
        names = ["likelihood.scale"]
        Xs = with_intercept(Xs)
    else:
        ell0 = median_distance(Xs)
        model = gpvi.GP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=ell0), likelihood=likelihood(lik),
                        mean=0.0)
        names = ["kernel.variance", "kernel.lengthscale"] + (["likelihood.scale"] if lik == "laplace" else [])
    res = gpvi.fit(model, Xs, ys, engine="fpi", learn_hyperparameters=names, tol=1e-6, max_iter=200,
                   max_rounds=args.hyper_rounds)
    params = {}
    for n in names:
        obj = res.model
        for part in n.split("."):
            obj = getattr(obj, part)
        params[n] = float(np.asarray(obj))
    log(f"  hyperparameters ({kind}, {lik}, {dataset}, {len(idx)} rows): "
        + ", ".join(f"{k}={v:.4g}" for k, v in params.items())
        + f"  [{time.perf_counter() - t:.1f}s, {res.hyperparameter_rounds} rounds]")
    return params


def build_cell(kind, lik, data, hypers, args):
    """(model, X, y, init State, info) of one cell."""
    dataset = DATA[(kind, lik)]
    X, y = data.get(dataset)
    rng = np.random.default_rng([args.seed, MODELS.index(kind), LIKELIHOODS.index(lik)])
    N = X.shape[0]
    if kind == "glm":
        n = min(N, GLM_ROWS.get(dataset, N))
        n = n if args.glm_n is None else min(n, args.glm_n)
    elif kind == "gp":
        n = min(N, args.gp_n)
    else:
        n = min(N, args.sparse_n)
    if n < N:
        idx = np.sort(rng.choice(N, n, replace=False))
        X, y = X[idx], y[idx]
    hp = hypers.get((kind if kind == "glm" else "gp", dataset, lik), {})
    lk = likelihood(lik, hp.get("likelihood.scale"))
    info = dict(dataset=dataset, N=int(n), N_available=int(N), D=int(X.shape[1]), hyperparameters=hp)
    if kind == "glm":
        X = with_intercept(X)
        pv = GLM_PRIOR.get(dataset, 0.1)
        model = gpvi.GLM(likelihood=lk, prior_variance=pv)
        info.update(prior_variance=pv, d=int(X.shape[1]))
    else:
        kern = gpvi.kernels.RBF(variance=hp["kernel.variance"], lengthscale=hp["kernel.lengthscale"])
        if kind == "gp":
            model = gpvi.GP(kernel=kern, likelihood=lk, mean=0.0)
            info.update(d=int(n))
        else:
            M = min(args.m, n)
            Z = X[np.sort(rng.choice(n, M, replace=False))]  # random data rows, fixed
            model = gpvi.SparseGP(kernel=kern, likelihood=lk, inducing=Z, mean=0.0)
            info.update(M=int(M), d=int(M), inducing="random rows of the data (fixed)")
    model = model.initialise(X, y)
    d = info["d"]
    v0 = 0.1 if lik == "poisson" else 1.0
    init = gpvi.State(jnp.zeros(d), math.sqrt(v0) * jnp.eye(d))
    info["V0"] = v0
    return model, X, y, init, info


# ---- timed engine runs ----------------------------------------------------------------------
class _Budget(Exception):
    """Raised from the engine callback when a run has used its wall-clock budget."""


def fpi_sequential(objective, state, *, tol=1e-6, max_iter=500, clip_gamma="auto", callback=None):
    """FPi in the order of Sheth & Khardon (2016, §4): one Newton step on m with V fixed, then
    one fixed-point step ``V ← (I − Σλ_i a_i a_iᵀ)⁻¹`` at the *new* m; each step safeguarded
    (damped if it would lower the VLB) by gpvi's own :class:`SafeguardedAscent`.

    gpvi's ``fpi`` instead takes both updates jointly from the same point (a natural-gradient
    step of size 1) and falls back to this order only after a rejected joint step.  This
    benchmark-local variant is run alongside to show whether the difference matters; it is
    not part of the claims' verdicts.
    """
    from gpvi.engines import _common

    clock = _common.Clock(callback)
    sums = objective.sums(state)
    clock.tick(sums.vlb, 0)
    mean_guard = _common.SafeguardedAscent(objective, clip_gamma=clip_gamma)
    cov_guard = _common.SafeguardedAscent(objective, clip_gamma=clip_gamma)
    converged, message, it = False, f"reached max_iter={max_iter}", 0
    for it in range(1, max_iter + 1):
        start = float(sums.vlb)
        moved = False
        for guard, um, uc in ((mean_guard, True, False), (cov_guard, False, True)):
            out = guard.step(state, sums, update_mean=um, update_cov=uc)
            if out is not None:
                state, sums, _ = out
                moved = True
        clock.tick(sums.vlb, it)
        if not moved:
            message = "no step size increases the VLB"
            break
        if _common.converged_change(float(sums.vlb), start, tol) and min(mean_guard.alpha, cov_guard.alpha) >= 0.25:
            converged, message = True, f"VLB change below tol={tol:g}"
            break
    return _common.EngineResult(state, float(sums.vlb), it, converged, message, clock.trace,
                                mean_guard.backtracks + cov_guard.backtracks, mean_guard.cycles + cov_guard.cycles,
                                objective.num_evaluations, mean_guard.clipped + cov_guard.clipped)


def engine_run(name):
    return fpi_sequential if name == SEQ else gpvi.engines.ENGINES[name]


@contextlib.contextmanager
def recording_guards():
    """Collect the safeguard objects the fp engines create, so that their counts (damped
    steps, cycles, clipped steps) are known even for a run stopped by the budget (whose
    ``EngineResult`` is never returned)."""
    made = []
    mods = [m for m in (gpvi.engines.fpi, gpvi.engines.fpb, gpvi.engines._common) if hasattr(m, "SafeguardedAscent")]
    saved = {m: m.SafeguardedAscent for m in mods}
    for m in mods:
        base = saved[m]

        class Recording(base):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                made.append(self)

        m.SafeguardedAscent = Recording
    try:
        yield made
    finally:
        for m, cls in saved.items():
            m.SafeguardedAscent = cls


def run_engine(engine, objective, init, opts, tol, budget, max_iter=10**6):
    """Run one engine to ``tol`` or until ``budget`` seconds; returns a summary with the trace,
    an (iterations + 1, 3) array of (seconds, VLB, data passes so far)."""
    run = engine_run(engine)
    rows = []

    def cb(iteration, vlb, seconds):
        rows.append((seconds, vlb, objective.num_evaluations - ev0))
        if seconds > budget:
            raise _Budget

    kw = dict(opts) if engine != "gradient" else {}
    ev0 = objective.num_evaluations
    with recording_guards() as guards:
        try:
            res = run(objective, init, tol=tol, max_iter=max_iter, callback=cb, **kw)
        except _Budget:
            res = None
    trace = np.asarray(rows, np.float64).reshape(-1, 3)
    out = dict(iterations=max(len(rows) - 1, 0), evaluations=objective.num_evaluations - ev0,
               seconds=float(trace[-1, 0]) if len(rows) else float("nan"))
    if res is not None:
        out.update(status="converged" if res.converged else "stopped", message=res.message,
                   final_vlb=float(res.vlb), iterations=int(res.iterations), backtracks=int(res.backtracks),
                   cycles=int(res.cycles), clipped=int(res.clipped))
        if not len(rows) or float(res.vlb) > trace[-1, 1]:  # GRAD's final state may follow its last callback
            trace = np.vstack([trace, [[out["seconds"], float(res.vlb), out["evaluations"]]]])
    else:
        out.update(status="budget", message=f"stopped by the {budget:g}s budget",
                   final_vlb=float(trace[-1, 1]),
                   backtracks=sum(g.backtracks for g in guards), cycles=sum(g.cycles for g in guards),
                   clipped=sum(g.clipped for g in guards))
    if engine == "gradient":
        out.update(backtracks=0, cycles=0, clipped=0)
    out["trace"] = trace
    return out


def first_hit(trace, best, rel):
    """(seconds, iteration, data passes) of the first trace row with VLB ≥ best − rel·|best|,
    or (None, None, None)."""
    ok = np.nonzero(trace[:, 1] >= best - rel * abs(best))[0]
    if ok.size == 0:
        return None, None, None
    return float(trace[ok[0], 0]), int(ok[0]), int(trace[ok[0], 2])


def conditions(lik_name, lik):
    """Conditions 1 / 2a / 2b of the likelihood: checked on a grid by gpvi.diagnostics when it
    is available, else the paper's statements."""
    try:
        from gpvi.diagnostics import check_conditions

        rep = check_conditions(lik, grid=(61, 61), m_range=(-6.0, 6.0), v_range=(1e-3, 10.0))
        return dict(condition1=bool(rep.condition1), condition2a=bool(rep.condition2a),
                    condition2b=bool(rep.condition2b), source="gpvi.diagnostics.check_conditions (61×61 grid)",
                    summary=rep.summary())
    except Exception as err:  # noqa: BLE001  (module absent or changed: fall back to the paper)
        c = dict(KNOWN_CONDITIONS[lik_name])
        c.update(source=f"Sheth & Khardon 2016 §3-4 (check_conditions unavailable: {type(err).__name__})",
                 summary="")
        return c


def conditions_text(c):
    parts = [n for n, k in (("C1", "condition1"), ("C2a", "condition2a"), ("C2b", "condition2b")) if c[k]]
    return "+".join(parts) if parts else "neither C1 nor C2"


def run_cell(kind, lik, data, hypers, args, log):
    model, X, y, init, info = build_cell(kind, lik, data, hypers, args)
    opts = engine_options(lik)
    engines = ENGINES + ((SEQ,) if args.seq else ())
    tag = f"[{kind}:{lik}]"
    log(f"{tag} {info['dataset']} N={info['N']} d={info['d']}")
    t = time.perf_counter()
    objective = gpvi.Objective(model, X, y)  # raises a clear error if the prior cannot be factorised
    setup = time.perf_counter() - t
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        # compile everything on these shapes (discarded): the data sums with and without
        # clipping, the VLB alone, and each engine's step functions
        t = time.perf_counter()
        objective.sums(init)
        objective.sums(init, clip_gamma=True)
        float(objective.vlb(init))
        for eng in engines:
            kw = dict(opts) if eng != "gradient" else {}
            if eng == "fpb":
                kw["max_newton"] = 2
            engine_run(eng)(objective, init, tol=args.tol, max_iter=2, **kw)
        compile_s = time.perf_counter() - t
        runs = {}
        with C.OtherLoad() as other:
            for eng in engines:
                r = run_engine(eng, objective, init, opts, args.tol, args.budget)
                runs[eng] = r
                log(f"{tag} {eng:9s} VLB={r['final_vlb']:.8g} its={r['iterations']} {r['seconds']:.2f}s "
                    f"{r['status']} (bt={r['backtracks']} cyc={r['cycles']} clip={r['clipped']})")
    best = max(float(np.max(r["trace"][:, 1])) for r in runs.values())
    for r in runs.values():
        r["gap"] = best - r["final_vlb"]
        r["rel_gap"] = r["gap"] / abs(best)
        r["t_hit"], r["it_hit"], r["passes_hit"] = first_hit(r["trace"], best, REL)
        r["t_hit_tight"], r["it_hit_tight"], r["passes_hit_tight"] = first_hit(r["trace"], best, REL_TIGHT)
        r["seconds_per_iteration"] = r["seconds"] / max(r["iterations"], 1)
        r["seconds_per_pass"] = r["seconds"] / max(r["evaluations"], 1)
    cond = conditions(lik, model.likelihood)
    cell = dict(model=kind, likelihood=lik, info=info, setup_seconds=setup, compile_seconds=compile_s,
                best_vlb=best, runs=runs, conditions=cond, other_load=other.result, budget=args.budget)
    cell.update(compare(cell, args))
    cell["gap_notes"] = gap_notes(cell)
    log(f"{tag} best={best:.8g}; FPi/GRAD speed-up {C.fmt(cell['speedup'])} ({cell['verdict_fpi_grad']}); "
        f"FPb/FPi time {C.fmt(cell['fpb_over_fpi'])} ({cell['verdict_fpb_fpi']})")
    return cell


def _ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def _speedup(slow, fast):
    """(t_slow / t_fast, is_lower_bound) at the REL threshold; a lower bound when ``slow``
    never got there (its whole run time over ``fast``'s time); None when ``fast`` never did."""
    if fast["t_hit"] is None:
        return None, False
    if slow["t_hit"] is None:
        return _ratio(slow["seconds"], fast["t_hit"]), True
    return _ratio(slow["t_hit"], fast["t_hit"]), False


def _verdict(ratio, bound):
    if ratio is None:
        return "does not hold"
    if bound or ratio >= TIE:
        return "holds"
    if ratio >= 1.0 / TIE:
        return "partly"  # a tie within the timing noise of this machine
    return "does not hold"


def compare(cell, args):
    """Speed-ups, verdicts and (where FPi is not faster) the reasons, from the runs."""
    R = cell["runs"]
    speed, speed_bound = _speedup(R["gradient"], R["fpi"])
    fpb_ratio, fpb_bound = _speedup(R["fpb"], R["fpi"])
    v1, v2 = _verdict(speed, speed_bound), _verdict(fpb_ratio, fpb_bound)
    out = dict(speedup=speed, speedup_is_lower_bound=speed_bound, fpb_over_fpi=fpb_ratio,
               fpb_over_fpi_is_lower_bound=fpb_bound, verdict_fpi_grad=v1, verdict_fpb_fpi=v2,
               why_not_fpi_grad="" if v1 == "holds" else explain(cell),
               why_not_fpb_fpi="" if v2 == "holds" else explain_fpb(cell))
    if SEQ in R:
        sq, sq_bound = _speedup(R["gradient"], R[SEQ])
        out.update(seq_speedup=sq, seq_speedup_is_lower_bound=sq_bound, verdict_seq_grad=_verdict(sq, sq_bound))
    return out


def _its_text(r):
    """Iterations and data passes to the threshold (or in all, if never reached)."""
    if r["it_hit"] is None:
        return f"{r['iterations']} iterations / {r['evaluations']} data passes in all"
    return f"{r['it_hit']} iteration(s) / {r['passes_hit']} data passes"


def explain(cell):
    """Why FPi was not (clearly) faster than GRAD in this cell."""
    R = cell["runs"]
    fpi, grad = R["fpi"], R["gradient"]
    c = cell["conditions"]
    parts = []
    if fpi["t_hit"] is None:
        parts.append(f"FPi never came within {REL:g} relative of the best VLB ({fpi['status']}: {fpi['message']})")
    else:
        parts.append(f"FPi needed {_its_text(fpi)}, GRAD {_its_text(grad)}")
    diag = []
    if fpi["backtracks"]:
        diag.append(f"{fpi['backtracks']} damped (rejected) step(s) over the whole run ({fpi['iterations']} "
                    "iterations), each costing an extra pass over the data")
        if fpi["backtracks"] >= 0.3 * max(fpi["iterations"], 1):
            diag.append("the joint (m, V) natural-gradient step is rejected in a large share of the iterations "
                        "(an oscillating FP map; gpvi then retries in the FPb order), so the VLB converges slowly")
    if fpi["cycles"]:
        diag.append(f"{fpi['cycles']} 2-cycle(s) of the FP map")
    if fpi["clipped"]:
        diag.append(f"γ clipped at 0 in {fpi['clipped']} step(s) (an extra pass each; the clipped fixed point is "
                    "not the VLB optimum)")
    parts.append("FPi diagnostics: " + ("; ".join(diag) if diag else "no damped steps, cycles or clipping"))
    parts.append(f"likelihood satisfies {conditions_text(c)}"
                 + ("" if c["condition1"] and (c["condition2a"] or c["condition2b"])
                    else " (Theorem 1 gives no convergence guarantee)"))
    if fpi["t_hit"] is not None and grad["t_hit"] is not None:
        f_pass = fpi["t_hit"] / max(fpi["passes_hit"], 1)
        g_pass = grad["t_hit"] / max(grad["passes_hit"], 1)
        if fpi["passes_hit"] > grad["passes_hit"]:
            parts.append(f"FPi needed more data passes than GRAD ({fpi['passes_hit']} vs {grad['passes_hit']})")
        if f_pass > 1.5 * g_pass:
            parts.append(f"and its time per pass was {f_pass / g_pass:.3g}× GRAD's (the d×d Cholesky factorisations "
                         f"and inverse of each step, d = {cell['info']['d']}, on top of the pass)")
    if grad["t_hit"] is not None and fpi["t_hit"] is not None and grad["t_hit"] < 0.05:
        parts.append("both reach the threshold in well under 0.1 s: a tie dominated by fixed overheads")
    if SEQ in R:
        sq = R[SEQ]
        if sq["t_hit"] is None:
            parts.append(f"the paper-order variant (Newton on m, then FP on V) did not reach it either ({sq['message']})")
        else:
            parts.append(f"the paper-order variant (Newton on m, then FP on V) reached it in {sq['t_hit']:.3g} s "
                         f"({_its_text(sq)}, {sq['backtracks']} damped steps)")
    return "; ".join(parts)


def explain_fpb(cell):
    R = cell["runs"]
    fpi, fpb = R["fpi"], R["fpb"]
    if fpi["t_hit"] is None:
        return f"FPi did not reach the threshold ({fpi['message']})"
    return (f"FPb needed {_its_text(fpb)} (each a full Newton loop on m), FPi {_its_text(fpi)} with "
            f"{fpi['backtracks']} damped steps; data passes in all: FPb {fpb['evaluations']}, FPi {fpi['evaluations']}")


def gap_notes(cell):
    """Why an engine ended more than REL_TIGHT·|best| below the best VLB (one line each)."""
    out = []
    for e, r in cell["runs"].items():
        if r["rel_gap"] <= REL_TIGHT:
            continue
        why = []
        if r["clipped"]:
            why.append(f"γ clipped at 0 in {r['clipped']} step(s): the clipped FP map's fixed point is not the VLB "
                       "optimum (Sheth & Khardon's Student-t heuristic), and the safeguard then only creeps "
                       f"({r['backtracks']} damped steps)")
        if r["status"] == "budget":
            why.append(f"stopped by the {cell['budget']:g} s budget after {r['iterations']} iterations")
        elif r["status"] == "converged":
            why.append("its own stopping rule (relative VLB change below tol) fired first")
        else:
            why.append(r["message"])
        out.append(f"{ENGINE_NAMES[e]} ended {r['gap']:.3g} nats ({r['rel_gap']:.2g} relative) below the best: "
                   + "; ".join(why))
    return out


# ---- output -------------------------------------------------------------------------------
def cell_label(c):
    return f"{MODEL_NAMES[c['model']]} / {LIK_NAMES[c['likelihood']]}"


def fmt_time(r):
    return "never" if r["t_hit"] is None else f"{r['t_hit']:.3g}"


def fmt_speed(x, bound):
    return "-" if x is None else (f">{x:.3g}" if bound else f"{x:.3g}")


def print_tables(cells):
    rows = []
    for c in cells:
        if "error" in c:
            rows.append([f"{c['model']}:{c['likelihood']}", "ERROR", c["error"]] + [""] * 13)
            continue
        R = c["runs"]
        rows.append([f"{c['model']}:{c['likelihood']}", c["info"]["dataset"], c["info"]["N"], c["info"]["d"],
                     c["best_vlb"], *(R[e]["final_vlb"] - c["best_vlb"] for e in ENGINES),
                     *(fmt_time(R[e]) for e in ENGINES),
                     fmt_time(R[SEQ]) if SEQ in R else "-",
                     fmt_speed(c["speedup"], c["speedup_is_lower_bound"]),
                     "/".join(str(R[e]["iterations"]) for e in ENGINES),
                     f"{R['fpi']['backtracks']}/{R['fpi']['cycles']}/{R['fpi']['clipped']}",
                     c["verdict_fpi_grad"]])
    C.print_table(["cell", "data", "N", "d", "best VLB", "fpi-best", "fpb-best", "grad-best",
                   "t fpi", "t fpb", "t grad", "t fpi-seq", "FPi speed-up", "its fpi/fpb/grad", "fpi bt/cyc/clip", "verdict"],
                  rows, title=f"VLB against time: seconds to within {REL:g}·|best| of the best VLB")


def overall(verdicts):
    if verdicts and all(v == "holds" for v in verdicts):
        return "holds"
    if verdicts and all(v == "does not hold" for v in verdicts):
        return "does not hold"
    return "partly"


def write_markdown(path, cells, args, total_s, other, env):
    ok = [c for c in cells if "error" not in c]
    v1 = overall([c["verdict_fpi_grad"] for c in ok])
    v2 = overall([c["verdict_fpb_fpi"] for c in ok])
    L = []
    L.append("# VLB against time: FPi vs FPb vs GRAD (Sheth & Khardon 2016, §4, Figs 2–5)\n")
    L.append(f"Generated by `benchmarks/vlb_time.py{' --quick' if args.quick else ''}` on {env['time']} "
             f"({env['cpu_count']} cores, JAX {env['jax']} on {env['jax_backend']}); total run time "
             f"{total_s / 60:.1f} min.  Other processes kept {other['other_cores']:.2f} cores busy on average "
             "while it ran (timings are noisy when this is well above 0).\n")
    L.append("## Paper claims and our results\n")
    L.append("| paper claim | our result | verdict |")
    L.append("|---|---|---|")
    n1 = {v: sum(c["verdict_fpi_grad"] == v for c in ok) for v in ("holds", "partly", "does not hold")}
    n2 = {v: sum(c["verdict_fpb_fpi"] == v for c in ok) for v in ("holds", "partly", "does not hold")}
    sp = [c["speedup"] for c in ok if c["speedup"] is not None]
    L.append(f"| {CLAIMS[0][0]} | FPi faster in {n1['holds']} of {len(ok)} cells, a tie (within ×{TIE:g}) in "
             f"{n1['partly']}, slower in {n1['does not hold']}; speed-up FPi over GRAD (time to {REL:g} relative) "
             f"median {C.fmt(C.median(sp))}, range {C.fmt(min(sp) if sp else None)}–{C.fmt(max(sp) if sp else None)} "
             f"| **{v1}** |")
    L.append(f"| {CLAIMS[1][0]} | FPb slower than FPi in {n2['holds']} of {len(ok)} cells, a tie in {n2['partly']}, "
             f"faster in {n2['does not hold']} | **{v2}** |")
    sq = [c for c in ok if "verdict_seq_grad" in c]
    if sq:
        n3 = {v: sum(c["verdict_seq_grad"] == v for c in sq) for v in ("holds", "partly", "does not hold")}
        sps = [c["seq_speedup"] for c in sq if c["seq_speedup"] is not None]
        L.append(f"| (diagnostic, not a verdict on gpvi) the same claim for FPi in the paper's order — one Newton "
                 f"step on m, then one FP step on V at the new m (`fpi_sequential` in this script) | faster than "
                 f"GRAD in {n3['holds']} of {len(sq)} cells, a tie in {n3['partly']}, slower in {n3['does not hold']}; "
                 f"speed-up median {C.fmt(C.median(sps))}, range {C.fmt(min(sps) if sps else None)}–"
                 f"{C.fmt(max(sps) if sps else None)} | {overall([c['verdict_seq_grad'] for c in sq])} |")
    L.append("")
    L.append("Timings come from one run per engine on a 2-core machine shared with other work; where both "
             "engines need well under a second the speed-up can move by ×2 between runs (the logistic cells "
             "did), while iterations and data passes do not change.\n")
    L.append(f"A cell's verdict is *holds* when FPi reaches `VLB ≥ best − {REL:g}·|best|` at least ×{TIE:g} sooner "
             f"(or the other engine never does within the budget), *partly* for a tie within ×{TIE:g} (the timing "
             "noise of a shared machine), *does not hold* otherwise.  Best = the highest VLB any engine reached.\n")
    L.append("## Per cell\n")
    L.append(f"Times in seconds from the start of the run (after compilation) to within {REL:g}·|best| of the best "
             f"VLB (in parentheses: to within {REL_TIGHT:g}·|best|); `never` = not within the {args.budget:g} s "
             "budget / before the engine stopped.  `final − best` in nats.  Iterations: FPi/FPb outer iterations, "
             "GRAD L-BFGS iterations.  Data passes = evaluations of the data sums (every engine's unit of "
             "O(N·d²) work; FPi/FPb steps add d×d factorisations).  FPi diagnostics (whole run): damped steps / "
             "2-cycles / steps with γ clipped.  "
             "'FPi (m, then V)' is the benchmark-local paper-order variant (see the claims table).\n")
    L.append("| cell | data (N × d) | best VLB | final − best: FPi / FPb / GRAD | time FPi | time FPb | time GRAD "
             "| time FPi (m, then V) | speed-up FPi over GRAD | FPb / FPi time | data passes to threshold FPi / FPb "
             "/ GRAD | iterations in all FPi / FPb / GRAD | FPi diagnostics | conditions | FPi < GRAD | FPi < FPb |")
    L.append("|" + "---|" * 16)
    for c in cells:
        if "error" in c:
            L.append(f"| {c['model']}:{c['likelihood']} | error: {c['error']} |" + " |" * 14)
            continue
        R = c["runs"]
        i = c["info"]

        def t(e, R=R):
            r = R[e]
            tight = "never" if r["t_hit_tight"] is None else f"{r['t_hit_tight']:.3g}"
            s = f"{fmt_time(r)} ({tight})"
            return s + (" [budget]" if r["status"] == "budget" else "")

        L.append(f"| {cell_label(c)} | {i['dataset']} ({i['N']} × {i['d']}) | {c['best_vlb']:.6g} | "
                 + " / ".join(C.fmt(R[e]["final_vlb"] - c["best_vlb"]) for e in ENGINES) + " | "
                 + " | ".join(t(e) for e in ENGINES) + " | "
                 + (t(SEQ) if SEQ in R else "-") + " | "
                 + f"{fmt_speed(c['speedup'], c['speedup_is_lower_bound'])} | "
                 + f"{fmt_speed(c['fpb_over_fpi'], c['fpb_over_fpi_is_lower_bound'])} | "
                 + " / ".join(C.fmt(R[e]["passes_hit"]) for e in ENGINES) + " | "
                 + " / ".join(str(R[e]["iterations"]) for e in ENGINES) + " | "
                 + f"{R['fpi']['backtracks']} / {R['fpi']['cycles']} / {R['fpi']['clipped']} | "
                 + f"{conditions_text(c['conditions'])} | {c['verdict_fpi_grad']} | {c['verdict_fpb_fpi']} |")
    L.append("")
    expl = [c for c in ok if c["why_not_fpi_grad"] or c["why_not_fpb_fpi"]]
    if expl:
        L.append("## Where FPi was not clearly faster: why\n")
        for c in expl:
            if c["why_not_fpi_grad"]:
                L.append(f"- **{cell_label(c)}** (FPi vs GRAD: {c['verdict_fpi_grad']}): {c['why_not_fpi_grad']}.")
            if c["why_not_fpb_fpi"]:
                L.append(f"- **{cell_label(c)}** (FPb vs FPi: {c['verdict_fpb_fpi']}): {c['why_not_fpb_fpi']}.")
        L.append("")
    notes = [(c, n) for c in ok for n in c["gap_notes"]]
    if notes:
        L.append(f"## Runs that ended more than {REL_TIGHT:g}·|best| below the best VLB\n")
        for c, n in notes:
            L.append(f"- **{cell_label(c)}**: {n}.")
        L.append("")
    L.append("## Likelihood conditions (Theorem 1)\n")
    seen = set()
    for c in ok:
        if c["likelihood"] in seen:
            continue
        seen.add(c["likelihood"])
        cd = c["conditions"]
        L.append(f"- {LIK_NAMES[c['likelihood']]}: {conditions_text(cd)} — {cd['source']}"
                 + (f". {cd['summary']}" if cd.get("summary") else ""))
    L.append("- paper: Poisson satisfies C1 + C2a, logistic and Laplace C1 only, Student-t neither (γ clipped at 0).")
    L.append("")
    L.append("## Set-up\n")
    L.append(f"- Engines run to tol = {args.tol:g} (relative VLB change) with a {args.budget:g} s wall budget each, "
             "after a throw-away compile run on the same objective; one run per engine and cell.")
    L.append(f"- GP cells: {args.gp_n} random rows; sparse GP: up to {args.sparse_n} rows, M = {args.m} inducing "
             f"inputs drawn at random from the rows and fixed; hyperparameters from {args.hyper_n} random rows.")
    hp = {}
    for c in ok:
        key = (c["model"] if c["model"] == "glm" else "gp/sparse", c["info"]["dataset"], c["likelihood"])
        if c["info"]["hyperparameters"]:
            hp[key] = c["info"]["hyperparameters"]
    for (m, ds, lk), h in hp.items():
        L.append(f"- hyperparameters {m} {ds} {LIK_NAMES[lk]}: " + ", ".join(f"{k} = {v:.4g}" for k, v in h.items()))
    L.append("- Deviations from the paper's protocol:")
    for d in DEVIATIONS:
        L.append(f"  - {d}")
    if args.quick:
        L.append("- **--quick smoke run**: tiny subsets and budgets; not a reproduction.")
    L.append("")
    L.append(f"Figure: `{args.out}.png` (relative gap (best − VLB)/|best| against time, log–log; dotted line "
             f"= {REL:g}).")
    path.write_text("\n".join(L) + "\n")


def figure(cells, path):
    plt = C.pyplot()
    models = [m for m in MODELS if any(c["model"] == m for c in cells)]
    liks = [k for k in LIKELIHOODS if any(c["likelihood"] == k for c in cells)]
    fig, axes = plt.subplots(len(models), len(liks), figsize=(4.2 * len(liks), 3.4 * len(models)), squeeze=False)
    colours = {"fpi": "C0", "fpb": "C1", "gradient": "C2", SEQ: "C3"}
    styles = {"fpi": "-", "fpb": "--", "gradient": "-", SEQ: ":"}
    floor = 1e-13
    for ax in axes.flat:
        ax.set_visible(False)
    for c in cells:
        ax = axes[models.index(c["model"]), liks.index(c["likelihood"])]
        ax.set_visible(True)
        if "error" in c:
            ax.set_title(f"{cell_label(c)}: error", fontsize=9)
            continue
        best = c["best_vlb"]
        for e in (e for e in ALL_ENGINES if e in c["runs"]):
            tr = np.asarray(c["runs"][e]["trace"])
            t = np.maximum(tr[:, 0], 1e-4)
            gap = np.maximum((best - tr[:, 1]) / abs(best), floor)
            ax.plot(t, gap, styles[e], color=colours[e], lw=1.4, marker="." if len(t) < 60 else None, ms=3,
                    label=ENGINE_NAMES[e])
        ax.axhline(REL, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        i = c["info"]
        ax.set_title(f"{cell_label(c)}\n{i['dataset']} ({i['N']}×{i['d']}), FPi×{fmt_speed(c['speedup'], c['speedup_is_lower_bound'])}",
                     fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=8)
        ax.set_ylabel("(best − VLB)/|best|", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _thin(trace, k=400):
    """At most ~k rows of a trace for the JSON (first, last and evenly spaced)."""
    trace = np.asarray(trace)
    if len(trace) <= k:
        return trace
    idx = np.unique(np.r_[np.linspace(0, len(trace) - 1, k).astype(int), len(trace) - 1])
    return trace[idx]


def main(argv=None):
    args = parse_args(argv)
    load_start = C.warn_if_busy()
    t0 = time.perf_counter()
    log = C.progress_logger(t0)

    data = Data()
    cells, hypers = [], {}
    with C.OtherLoad() as other:
        for kind, lik in args.cells:
            try:
                dataset = DATA[(kind, lik)]
                key = (kind if kind == "glm" else "gp", dataset, lik)
                if key not in hypers:
                    X, y = data.get(dataset)
                    hypers[key] = estimate_hyperparameters(kind, lik, dataset, X, y, args, log)
                cells.append(run_cell(kind, lik, data, hypers, args, log))
            except D.DataUnavailable:
                raise
            except Exception as err:  # noqa: BLE001  (keep the other cells of a long run)
                log(f"[{kind}:{lik}] ERROR {type(err).__name__}: {err}")
                cells.append(dict(model=kind, likelihood=lik, error=f"{type(err).__name__}: {err}"))
    total = time.perf_counter() - t0
    print_tables(cells)
    ok = [c for c in cells if "error" not in c]
    print(f"\n  claim 'FPi faster than GRAD in every cell': {overall([c['verdict_fpi_grad'] for c in ok])}")
    print(f"  claim 'FPb slower than FPi': {overall([c['verdict_fpb_fpi'] for c in ok])}")
    print(f"  other processes kept {other.result['other_cores']:.2f} of {os.cpu_count()} cores busy on average")
    print(f"  total runtime {total:.1f} s ({total / 60:.1f} min)")
    out = C.results_dir(args.outdir)
    figure(cells, out / f"{args.out}.png")
    env = C.environment()
    write_markdown(out / f"{args.out}.md", cells, args, total, other.result, env)
    for c in ok:
        for r in c["runs"].values():
            r["trace"] = _thin(r["trace"])
    config = {k: v for k, v in vars(args).items() if k != "cells"}
    config["cells"] = [f"{m}:{k}" for m, k in args.cells]
    C.write_json(out / f"{args.out}.json", dict(
        benchmark="vlb_time", paper="Sheth & Khardon 2016, Figs 2-5", config=config, environment=env,
        rel_threshold=REL, rel_threshold_tight=REL_TIGHT, tie_factor=TIE, claims=[c[0] for c in CLAIMS],
        verdict_fpi_grad=overall([c["verdict_fpi_grad"] for c in ok]),
        verdict_fpb_fpi=overall([c["verdict_fpb_fpi"] for c in ok]),
        deviations=DEVIATIONS, total_seconds=total, load_average_start=load_start,
        load_average_end=C.load_average(), other_load=other.result,
        hyperparameters={f"{k[0]}:{k[1]}:{k[2]}": v for k, v in hypers.items()}, cells=cells))
    print(f"\nwrote {out / (args.out + '.json')}, .md and .png")
    return cells


if __name__ == "__main__":
    main()
