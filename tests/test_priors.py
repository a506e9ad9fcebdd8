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


# ---- Gamma and HalfNormal (issue 33: priors as a user-facing API) ----------------------------

@pytest.mark.parametrize("prior, dist", [
    (priors.Gamma(2.5, 4.0), scipy.stats.gamma(a=2.5, scale=1 / 4.0)),
    (priors.Gamma(0.7, 0.3), scipy.stats.gamma(a=0.7, scale=1 / 0.3)),
    (priors.HalfNormal(0.8), scipy.stats.halfnorm(scale=0.8)),
    (priors.HalfNormal(3.0), scipy.stats.halfnorm(scale=3.0)),
])
def test_positive_priors_are_scipys_density_of_theta_plus_the_jacobian(prior, dist):
    """log p(u) = log p_θ(e^u) + u, summed over the elements; its gradient by finite differences."""
    assert prior.transform == "positive"
    u = np.array([-2.1, -0.4, 0.3, 1.6])
    v, g = prior.log_density(u)
    assert v == pytest.approx(np.sum(dist.logpdf(np.exp(u)) + u), rel=1e-13)
    assert np.shape(g) == u.shape
    h = 1e-6
    fd = [(prior.log_density(u + h * e)[0] - prior.log_density(u - h * e)[0]) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)
    # a scalar parameter: value and a 0-d gradient
    v0, g0 = prior.log_density(0.3)
    assert v0 == pytest.approx(dist.logpdf(math.exp(0.3)) + 0.3, rel=1e-13) and np.shape(g0) == ()
    # under the prior alone the search's maximiser (in u = log θ) is α/β for Gamma, σ for HalfNormal
    best = (prior.concentration / prior.rate) if isinstance(prior, priors.Gamma) else prior.scale
    assert float(prior.log_density(math.log(best))[1]) == pytest.approx(0.0, abs=1e-12)
    # and it integrates to one over u (a proper density in the search's coordinate)
    from scipy.integrate import quad
    assert quad(lambda t: math.exp(prior.log_density(t)[0]), -40, 10, limit=200)[0] == pytest.approx(1.0, rel=1e-8)


@pytest.mark.parametrize("make, match", [
    (lambda: priors.Gamma(0.0, 1.0), "Gamma: concentration must be positive"),
    (lambda: priors.Gamma(1.0, -2.0), "Gamma: rate must be positive"),
    (lambda: priors.Gamma(float("inf"), 1.0), "Gamma: concentration must be a finite number"),
    (lambda: priors.Gamma(1.0, "2"), "Gamma: rate must be a finite number"),
    (lambda: priors.Gamma(True, 1.0), "Gamma: concentration must be a finite number"),
    (lambda: priors.HalfNormal(0.0), "HalfNormal: scale must be positive"),
    (lambda: priors.HalfNormal(float("nan")), "HalfNormal: scale must be a finite number"),
])
def test_bad_gamma_and_half_normal_parameters_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_new_priors_in_json_and_the_old_format_unchanged():
    hp = {"kernel.variance": priors.Gamma(2.0, 0.5), "likelihood.variance": priors.HalfNormal(0.3),
          "kernel.lengthscale": priors.LogNormal(0.1, 1.5), "mean": priors.Normal(-1.0, 2.0)}
    spec = priors.to_json(hp)
    assert spec["kernel.variance"] == {"prior": "Gamma", "concentration": 2.0, "rate": 0.5}
    assert spec["likelihood.variance"] == {"prior": "HalfNormal", "scale": 0.3}
    assert spec["kernel.lengthscale"] == {"prior": "LogNormal", "loc": 0.1, "scale": 1.5}  # as files always had
    assert spec["mean"] == {"prior": "Normal", "loc": -1.0, "scale": 2.0}
    import json
    assert priors.from_json(json.loads(json.dumps(spec))) == hp
    assert priors.Gamma(2.0, 0.5) != priors.Gamma(2.0, 0.6) and priors.HalfNormal(1.0) != priors.Normal(0.0, 1.0)
    with pytest.raises(ValueError, match="Gamma needs concentration, rate"):
        priors.from_json({"kernel.variance": {"prior": "Gamma", "concentration": 2.0}})
    with pytest.raises(ValueError, match="unknown prior"):
        priors.from_json({"kernel.variance": {"prior": "Beta", "a": 1.0}})


def test_positive_priors_are_checked_against_the_parameter_transform():
    X, y = _regression(20)
    model = gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Gaussian(), mean=0.0)
    for p in (priors.Gamma(2.0, 1.0), priors.HalfNormal(1.0)):
        with pytest.raises(ValueError, match="use gpvi.priors.Normal"):
            gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior={"mean": p})
    with pytest.raises(ValueError, match="LogNormal, Gamma or HalfNormal"):
        gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior={"kernel.variance": priors.Normal()})


def _numpy_log_marginal(X, y, variance, lengthscale, noise, jitter=1e-8):
    """Exact log marginal likelihood of a zero-mean full GP with an RBF kernel (NumPy only)."""
    d2 = (X[:, None, 0] - X[None, :, 0]) ** 2
    K = variance * np.exp(-0.5 * d2 / lengthscale ** 2)
    K = K + (jitter * np.mean(np.diag(K)) + noise) * np.eye(len(y))
    L = np.linalg.cholesky(K)
    a = np.linalg.solve(L, y)
    return float(-0.5 * a @ a - np.sum(np.log(np.diag(L))) - 0.5 * len(y) * math.log(2 * math.pi))


@pytest.mark.parametrize("name, prior", [
    ("kernel.lengthscale", priors.Gamma(20.0, 5.0)),     # pulls ℓ towards α/β = 4
    ("likelihood.variance", priors.HalfNormal(0.02)),    # pulls the noise variance down to ~0.02
    ("kernel.variance", priors.Gamma(3.0, 1.0)),         # pulls the signal variance up to ~3
])
def test_map_with_gamma_and_half_normal_priors_matches_an_independent_optimum(name, prior):
    """A full GP with a Gaussian likelihood, one parameter learned: the bound is the exact log
    marginal likelihood, so gpvi.fit's MAP must be the maximiser over u = log θ of a NumPy log
    marginal likelihood plus the prior (with its Jacobian, the docstrings' log p(u)), found here by
    scipy's bounded scalar search; and the prior moves the answer from the no-prior fit towards
    the prior's own maximiser."""
    X, y = _regression()
    base = {"kernel.variance": 1.0, "kernel.lengthscale": 1.0, "likelihood.variance": 0.1}
    model = gpvi.GP(gpvi.kernels.RBF(variance=1.0, lengthscale=1.0), gpvi.likelihoods.Gaussian(variance=0.1), mean=0.0)
    res = gpvi.fit(model, X, y, learn_hyperparameters=[name], hyperprior={name: prior}, tol=1e-12)
    free = gpvi.fit(model, X, y, learn_hyperparameters=[name], tol=1e-12)
    assert res.converged and free.converged
    learned, unpriored = (float(np.asarray(r.model.parameters()[name])) for r in (res, free))

    def lml(u):
        theta = dict(base, **{name: math.exp(u)})
        return _numpy_log_marginal(X, y, theta["kernel.variance"], theta["kernel.lengthscale"],
                                   theta["likelihood.variance"])

    opts = dict(method="bounded", bounds=(-8.0, 4.0), options=dict(xatol=1e-10))
    u_map = scipy.optimize.minimize_scalar(lambda u: -(lml(u) + prior.log_density(u)[0]), **opts).x
    u_ml = scipy.optimize.minimize_scalar(lambda u: -lml(u), **opts).x
    assert unpriored == pytest.approx(math.exp(u_ml), rel=1e-6)
    assert learned == pytest.approx(math.exp(u_map), rel=1e-6)  # agreed to 3e-8
    # the prior moved the answer, towards the value it favours
    target = prior.concentration / prior.rate if isinstance(prior, priors.Gamma) else prior.scale
    assert abs(math.log(learned / unpriored)) > 0.05
    assert np.sign(learned - unpriored) == np.sign(target - unpriored)
    assert abs(math.log(learned / target)) < abs(math.log(unpriored / target))
    # the VLB reported is the bound at the learned value (here the exact log marginal
    # likelihood), and extras["log_prior"] is the prior's log p(u) there: they sum to the objective
    assert res.vlb == pytest.approx(lml(math.log(learned)), abs=1e-6)
    assert res.extras["log_prior"] == pytest.approx(prior.log_density(math.log(learned))[0], rel=1e-10)
    assert res.vlb + res.extras["log_prior"] >= free.vlb + prior.log_density(math.log(unpriored))[0] - 1e-8
    assert res.vlb <= free.vlb + 1e-9 and "log_prior" not in free.extras
