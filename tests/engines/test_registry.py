"""Every registered engine, swept from the registry, and the registry itself.

``check_engine(engine)`` reads only the engine's record (:class:`gpvi.engines.Engine`) to pick a
problem the engine can take, then checks it against truths computed here, independently of gpvi:

- Gaussian likelihood: the exact log marginal likelihood of GP regression (full GP) or Titsias'
  (2009) collapsed bound (sparse GP), in NumPy, at the hyperparameters the fit ended with (the
  joint engines may move them).  Every VLB is at most that; a VLB maximiser comes close to it.
- an engine that refuses the Gaussian likelihood (the jj family: Bernoulli logit only) is fitted
  to Bernoulli data and compared with the default engine, ``fpi``, converged on the same model;
- ``engine_options`` are checked against the record's ``options``;
- the fitted result is saved, loaded and predicts bit for bit as before.

The sweep is parametrized from ``gpvi.engines.names()`` at collection (no list kept here); an
engine registered later is checked by calling ``check_engine`` on it, as the toy engine below is.
"""
import ast
import inspect
import re
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.engines import Engine, EngineResult, Progress, get, names, register, unregister
from gpvi.objective import State
from problems import jittered, regression_data

# One small problem for every engine, so that XLA compiles few programs: 60 rows in 2-D,
# a full GP (60 weights) or a sparse GP with 8 inducing inputs, a fixed RBF kernel.
N, M = 60, 8
TOL = 1e-6  # fit()'s default relative tolerance
FIXED_RNG = np.random.default_rng(20260311)
X, _F = regression_data(FIXED_RNG, N)
Y_GAUSSIAN = _F + 0.3 * FIXED_RNG.standard_normal(N)
Y_BERNOULLI = (FIXED_RNG.uniform(size=N) < 1 / (1 + np.exp(-2 * _F))).astype(int)
X_TEST = np.array([[-2.0, 0.5], [0.0, 0.0], [1.5, -1.0], [2.5, 2.5]])
KERNEL = dict(variance=1.2, lengthscale=1.1)
NOISE, MEAN = 0.09, 0.1


def _likelihoods():
    """The likelihoods an engine is tried with, in order, with their targets."""
    return [(L.Gaussian(variance=NOISE), Y_GAUSSIAN), (L.Bernoulli(), Y_BERNOULLI)]


def _model(kind, likelihood):
    kernel = gpvi.kernels.RBF(**KERNEL)
    if kind == "sparse":
        return gpvi.SparseGP(kernel=kernel, likelihood=likelihood, inducing=M, mean=MEAN)
    return gpvi.GP(kernel=kernel, likelihood=likelihood, mean=MEAN)


# Iteration limit of every fit here (fit's default).  An iteration of a minibatch engine is one
# minibatch step or one epoch, here the same thing (the default batch is all 60 rows): svi's
# AdaDelta needs about 500 to come within 0.2 nats of the optimum (300: 4 nats, 200: 48 nats);
# the certified engines converge in a few (fpi, fpb: one) to ~50 (gradient, dual) iterations.
MAX_ITER = 500


# ---- the truths ------------------------------------------------------------------------------
def _bumps(A, la, B, lb):
    """``Π_d (2 la lb / (la² + lb²))^½ exp(−Σ_d (a − b)² / (la² + lb²))`` for rows of ``A``
    (lengthscales ``la``) against rows of ``B`` (``lb``): the RBF correlation when ``la = lb``
    (the lengthscale), and the multiscale inducing functions of Cheng & Boots (2016, Eq. 17)."""
    la = np.broadcast_to(la, A.shape)[:, None, :]
    lb = np.broadcast_to(lb, B.shape)[None, :, :]
    s2 = la**2 + lb**2
    return np.prod(np.sqrt(2 * la * lb / s2), -1) * np.exp(-np.sum((A[:, None, :] - B[None, :, :]) ** 2 / s2, -1))


def gaussian_evidence(model, X, y):
    """The largest VLB of ``model`` (Gaussian likelihood, RBF or multiscale RBF kernel) on ``(X, y)``:
    the log marginal likelihood of a full GP, Titsias' collapsed bound of a sparse GP."""
    k = model.kernel
    assert type(k) in (gpvi.kernels.RBF, gpvi.kernels.MultiscaleRBF), type(k)
    s2 = float(k.variance)
    ls = np.broadcast_to(np.asarray(k.lengthscale, np.float64), (X.shape[1],))
    noise, mu = float(model.likelihood.variance), float(model.mean)
    r = y - mu
    n = X.shape[0]
    if isinstance(model, gpvi.SparseGP):
        Z = np.asarray(model.inducing, np.float64)
        lz = getattr(k, "inducing_lengthscale", None)
        lz = ls if lz is None else np.asarray(lz, np.float64)
        Kmm = jittered(s2 * _bumps(Z, lz, Z, lz), model.jitter)
        Kmn = s2 * _bumps(Z, lz, X, ls)
        Qnn = Kmn.T @ np.linalg.solve(Kmm, Kmn)
        trace = n * s2 - np.trace(Qnn)
    else:
        Qnn, trace = jittered(s2 * _bumps(X, ls, X, ls), model.jitter), 0.0
    C = Qnn + noise * np.eye(n)
    logdet = np.linalg.slogdet(C)[1]
    return -0.5 * (n * np.log(2 * np.pi) + logdet + r @ np.linalg.solve(C, r)) - 0.5 * trace / noise


@lru_cache(maxsize=None)
def _reference(kind, likelihood_name):
    """The default engine (fpi) converged tightly on the same problem: the VLB to compare with."""
    lik, y = {type(lik).__name__: (lik, y) for lik, y in _likelihoods()}[likelihood_name]
    res = gpvi.fit(_model(kind, lik), X, y, engine="fpi", tol=1e-10)
    assert res.converged, res.message
    return res.vlb


# ---- the sweep -------------------------------------------------------------------------------
def fit_some_problem(engine):
    """``(fit, kind, likelihood name, y)``: the first problem the engine takes.

    The record says which model: a minibatch engine needs a prior that does not grow with the
    data (a sparse GP); the others are tried on a full GP first.  The likelihood is not in the
    record: Gaussian first; a ``ValueError`` that names the model's or the likelihood's class
    (what gpvi raises for a model or likelihood an engine does not support) moves on to the
    next candidate, any other error fails the check."""
    kinds = ["sparse"] if engine.data == "minibatch" else ["full", "sparse"]
    refusals = []
    for kind in kinds:
        for lik, y in _likelihoods():
            model = _model(kind, lik)
            try:
                fit = gpvi.fit(model, X, y, engine=engine.name, max_iter=MAX_ITER, tol=TOL)
            except ValueError as err:
                if type(model).__name__ not in str(err) and type(lik).__name__ not in str(err):
                    raise
                refusals.append(str(err))
                continue
            return fit, kind, type(lik).__name__, y
    pytest.fail(f"engine {engine.name!r} took none of the test problems: {refusals}")


def check_engine(engine, directory=None):
    """Check one engine (a name or an :class:`Engine`) against the truths (module docstring)."""
    engine = get(engine)
    fit, kind, lik_name, y = fit_some_problem(engine)
    assert fit.engine == engine.name
    assert np.isfinite(fit.vlb), fit.message
    assert fit.trace.ndim == 2 and fit.trace.shape[1] == 2 and fit.trace.shape[0] >= 1
    scale = max(1.0, abs(fit.vlb))

    # (a) the VLB against an independent truth
    if lik_name == "Gaussian":
        truth = gaussian_evidence(fit.model, X, y)
        # No Gaussian q does better than the optimum (rounding: 1e-9 relative).
        assert fit.vlb <= truth + 1e-9 * scale, f"VLB {fit.vlb!r} above the truth {truth!r}"
        if engine.evidence == "laplace":
            # Not a VLB maximiser in general, but with a Gaussian likelihood the log posterior is
            # quadratic: one Newton step finds the mode, N(mode, H⁻¹) is the exact posterior, so
            # both the Laplace evidence it reports and the VLB of its Gaussian are the log
            # marginal likelihood (to rounding; a wrong curvature or mode is off by nats).
            np.testing.assert_allclose(fit.extras["log_marginal"], truth, rtol=1e-9)
            np.testing.assert_allclose(fit.vlb, truth, rtol=1e-9)
        elif engine.data == "minibatch":
            # Stochastic engines carry no certificate; 500 epochs/steps of full-batch (60-row)
            # minibatches come within a few nats of the optimum (svi's AdaDelta is the slowest,
            # 0.18 nats below; sfp's first step, gamma = 1 on the full batch, is exact; ivsgpr
            # ends ~2e-4 nats below the bound at the hyperparameters it learned).  5 nats is
            # < 0.1 nat per row, where the prior state is 518 nats below and a wrong N/B scale or
            # a sign error leaves tens to hundreds of nats.
            assert truth - fit.vlb <= 5.0, f"VLB {truth - fit.vlb:.3g} nats below the truth: {fit.message}"
        else:
            # A certified engine stops when its estimated gap (exact for a Gaussian likelihood)
            # is at most 0.1·tol·|VLB|, so it is within tol relative of the optimum.
            assert fit.converged, fit.message
            assert truth - fit.vlb <= TOL * scale, f"VLB {truth - fit.vlb:.3g} nats below the truth: {fit.message}"
    else:
        # An engine that only takes other likelihoods (jj, taylor, jj-hybrid, jj-full:
        # Bernoulli logit) maximises a surrogate of the expected log-likelihood; the true VLB of
        # its q is then at most the optimum (fpi converged to 1e-10; slack 1e-8 relative for that
        # tolerance and rounding) and close to it: the JJ and Taylor surrogates end 0.04 nats
        # below on these 60 rows, where the prior state is 12.5 nats below.
        best = _reference(kind, lik_name)
        assert fit.vlb <= best + 1e-8 * max(1.0, abs(best)), f"VLB {fit.vlb!r} above fpi's {best!r}"
        assert best - fit.vlb <= 2.0, f"VLB {best - fit.vlb:.3g} nats below fpi's: {fit.message}"

    # (b) options: unknown ones are refused with the list of the engine's own ones, all of which
    # are keyword-only parameters of its run (and none of the arguments every run takes).
    with pytest.raises(ValueError) as err:
        gpvi.fit(fit.model, X, y, engine=engine.name, engine_options={"no_such_option": 1})
    assert repr(engine.name) in str(err.value) and "no_such_option" in str(err.value)
    assert str(sorted(engine.options)) in str(err.value), str(err.value)
    params = inspect.signature(engine.run).parameters
    for option in engine.options:
        assert params[option].kind is inspect.Parameter.KEYWORD_ONLY, option
    assert not set(engine.options) & {"objective", "state", "tol", "tol_nats", "max_iter", "callback", "on_state"}
    assert engine.certifies == ("tol_nats" in params)

    # (d) the state hook: the engine shows its iterates to on_state, each with the VLB its trace
    # records (for a deterministic engine: the VLB of that state, recomputed here), and ends the
    # run, unconverged and saying so, when the hook returns True
    model = _model(kind, dict((type(lik).__name__, lik) for lik, _ in _likelihoods())[lik_name])
    seen = []
    watched = gpvi.fit(model, X, y, engine=engine.name, max_iter=MAX_ITER, tol=TOL,
                       on_state=lambda m, s, p: seen.append((m, s, p)))
    assert seen and [p.iteration for _, _, p in seen] == sorted(p.iteration for _, _, p in seen)
    assert all(p.round is None for _, _, p in seen)
    traced = set(watched.trace[:, 1].tolist())
    assert all(p.vlb in traced for _, _, p in seen), "a state shown with a VLB the trace does not hold"
    if engine.data != "minibatch":
        for m, s, p in seen[:: max(1, len(seen) // 5)]:
            vlb = float(gpvi.objective.Objective(m, X, m.likelihood.validate(y)).vlb(s))
            np.testing.assert_allclose(p.vlb, vlb, rtol=1e-9, err_msg=f"iteration {p.iteration}")
    stopped = gpvi.fit(model, X, y, engine=engine.name, max_iter=MAX_ITER, tol=TOL,
                       on_state=lambda m, s, p: p.iteration >= 1)
    assert not stopped.converged and gpvi.engines.STOPPED in stopped.message, stopped.message
    # it ends at the first iterate after the start, the one the watched run showed first
    assert stopped.iterations == 1, stopped.iterations
    if engine.data != "minibatch":  # (deterministic: the same first iterate in both runs)
        first = next(p.vlb for _, _, p in seen if p.iteration == 1)
        np.testing.assert_allclose(stopped.vlb, first, rtol=1e-9)
    with pytest.raises(ValueError, match="on_state"):
        gpvi.fit(model, X, y, engine=engine.name, on_state="print")

    # (c) the result saves, loads and predicts as before, bit for bit
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = gpvi.io.save(fit, Path(tmp) / "m.gpvi")
        back = gpvi.io.load(path)
    assert back.engine == engine.name and back.vlb == fit.vlb
    for a, b in zip(back.predict_f(X_TEST), fit.predict_f(X_TEST)):
        np.testing.assert_array_equal(a, b)
    return fit


@pytest.mark.parametrize("name", names())
@pytest.mark.slow
def test_engine(name, tmp_path):
    check_engine(get(name), tmp_path)


# ---- a toy engine, registered from outside gpvi ----------------------------------------------
def toy_run(objective, state, *, tol=1e-6, tol_nats=None, max_iter=100, callback=None, on_state=None):
    """Undamped fixed-point iterations ``V ← (I − S)⁻¹``, ``m ← m + V ∇_m VLB`` from the data sums
    (exact in one step for a Gaussian likelihood), stopping on the estimated gap
    ``½ gᵀH⁻¹g + ½ [tr(HV) − log det(HV) − d]`` (H = I − S), in NumPy."""
    t0, rows = time.perf_counter(), []
    sums = objective.sums(state)
    rows.append((0.0, float(sums.vlb)))
    it, converged, message = 0, False, f"reached max_iter={max_iter}"
    while True:
        g, H = np.asarray(sums.grad), np.eye(state.mean.shape[0]) - np.asarray(sums.S)
        C = np.asarray(state.chol)
        HV = H @ C @ C.T
        gap = 0.5 * g @ np.linalg.solve(H, g) + 0.5 * (np.trace(HV) - np.linalg.slogdet(HV)[1] - len(g))
        thr = tol_nats if tol_nats is not None else 0.1 * tol * max(1.0, abs(float(sums.vlb)))
        if gap <= thr:
            converged, message = True, f"estimated gap {gap:.3g} nats"
            break
        if it == max_iter:
            break
        V = np.linalg.inv(H)
        state = State(jnp.asarray(np.asarray(state.mean) + V @ g), jnp.asarray(np.linalg.cholesky(0.5 * (V + V.T))))
        sums = objective.sums(state)
        it += 1
        rows.append((time.perf_counter() - t0, float(sums.vlb)))
        if callback is not None:
            callback(it, rows[-1][1], rows[-1][0])
        if on_state is not None and on_state(objective.model, state, Progress(it, *rows[-1][::-1])):
            message = gpvi.engines.STOPPED
            break
    return EngineResult(state, float(sums.vlb), it, converged, message, np.asarray(rows),
                        evaluations=objective.num_evaluations, gap=float(gap))


@pytest.fixture
def toy():
    engine = register(Engine("toy", toy_run, "undamped fixed point in NumPy (a test's engine)", data="sums"))
    try:
        yield engine
    finally:
        unregister("toy")


def test_toy_engine_fits_like_fpi(toy):
    model = _model("full", L.Gaussian(variance=NOISE))
    fit = gpvi.fit(model, X, Y_GAUSSIAN, engine="toy")
    ref = gpvi.fit(model, X, Y_GAUSSIAN, engine="fpi")
    assert fit.converged and fit.engine == "toy" and fit.iterations >= 1
    # both certified to a gap of 0.1·tol·|VLB| (tol = 1e-6): they agree to tol relative
    np.testing.assert_allclose(fit.vlb, ref.vlb, rtol=TOL)
    np.testing.assert_allclose(fit.predict_f(X_TEST)[0], ref.predict_f(X_TEST)[0], rtol=1e-6, atol=1e-8)
    assert "toy" in gpvi.engines.ENGINES and "toy" in names(data="sums") and "toy" not in names(streams=True)
    # where one step is not exact (Bernoulli: 4 iterations), the same agreement with fpi
    fit = gpvi.fit(_model("full", L.Bernoulli()), X, Y_BERNOULLI, engine="toy")
    assert fit.converged and fit.iterations > 1, fit.message
    np.testing.assert_allclose(fit.vlb, _reference("full", "Bernoulli"), rtol=TOL)


def test_toy_engine_passes_the_sweep(toy, tmp_path):
    check_engine(get("toy"), tmp_path)


def test_the_sweep_fails_wrong_engines(toy, tmp_path):
    """check_engine is falsifiable: an engine that claims convergence at its starting state, and
    one that reports a VLB 1e-3 nats above its state's, are both caught."""
    def lazy(objective, state, *, tol=1e-6, max_iter=100, callback=None, on_state=None):
        vlb = float(objective.vlb(state))
        return EngineResult(state, vlb, 0, True, "converged (not really)", np.array([[0.0, vlb]]))

    def boastful(objective, state, *, tol=1e-6, max_iter=100, callback=None, on_state=None):
        res = toy_run(objective, state, tol=tol, max_iter=max_iter, callback=callback, on_state=on_state)
        res.vlb += 1e-3
        return res

    for run, why in [(lazy, "nats below the truth"), (boastful, "above the truth")]:
        register(Engine("toy", run, "a wrong engine", data="sums"), replace=True)
        with pytest.raises(AssertionError, match=why):
            check_engine(get("toy"), tmp_path)


def test_toy_engine_on_the_command_line(toy, tmp_path, capsys):
    from gpvi.cli import build_parser, main

    args = build_parser().parse_args(["fit", "d.csv", "-t", "y", "-l", "gaussian", "--engine", "toy"])
    assert args.engine == "toy"
    data = tmp_path / "d.csv"
    rows = [f"{float(a)!r},{float(b)!r},{float(c)!r}\n" for (a, b), c in zip(X[:30], Y_GAUSSIAN[:30])]
    data.write_text("x1,x2,y\n" + "".join(rows))
    out = tmp_path / "toy.gpvi"
    rc = main(["fit", str(data), "-t", "y", "-l", "gaussian", "-m", "full", "--engine", "toy", "--max-rounds", "5",
               "-q", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    fit = gpvi.io.load(out)
    assert fit.engine == "toy" and fit.converged


def test_command_line_engines_are_the_registry():
    from gpvi.cli import build_parser

    parser = build_parser()
    for name in names():
        assert parser.parse_args(["fit", "d.csv", "-t", "y", "-l", "gaussian", "--engine", name]).engine == name
    with pytest.raises(SystemExit):  # "toy" is not registered outside the fixture
        parser.parse_args(["fit", "d.csv", "-t", "y", "-l", "gaussian", "--engine", "toy"])


def test_engine_records_are_checked(toy):
    def no_tol(objective, state, *, max_iter=10, callback=None, on_state=None):
        return None

    def no_max_iter(objective, state, *, tol=1e-6, callback=None, on_state=None):
        return None

    def no_callback(objective, state, *, tol=1e-6, max_iter=10, on_state=None):
        return None

    def no_on_state(objective, state, *, tol=1e-6, max_iter=10, callback=None):
        return None

    with pytest.raises(ValueError, match="data must be one of"):
        Engine("bad", toy_run, "s", data="chunks")
    for run, missing in [(no_tol, "tol"), (no_max_iter, "max_iter"), (no_callback, "callback"),
                         (no_on_state, "on_state")]:
        with pytest.raises(ValueError, match=rf"run must take the keyword arguments \['{missing}'\]"):
            Engine("bad", run, "s")
    with pytest.raises(ValueError, match="learn= is given exactly when"):
        Engine("bad", toy_run, "s", learn=lambda *a, **k: None)
    with pytest.raises(ValueError, match="learn= is given exactly when"):
        Engine("bad", toy_run, "s", hyperparameters="own")
    with pytest.raises(ValueError, match="hyperparameters must be one of"):
        Engine("bad", toy_run, "s", hyperparameters="learned")
    with pytest.raises(ValueError, match="takes hyperparameters="):
        Engine("bad", toy_run, "s", hyperparameters="joint")
    with pytest.raises(ValueError, match="name"):
        Engine(" toy", toy_run, "s")
    # a second engine of a registered name needs replace=True
    other = Engine("toy", toy_run, "another toy", data="rows")
    with pytest.raises(ValueError, match="already registered"):
        register(other)
    with pytest.raises(ValueError, match="already registered"):
        register(Engine("fpi", toy_run, "not fpi"))
    assert get("toy") is toy and get("fpi").run is gpvi.engines.fpi.run
    assert register(other, replace=True) is other and get("toy") is other
    register(toy, replace=True)
    with pytest.raises(ValueError, match="no attribute"):
        names(speed="fast")
    with pytest.raises(ValueError, match="engine must be one of"):
        get("no-such-engine")


# ---- streams ---------------------------------------------------------------------------------
def test_fit_stream_takes_exactly_the_streaming_engines():
    streaming = names(streams=True)
    assert streaming, "no engine streams"
    model = _model("sparse", L.Gaussian(variance=NOISE))
    for name in [n for n in names() if n not in streaming] + ["no-such-engine"]:
        with pytest.raises(ValueError) as err:
            gpvi.fit_stream(model, X, Y_GAUSSIAN, engine=name)
        listed = ast.literal_eval(re.search(r"\[[^\]]*\]", str(err.value)).group(0))
        assert listed == streaming, str(err.value)
        assert repr(name) in str(err.value)
    for name in streaming:
        fit = gpvi.fit_stream(model, X, Y_GAUSSIAN, engine=name, epochs=1)
        assert fit.engine == name and np.isfinite(fit.vlb)
    # fit_stream reads the registry: an engine registered with streams=True is on its list
    register(Engine("toy-stream", toy_run, "a streaming record", data="minibatch", streams=True))
    try:
        with pytest.raises(ValueError) as err:
            gpvi.fit_stream(model, X, Y_GAUSSIAN, engine="no-such-engine")
        assert ast.literal_eval(re.search(r"\[[^\]]*\]", str(err.value)).group(0)) == streaming + ["toy-stream"]
    finally:
        unregister("toy-stream")
    assert names(streams=True) == streaming


def test_default_max_iter_is_the_runs_default():
    def capped(objective, state, *, tol=1e-6, max_iter=7, callback=None, on_state=None):
        return None

    def uncapped(objective, state, *, tol=1e-6, max_iter=None, callback=None, on_state=None):
        return None

    def required(objective, state, *, tol=1e-6, max_iter, callback=None, on_state=None):
        return None

    assert [Engine("e", f, "s").default_max_iter for f in (capped, uncapped, required)] == [7, None, 500]
    assert get("fpi").default_max_iter == 500 and get("sfp").default_max_iter is None
