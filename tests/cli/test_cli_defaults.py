"""`gpvi fit` and the estimators share one default policy (gpvi.fitting.defaults): the same CSV
fitted through either front end gives the same model kind, kernel, inducing count and VLB."""
import csv

import numpy as np
import pytest

import gpvi
from gpvi.cli import main
from gpvi.fitting import defaults

N, D = 120, 3


def _data(kind):
    rng = np.random.default_rng(11)
    X = rng.normal(size=(N, D)) * [1.0, 3.0, 0.5] + [0.0, 10.0, -2.0]  # columns of unlike scales
    f = np.sin(X[:, 0]) + 0.3 * (X[:, 1] - 10.0) - 0.8 * (X[:, 2] + 2.0)
    if kind == "bernoulli":
        y = (f + 0.5 * rng.normal(size=N) > 0).astype(int)
    elif kind == "gaussian":
        y = 50.0 + 5.0 * f + rng.normal(size=N)
    elif kind == "poisson":
        y = rng.poisson(np.exp(0.5 + 0.5 * f))
    else:  # ordinal: levels 0, 1, 2
        y = np.digitize(f + 0.4 * rng.normal(size=N), [-0.7, 0.7])
    return X, y


def _csv(path, X, y):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"x{j}" for j in range(D)] + ["y"])
        for row, t in zip(X, y):
            w.writerow([repr(float(v)) for v in row] + [int(t) if float(t).is_integer() else repr(float(t))])
    return path


ESTIMATORS = {"bernoulli": gpvi.GPClassifier, "gaussian": gpvi.GPRegressor,
              "poisson": gpvi.GPCountRegressor, "ordinal": gpvi.GPOrdinalRegressor}


def _both(tmp_path, lik, cli_args=(), est_args=None, X=None, y=None):
    """(FitResult, extra) of `gpvi fit` and the fitted estimator, on one CSV."""
    if X is None:
        X, y = _data(lik)
    path = _csv(tmp_path / f"{lik}.csv", X, y)
    out = tmp_path / f"{lik}.gpvi"
    assert main(["fit", str(path), "-t", "y", "-l", lik, "-q", "-o", str(out), *cli_args]) == 0
    fit, extra = gpvi.io.load(out, with_extra=True)
    # the estimator reads the numbers the CSV holds
    est = ESTIMATORS[lik](**(est_args or {})).fit(X, y)
    return fit, extra, est


def _assert_same(fit, extra, est):
    assert extra["model"] == est.model_kind_
    m_cli, m_est = fit.model, est.fit_result_.model
    assert type(m_cli) is type(m_est)
    assert type(m_cli.kernel) is type(m_est.kernel)
    for name in ("lengthscale", "variance"):
        assert np.shape(getattr(m_cli.kernel, name)) == np.shape(getattr(m_est.kernel, name))
    if extra["model"] == "sparse":
        assert np.shape(m_cli.inducing) == np.shape(m_est.inducing)
    np.testing.assert_allclose(extra["x_mean"], est.x_mean_, rtol=1e-12)
    np.testing.assert_allclose(extra["x_scale"], est.x_scale_, rtol=1e-12)
    assert fit.vlb == pytest.approx(est.vlb_, rel=1e-6)
    for name, value in m_cli.parameters().items():
        np.testing.assert_allclose(np.asarray(value), np.asarray(m_est.parameters()[name]), rtol=1e-5, atol=1e-8,
                                   err_msg=name)


@pytest.mark.parametrize("lik", ["bernoulli", "gaussian", "poisson", "ordinal"])
@pytest.mark.slow
def test_defaults_give_the_same_model_and_bound(lik, tmp_path):
    """Hyperparameters learned as both front ends do by default (two stages for non-Gaussian
    likelihoods); the search capped at the same few rounds on both sides to keep it fast."""
    fit, extra, est = _both(tmp_path, lik, ["--max-rounds", "8"], {"max_rounds": 8})
    assert extra["model"] == "full"  # 120 rows: a full GP whichever the likelihood
    assert np.shape(fit.model.kernel.lengthscale) == (D,)  # ARD at the end
    _assert_same(fit, extra, est)


@pytest.mark.slow
@pytest.mark.parametrize("lik", ["bernoulli", "gaussian", "poisson", "ordinal"])
def test_no_learning_gives_the_same_start(lik, tmp_path):
    """Without learning the bound is that of the shared starting model itself: kernel at the
    median distance, the mean at the link of the base rate, the likelihood's starting values."""
    fit, extra, est = _both(tmp_path, lik, ["--no-learn"], {"learn_hyperparameters": False})
    _assert_same(fit, extra, est)
    Xs = (_data(lik)[0] - np.asarray(extra["x_mean"])) / np.asarray(extra["x_scale"])
    np.testing.assert_allclose(np.asarray(fit.model.kernel.lengthscale), defaults.median_distance(Xs))


def test_sparse_on_both_sides(tmp_path):
    """The same sparse choice and inducing count: past full_max rows by "auto" (here lowered on
    both sides: --model sparse / model="sparse"), the default number of inducing inputs."""
    fit, extra, est = _both(tmp_path, "poisson", ["--model", "sparse", "--no-learn"],
                            {"model": "sparse", "learn_hyperparameters": False})
    assert extra["model"] == "sparse"
    assert np.shape(fit.model.inducing)[0] == min(defaults.INDUCING, N)
    _assert_same(fit, extra, est)


def test_model_kind_policy():
    assert defaults.model_kind(500, "bernoulli") == "full" and defaults.model_kind(501, "bernoulli") == "sparse"
    assert defaults.model_kind(1000, "gaussian") == "full" and defaults.model_kind(1001, "studentt") == "sparse"
    assert defaults.model_kind(700, gpvi.likelihoods.Laplace()) == "full"
    assert defaults.model_kind(700, gpvi.likelihoods.Poisson()) == "sparse"
    assert defaults.model_kind(10, "poisson", "sparse") == "sparse"
    assert defaults.model_kind(10, "poisson", "auto", full_max_rows=5) == "sparse"
    assert gpvi.GPClassifier().full_max == defaults.full_max("bernoulli")
    assert gpvi.GPRegressor().full_max == defaults.full_max("gaussian")
    assert gpvi.GPCountRegressor().inducing == defaults.INDUCING
