"""The default policy shared by the estimators and `gpvi fit` (gpvi.fitting.defaults): standardisation,
full or sparse, starting values, the median-distance kernel start, isotropic then ARD."""
import numpy as np
import pytest
import scipy.spatial.distance
import scipy.special
import scipy.stats

import gpvi
from gpvi.fitting.defaults import ard_from, isotropic_start, median_distance


def test_median_distance_is_scipys(rng):
    X = rng.normal(size=(200, 5))
    assert median_distance(X) == pytest.approx(np.median(scipy.spatial.distance.pdist(X)), rel=1e-10)
    assert median_distance(np.ones((5, 3))) == 1.0  # all rows equal


def test_ard_from_isotropic():
    k = ard_from(isotropic_start(np.eye(4)), 4)
    assert np.asarray(k.lengthscale).shape == (4,)
    np.testing.assert_allclose(np.asarray(k.lengthscale), np.sqrt(2.0))


@pytest.mark.slow
def test_default_classifier_learns_in_many_dimensions(rng):
    """40 standardised features, the class set by two of them.  Lengthscales all started at 1
    put the typical squared distance at 2·40 (K ≈ I); the median-distance start does not."""
    N, D = 100, 40
    X = rng.normal(size=(N, D))
    y = (X[:, 0] + X[:, 1] + 0.5 * rng.normal(size=N) > 0).astype(int)  # not separable
    est = gpvi.GPClassifier().fit(X, y)
    ls = np.asarray(est.fit_result_.model.kernel.lengthscale)
    assert ls.shape == (D,)  # ARD after the isotropic stage
    Xt = rng.normal(size=(300, D))
    acc = np.mean(est.predict(Xt) == (Xt[:, 0] + Xt[:, 1] > 0))
    assert acc > 0.75
    assert np.min(ls[:2]) < np.median(ls[2:])  # the two relevant features are the short ones


# --- the shared policy (gpvi fit and the estimators) -----------------------------------------
from gpvi.fitting import defaults  # noqa: E402


def test_standardisation():
    X = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    mean, scale = defaults.standardise_inputs(X)
    np.testing.assert_allclose(mean, [3.0, 5.0])
    np.testing.assert_allclose(scale, [np.std([1.0, 3.0, 5.0]), 1.0])  # population sd; a constant column only centred
    assert defaults.standardise_target([2.0, 4.0]) == (3.0, 1.0)
    assert defaults.standardise_target([7.0, 7.0]) == (7.0, 1.0)


def test_full_max_and_inducing_count():
    assert defaults.full_max("gaussian") == defaults.full_max(gpvi.likelihoods.StudentT()) == 1000
    assert defaults.full_max("ordinal") == defaults.full_max(gpvi.likelihoods.Bernoulli()) == 500
    with pytest.raises(ValueError, match="model kind"):
        defaults.model_kind(10, "poisson", "dense")
    X = np.repeat(np.arange(30.0)[:, None], 2, axis=0)  # 60 rows, 30 distinct
    assert defaults.inducing_count(X) == 30
    assert defaults.inducing_count(X, 10) == 10
    assert defaults.inducing_count(np.arange(500.0)[:, None]) == defaults.INDUCING


def test_likelihood_starts():
    y = np.array([0, 0, 0, 1.0])
    lik, m = defaults.likelihood_start("bernoulli", y)
    assert lik.link == "logit" and m == pytest.approx(np.log(0.25 / 0.75))
    lik, m = defaults.likelihood_start("probit", y)
    assert lik.link == "probit" and m == pytest.approx(scipy.stats.norm.ppf(0.25))
    _, m = defaults.likelihood_start("bernoulli", np.zeros(4))  # clipped half a row from 0
    assert m == pytest.approx(np.log(0.125 / 0.875))
    lik, m = defaults.likelihood_start("poisson", [1.0, 3.0], offset=np.log([1.0, 3.0]))
    assert type(lik) is gpvi.likelihoods.Poisson and m == pytest.approx(0.0)  # 4 events / 4 exposure
    assert defaults.likelihood_start("quasipoisson", np.zeros(5))[1] == pytest.approx(np.log(0.5 / 5))
    lik, _ = defaults.likelihood_start("ordinal", np.array([0, 0, 2, 2.0]), levels=3)  # level 1 absent
    np.testing.assert_allclose(np.asarray(lik.edges), scipy.special.logit([2 / 4.5, 2.5 / 4.5]))
    lik, m = defaults.likelihood_start("gaussian", np.zeros(3))
    assert float(lik.variance) == pytest.approx(defaults.NOISE_SCALE**2) and m == 0.0
    lik, _ = defaults.likelihood_start("studentt", np.zeros(3))
    assert float(lik.df) == defaults.STUDENT_T_DF
    with pytest.raises(ValueError, match="no default"):
        defaults.likelihood_start("weibull", np.zeros(3))


def test_two_stages_and_kernel_start():
    B, G = gpvi.likelihoods.Bernoulli(), gpvi.likelihoods.Gaussian()
    assert defaults.uses_two_stages(B, 3, default_kernel=True, learn_all=True)
    assert not defaults.uses_two_stages(G, 3, default_kernel=True, learn_all=True)  # collapsed bound: ARD at once
    assert not defaults.uses_two_stages(B, 1, default_kernel=True, learn_all=True)
    assert not defaults.uses_two_stages(B, 3, default_kernel=False, learn_all=True)
    assert not defaults.uses_two_stages(B, 3, default_kernel=True, learn_all=False)
    Xs = np.eye(4)
    assert np.shape(defaults.default_kernel_start(Xs).lengthscale) == (4,)
    assert np.ndim(defaults.default_kernel_start(Xs, isotropic=True).lengthscale) == 0
    m = defaults.build_model("sparse", B, 0.5, np.arange(12.0).reshape(6, 2))
    assert isinstance(m, gpvi.SparseGP) and int(m.inducing) == 6 and float(m.mean) == 0.5  # k-means at fit
    assert isinstance(defaults.build_model("full", B, 0.0, Xs), gpvi.GP)
    ordinal = defaults.build_model("full", gpvi.likelihoods.Ordinal(edges=[0.0]), 0.0, Xs)
    learned = defaults.learned_parameters(ordinal)
    assert "kernel.lengthscale" in learned and "mean" not in learned and "likelihood.shape" not in learned


def test_fit_default_runs_two_stages():
    """The first stage ties the lengthscales of the ARD-shaped kernel into one; the second starts
    from its optimum with each lengthscale free, warm-started from its state, with at most
    ARD_ROUNDS rounds; its seconds count both."""
    calls = []

    class Result:
        def __init__(self, model, seconds):
            self.model, self.seconds, self.backtracks, self.state = model, seconds, 1, f"state{len(calls)}"

    def fake_fit(model, X, y, **kw):
        calls.append((model, kw))
        return Result(model, 2.0)

    Xs = np.eye(3)
    model = defaults.build_model("full", gpvi.likelihoods.Bernoulli(), 0.0, Xs)
    learn = ["mean", "kernel.lengthscale", "kernel.variance"]
    result, damped = defaults.fit_default(model, Xs, np.array([0, 1, 1.0]), fit=fake_fit, learn=learn,
                                          two_stage=True, max_rounds=100, engine="fpi", seed=3)
    assert len(calls) == 2 and damped == 2 and result.seconds == 4.0
    (first, kw1), (second, kw2) = calls
    # both stages have the ARD shape (the same compiled programs); the first ties the lengthscales
    assert np.shape(first.kernel.lengthscale) == np.shape(second.kernel.lengthscale) == (3,)
    assert kw1["learn_hyperparameters"] == ["mean", "kernel.lengthscale[*]", "kernel.variance"]
    assert kw2["learn_hyperparameters"] == learn
    assert kw1["max_rounds"] == 100 and kw2["max_rounds"] == defaults.ARD_ROUNDS
    assert kw2["init"] == "state1" and kw1["seed"] == kw2["seed"] == 3
    # the isotropic stage, only a start, stops at FIRST_STAGE_TOL (or the fit's tol if looser)
    assert kw1["tol"] == defaults.FIRST_STAGE_TOL and "tol" not in kw2
    for tol, first_tol in ((1e-8, defaults.FIRST_STAGE_TOL), (1e-2, 1e-2)):
        calls.clear()
        defaults.fit_default(model, Xs, np.array([0, 1, 1.0]), fit=fake_fit, learn=["mean"], two_stage=True, tol=tol)
        assert calls[0][1]["tol"] == first_tol and calls[1][1]["tol"] == tol
    calls.clear()
    defaults.fit_default(model, Xs, np.array([0, 1, 1.0]), fit=fake_fit, learn=False, two_stage=False, tol=1e-7)
    assert len(calls) == 1 and calls[0][1]["tol"] == 1e-7
