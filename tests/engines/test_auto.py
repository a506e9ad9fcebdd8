"""``engine="auto"`` (gpvi.engines.auto): on every model kind the suite fits, it picks a certified
engine, says why, and ends at the optimum another engine certifies independently."""
import numpy as np
import pytest

import gpvi
from gpvi import kernels as K
from gpvi import likelihoods as L
from gpvi.engines import auto, get
from problems import problem, regression_data

N = 50


def _kinds():
    """(id, model, X, y, fit options): the model kinds of the suite, each small."""
    rng = np.random.default_rng(7)
    out = []
    lik, X, y = problem("poisson", rng, N)
    out.append(("glm-poisson", gpvi.GLM(lik), np.c_[X, np.ones(N)], y, {}))
    lik, X, y = problem("logit", rng, N)
    out.append(("gp-bernoulli", gpvi.GP(K.RBF(lengthscale=1.2), lik), X, y, {}))
    lik, X, y = problem("studentt", rng, N)
    out.append(("sparse-studentt", gpvi.SparseGP(K.RBF(lengthscale=1.2), lik, inducing=8), X, y, {}))
    lik, X, y = problem("ordinal", rng, N)
    out.append(("gp-ordinal", gpvi.GP(K.RBF(lengthscale=1.2), lik), X, y, {}))
    X, f = regression_data(rng, N)
    y = f + 0.3 * rng.standard_normal(N)
    out.append(("gp-gaussian-learned", gpvi.GP(K.RBF(), L.Gaussian(variance=0.2)), X, y,
                {"learn_hyperparameters": True, "max_rounds": 30}))
    out.append(("sparse-gaussian-blockwise", gpvi.SparseGP(K.RBF(), L.Gaussian(variance=0.2), inducing=8), X, y,
                {"executor": "local"}))
    labels = (X[:, 0] > -1).astype(int) + (X[:, 0] > 1)
    out.append(("softmax-3", gpvi.MultiLatent.full([K.RBF(lengthscale=1.5)] * 3, gpvi.Softmax(num_classes=3)), X,
                labels.astype(float), {}))
    return out


KINDS = _kinds()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=[k[0] for k in KINDS])
def test_auto_picks_a_certified_engine_that_reaches_the_optimum(kind):
    _, model, X, y, opts = kind
    fit = gpvi.fit(model, X, y, engine="auto", **opts)
    assert fit.engine in auto.PREFERENCE and get(fit.engine).certifies
    assert fit.converged, fit.message
    choice = fit.extras["engine_choice"]
    assert choice.startswith(f"engine='auto' chose {fit.engine!r}: ") and type(model.likelihood).__name__ in choice \
        or "Gaussian likelihood" in choice
    assert "engine choice: engine='auto'" in fit.summary()
    # the optimum, certified by another engine (L-BFGS on (m, chol V)) at the same hyperparameters
    ref = gpvi.fit(fit.model, X, y, engine="gradient", tol=1e-10, max_iter=3000,
                   **{k: v for k, v in opts.items() if k == "executor"})
    assert ref.converged, ref.message
    assert fit.vlb <= ref.vlb + 1e-8 * abs(ref.vlb)
    assert ref.vlb - fit.vlb <= 1e-6 * max(1.0, abs(ref.vlb)), (fit.vlb, ref.vlb)


def test_named_engines_carry_no_choice():
    _, model, X, y, _ = KINDS[1]
    fit = gpvi.fit(model, X, y, engine="fpi")
    assert "engine_choice" not in fit.extras and "engine choice" not in fit.summary()


def test_choose_takes_the_first_engine_that_can_run_the_model(monkeypatch):
    single = gpvi.GP(K.RBF(), L.Bernoulli())
    multi = gpvi.MultiLatent.full([K.RBF()] * 3, gpvi.Softmax(num_classes=3))
    assert auto.choose(single).engine.name == "fpi"
    monkeypatch.setattr(auto, "PREFERENCE", ("fpb", "gradient"))
    assert auto.choose(single).engine.name == "fpb"
    c = auto.choose(multi)  # fpb fits one latent function only
    assert c.engine.name == "gradient" and "MultiLatent with 3 latent functions" in c.reason
    monkeypatch.setattr(auto, "PREFERENCE", ("dual", "laplace"))  # both need the rows in memory
    assert auto.choose(single).engine.name == "dual"
    with pytest.raises(ValueError, match=r"no certified engine can run a GP, Bernoulli likelihood read block by "
                                         r"block \(dual \(needs the rows in memory\); laplace"):
        auto.choose(single, blockwise=True)
    with pytest.raises(ValueError, match="no certified engine"):
        gpvi.fit(single, *regression_data(np.random.default_rng(0), 20)[:1], np.ones(20), engine="auto",
                 executor="local")


def test_auto_is_checked_like_a_named_engine():
    _, model, X, y, _ = KINDS[1]
    with pytest.raises(ValueError, match="engine must be one of"):
        gpvi.fit(model, X, y, engine="Auto")
    with pytest.raises(ValueError, match="engine_options"):
        gpvi.fit(model, X, y, engine="auto", engine_options={"no_such_option": 1})


@pytest.mark.slow
def test_auto_in_the_estimators_and_the_command_line(tmp_path, capsys):
    from gpvi.cli import main
    from clitools import write_csv

    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 2))
    y = (X[:, 0] + 0.3 * rng.standard_normal(60) > 0).astype(int)
    clf = gpvi.GPClassifier(engine="auto", max_rounds=5).fit(X, y)
    assert clf.fit_result_.engine == "fpi" and "engine_choice" in clf.fit_result_.extras
    data = write_csv(tmp_path / "d.csv", ["a", "b", "y"], np.c_[X, y].tolist())
    rc = main(["fit", str(data), "-t", "y", "--engine", "auto", "--max-rounds", "5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "engine fpi" in out
