"""engine="svi" (Hensman et al. 2015 as the baseline of Izmailov & Kropotov 2017)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi._module import flatten_params, unflatten_params
from gpvi.objective import Chunks, Objective, minibatch_vlb


def _problem(rng, N=300, lik=None, M=12):
    X = rng.uniform(-3, 3, size=(N, 1))
    f = np.sin(1.5 * X[:, 0])
    if lik is None:
        lik = L.Gaussian(variance=0.5)
        y = f + 0.2 * rng.normal(size=N)
    else:
        y = (rng.random(N) < 1 / (1 + np.exp(-3 * f))).astype(float)
    Z = np.linspace(-3, 3, M)[:, None]
    return gpvi.SparseGP(gpvi.kernels.RBF(lengthscale=0.7), lik, inducing=Z), X, y


@pytest.mark.parametrize("options, match", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": -5}, "batch_size"), ({"batch_size": 301}, "batch_size"),
    ({"learning_rate": 0.0}, "learning_rate"), ({"learning_rate": -1.0}, "learning_rate"),
    ({"epochs": 0}, "epochs"), ({"optimizer": "sgd"}, "optimizer"), ({"eval_every": 0}, "eval_every"),
    ({"momentum": 0.9}, "momentum"),
])
def test_bad_options(rng, options, match):
    model, X, y = _problem(rng)
    with pytest.raises(ValueError, match=match):
        gpvi.fit(model, X, y, engine="svi", engine_options=options)


def test_full_gp_refused(rng):
    model, X, y = _problem(rng, N=30)
    with pytest.raises(ValueError, match="GLM or SparseGP"):
        gpvi.fit(gpvi.GP(gpvi.kernels.RBF(), L.Gaussian()), X, y, engine="svi")


@pytest.mark.slow
def test_reaches_fpi_optimum(rng):
    """Adam on full batches converges to the optimum fpi certifies; minibatches come close."""
    model, X, y = _problem(rng)
    ref = gpvi.fit(model, X, y, tol=1e-10)
    full = gpvi.fit(model, X, y, engine="svi",
                    engine_options=dict(batch_size=300, epochs=1500, optimizer="adam", learning_rate=0.03))
    assert abs(full.vlb - ref.vlb) < 1e-3 * abs(ref.vlb)
    mini = gpvi.fit(model, X, y, engine="svi",
                    engine_options=dict(batch_size=50, epochs=150, optimizer="adam", learning_rate=0.01))
    assert ref.vlb - 2.0 < mini.vlb <= ref.vlb + 1e-9
    assert mini.extras["steps"] == 6 * 150 and mini.trace.shape[0] >= 150
    # AdaDelta, the paper's baseline, ascends from the prior on a logistic problem
    mlog, Xl, yl = _problem(rng, lik=L.Bernoulli())
    start = float(Objective(mlog, Xl, yl * 2 - 1).vlb(gpvi.prior_state(12)))
    ada = gpvi.fit(mlog, Xl, yl, engine="svi", engine_options=dict(batch_size=50, epochs=30))
    assert ada.extras["optimizer"] == "adadelta" and ada.vlb > start + 10


@pytest.mark.slow
def test_minibatch_bound_gradient_matches_finite_differences(rng):
    """svi's θ gradient (autodiff of minibatch_vlb, B = N, scale 1) against central differences
    of Objective's chunked VLB at the same whitened state."""
    model, X, y = _problem(rng, N=60)
    names = ["kernel.variance", "kernel.lengthscale", "likelihood.variance"]
    d = 12
    state = gpvi.State(jnp.asarray(0.3 * rng.normal(size=d)),
                       jnp.asarray(np.tril(0.1 * rng.normal(size=(d, d))) + 0.5 * np.eye(d)))
    batch = Chunks(jnp.asarray(X), jnp.asarray(y), jnp.zeros(60), jnp.ones(60))
    theta = flatten_params(model, names)
    g = jax.grad(lambda th: minibatch_vlb(unflatten_params(model, th), batch, state, 1.0))(theta)
    for n in names:
        h = 1e-5
        vals = []
        for s in (1, -1):
            th = dict(theta)
            th[n] = theta[n] + s * h
            vals.append(float(Objective(unflatten_params(model, th), X, y).vlb(state)))
        np.testing.assert_allclose(float(g[n]), (vals[0] - vals[1]) / (2 * h), rtol=1e-6)


@pytest.mark.slow
def test_learns_hyperparameters_through_fit(rng):
    """fit(..., engine="svi", learn_hyperparameters=True) learns θ inside the engine: from a
    noise variance of 0.5 towards the data's 0.04, ending near fpi's learned bound."""
    model, X, y = _problem(rng)
    ref = gpvi.fit(model, X, y, learn_hyperparameters=True)
    res = gpvi.fit(model, X, y, engine="svi", learn_hyperparameters=True,
                   engine_options=dict(batch_size=100, epochs=300, optimizer="adam", learning_rate=0.02))
    assert "jointly" in res.message
    assert float(res.model.likelihood.variance) < 0.1
    assert res.vlb > ref.vlb - 3.0  # nats; the stochastic θ path is still settling
    # predictions use the learned model's prior factor
    m, v = res.predict_f(X[:5])
    m_ref, _ = ref.predict_f(X[:5])
    np.testing.assert_allclose(m, m_ref, atol=0.1)
