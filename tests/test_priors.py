"""Hyperpriors (gpvi.priors): densities against SciPy, MAP-II against an independent optimiser,
stationarity by finite differences, the front ends' default, errors and model files."""
import math
import warnings

import numpy as np
import pytest
import scipy.optimize
import scipy.stats

import gpvi
from gpvi import priors
from gpvi.sklearn.damping import DampingWarning
from gpvi._module import flatten_params


def test_log_density_is_scipys_normal_on_the_unconstrained_value():
    u = np.array([-1.3, 0.2, 2.5])
    for p in (priors.LogNormal(0.4, 1.7), priors.Normal(-2.0, 0.3)):
        v, g = p.log_density(u)
        assert v == pytest.approx(np.sum(scipy.stats.norm.logpdf(u, p.loc, p.scale)), rel=1e-13)
        h = 1e-6
        fd = [(p.log_density(u + h * e)[0] - p.log_density(u - h * e)[0]) / (2 * h) for e in np.eye(3)]
        np.testing.assert_allclose(g, fd, rtol=1e-7)
    # as a density over θ = exp(u), LogNormal is scipy's lognorm (the Jacobian 1/θ aside)
    theta = 3.0
    v, _ = priors.LogNormal(0.4, 1.7).log_density(math.log(theta))
    assert v - math.log(theta) == pytest.approx(scipy.stats.lognorm.logpdf(theta, 1.7, scale=math.exp(0.4)))


@pytest.mark.parametrize("bad", [dict(scale=0.0), dict(scale=-1.0), dict(loc=float("nan")), dict(loc="1")])
def test_bad_prior_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="LogNormal"):
        priors.LogNormal(**bad)


def _regression(n=40, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(1.3 * X[:, 0]) + 0.3 * rng.normal(size=n)
    return X, y


def test_collapsed_map_matches_scikit_learns_marginal_likelihood_plus_the_prior():
    """Gaussian regression, full GP: the collapsed bound is the exact log marginal likelihood, so
    MAP-II through gpvi.fit must agree with maximising scikit-learn's log marginal likelihood
    (C·RBF + White, whose θ is the log of each parameter) plus the same normal densities."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    X, y = _regression()
    hp = {"kernel.variance": priors.LogNormal(math.log(0.5), 0.5),
          "kernel.lengthscale": priors.LogNormal(math.log(3.0), 0.3),
          "likelihood.variance": priors.LogNormal(math.log(0.2), 1.0)}
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=1.0), gpvi.likelihoods.Gaussian(variance=0.1), mean=0.0)
    res = gpvi.fit(model, X, y, learn_hyperparameters=["kernel.variance", "kernel.lengthscale", "likelihood.variance"],
                   hyperprior=hp, tol=1e-12)
    gpr = GaussianProcessRegressor(ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(0.1), alpha=1e-12, optimizer=None).fit(X, y)
    locs = np.array([math.log(0.5), math.log(3.0), math.log(0.2)])
    scales = np.array([0.5, 0.3, 1.0])

    def neg(theta):
        lml, g = gpr.log_marginal_likelihood(theta, eval_gradient=True)
        z = (theta - locs) / scales
        return -(lml - 0.5 * np.sum(z * z)), -(g - z / scales)

    out = scipy.optimize.minimize(neg, np.log([1.0, 1.0, 0.1]), jac=True, method="L-BFGS-B",
                                  options=dict(ftol=1e-14, gtol=1e-10))
    learned = [float(res.model.kernel.variance), float(res.model.kernel.lengthscale),
               float(res.model.likelihood.variance)]
    np.testing.assert_allclose(learned, np.exp(out.x), rtol=2e-4)
    # without the prior the optimum is elsewhere (the prior did something)
    free = gpvi.fit(model, X, y, learn_hyperparameters=["kernel.variance", "kernel.lengthscale", "likelihood.variance"],
                    tol=1e-12)
    assert abs(float(free.model.kernel.lengthscale) - learned[1]) > 0.05
    # the VLB reported is the bound, the prior's value is in the extras
    assert res.extras["log_prior"] == pytest.approx(np.sum(scipy.stats.norm.logpdf(np.log(learned), locs, scales)),
                                                    rel=1e-10)
    assert res.vlb < free.vlb + 1e-9 and "log_prior" not in free.extras


def _classification(n=40, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 1))
    y = (X[:, 0] + 0.2 * rng.normal(size=n) > 0).astype(int)  # nearly separable: θ runs off without a prior
    return X, y


def test_profile_map_is_stationary_by_finite_differences():
    """The profile search's answer maximises F(θ) + log p(θ), F(θ) = max_q VLB: central
    differences of that sum, each F from a converged fit at fixed θ, vanish at it."""
    X, y = _classification()
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=1.0), gpvi.likelihoods.Bernoulli(), mean=0.0)
    names = ["kernel.variance", "kernel.lengthscale"]
    hp = {"kernel.variance": priors.LogNormal(0.0, 0.7), "kernel.lengthscale": priors.LogNormal(0.0, 0.7)}
    res = gpvi.fit(model, X, y, learn_hyperparameters=names, hyperprior=hp, tol=1e-11)
    assert res.converged
    lp = priors.LogPrior(res.model, names, hp)
    u0 = {n: np.asarray(v) for n, v in flatten_params(res.model, names).items()}

    def objective(u):
        m = res.model.with_parameters({n: float(np.exp(u[n])) for n in names})
        return gpvi.fit(m, X, y, tol=1e-13, max_iter=2000).vlb + lp(u)[0]

    h = 1e-3
    for n in names:
        up, dn = dict(u0), dict(u0)
        up[n], dn[n] = u0[n] + h, u0[n] - h
        d = (objective(up) - objective(dn)) / (2 * h)
        prior_slope = abs(float(lp(u0)[1][n]))
        assert prior_slope > 0.05, n  # the prior pulls here: stationarity is not that of the VLB alone
        assert abs(d) < 2e-3 * (1.0 + prior_slope), (n, d, prior_slope)


def test_a_tight_prior_pins_the_parameter_and_ties_count_once():
    X, y = _classification()
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=1.0), gpvi.likelihoods.Bernoulli(), mean=0.0)
    res = gpvi.fit(model, X, y, learn_hyperparameters=["kernel.variance", "kernel.lengthscale"],
                   hyperprior={"kernel.variance": priors.LogNormal(math.log(2.0), 1e-3)})
    assert float(res.model.kernel.variance) == pytest.approx(2.0, rel=1e-2)
    # a tied name over three latents with one prior each carries that prior once
    lik = gpvi.Softmax(num_classes=3)
    ml = gpvi.MultiLatent.full(gpvi.kernels.RBF(lengthscale=1.0), lik)
    hp = priors.weak(ml, dimensions=4)
    tied = priors.LogPrior(ml, ["latents.*.kernel.lengthscale"], hp)
    single = priors.LogPrior(ml, ["latents.0.kernel.lengthscale"], hp)
    u = {"latents.*.kernel.lengthscale": np.array(0.3)}
    assert tied(u)[0] == pytest.approx(single({"latents.0.kernel.lengthscale": np.array(0.3)})[0])


def test_weak_prior_names_and_scales():
    model = gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=np.ones(9)), gpvi.likelihoods.Gaussian(), inducing=5)
    hp = priors.weak(model, noise=True, dimensions=9)
    assert set(hp) == {"kernel.variance", "kernel.lengthscale", "likelihood.variance"}
    assert hp["kernel.lengthscale"].loc == pytest.approx(math.log(3.0))
    assert hp["likelihood.variance"].loc == pytest.approx(2 * math.log(0.1))
    assert "likelihood.variance" not in priors.weak(model, dimensions=9)  # noise prior only on request


def test_errors_name_the_problem():
    X, y = _classification()
    model = gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Bernoulli())
    with pytest.raises(ValueError, match="names no parameter"):
        gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior={"kernel.period": priors.LogNormal()})
    with pytest.raises(ValueError, match="use gpvi.priors.Normal"):
        gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior={"mean": priors.LogNormal()})
    with pytest.raises(ValueError, match="must be a gpvi.priors"):
        gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior={"kernel.variance": 1.0})
    with pytest.raises(ValueError, match="must be None or a dict"):
        gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior="weak")
    with pytest.raises(ValueError, match="only to hyperparameters being learned"):
        gpvi.fit(model, X, y, hyperprior={"kernel.variance": priors.LogNormal()})
    with pytest.raises(ValueError, match="its own way"):
        gpvi.fit(model, X, y, engine="jj", learn_hyperparameters=True, hyperprior={"kernel.variance": priors.LogNormal()})
    with pytest.raises(ValueError, match="do(es)? not apply with posterior='mog'"):
        gpvi.fit(model, X, y, posterior="mog", hyperprior={"kernel.variance": priors.LogNormal()})
    with pytest.raises(ValueError, match="hyperprior must be 'weak'"):
        gpvi.GPClassifier(hyperprior="strong").fit(X, y)


def test_estimator_with_its_own_priors_saves_and_loads(tmp_path):
    X, y = _classification(60)
    hp = {"kernel.variance": priors.LogNormal(0.0, 0.5), "kernel.lengthscale": priors.LogNormal(0.0, 2.0)}
    clf = gpvi.GPClassifier(hyperprior=hp).fit(X, y)
    path = gpvi.io.save(clf, tmp_path / "clf.gpvi")
    back = gpvi.io.load(path)
    assert back.get_params()["hyperprior"] == hp
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    assert "log_prior" in clf.fit_result_.extras


@pytest.mark.slow
def test_default_classifier_keeps_breast_cancer_hyperparameters_sane():
    """Issue 30 §2: without a prior the default classifier's variance ran to ~1 900 (here 1 600-9 900)
    and its lengthscales to 1e4-1e10, with hundreds of damped steps; the default weak prior keeps
    them in range, damped steps no longer dominate (no DampingWarning), and it predicts well on
    held-out rows."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.metrics import log_loss

    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    tr, te = idx[:400], idx[400:]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DampingWarning)  # damping no longer dominates
        clf = gpvi.GPClassifier().fit(X[tr], y[tr])
    k = clf.fit_result_.model.kernel
    assert float(k.variance) < 200 and float(np.max(k.lengthscale)) < 1e3
    assert log_loss(y[te], clf.predict_proba(X[te])) < 0.12
