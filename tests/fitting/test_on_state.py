"""The one state hook, ``on_state(model, state, progress)``, across a whole fit: the rounds of
every hyperparameter strategy (profile search, collapsed bound, the jj engines' own driver), the
stream fits, and stopping a fit from it.  (Each engine's own iterates are checked by the engine
sweep, tests/engines/test_registry.py.)"""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.engines import STOPPED
from gpvi.kernels import RBF
from gpvi.objective import Objective
from problems import regression_data

RNG = np.random.default_rng(20261128)
X, F = regression_data(RNG, 40)
Y_BIN = (RNG.uniform(size=40) < 1 / (1 + np.exp(-2 * F))).astype(int)
Y_REG = F + 0.3 * RNG.standard_normal(40)
LEARN = ["kernel.variance", "kernel.lengthscale"]


def _watch():
    seen = []
    return seen, lambda m, s, p: seen.append((m, s, p))


def test_profile_search_shows_every_round_with_its_model_and_optimum():
    seen, hook = _watch()
    model = gpvi.GP(RBF(), L.Bernoulli())
    fit = gpvi.fit(model, X, Y_BIN, learn_hyperparameters=LEARN, on_state=hook)
    rounds = [(m, s, p) for m, s, p in seen if p.round is not None]
    assert [p.round for _, _, p in rounds] == list(range(1, fit.hyperparameter_rounds + 1))
    assert fit.hyperparameter_rounds >= 2
    # each round: the model at that round's θ (they differ) and the engine's optimum there, whose
    # VLB, recomputed here under that model, is the round's traced VLB
    assert len({float(m.kernel.variance) for m, _, _ in rounds}) == len(rounds)
    for m, s, p in rounds:
        vlb = float(Objective(m, X, m.likelihood.validate(Y_BIN)).vlb(s))
        np.testing.assert_allclose(p.vlb, vlb, rtol=1e-10)
        assert p.vlb in fit.trace[:, 1]
    # the last round's model is the learned one
    np.testing.assert_allclose(float(rounds[-1][0].kernel.variance), float(fit.model.kernel.variance), rtol=1e-12)
    # after the search, the final engine run's iterates (round None) come after the rounds
    assert seen[-1][2].round is None
    assert all(b[2].seconds >= a[2].seconds for a, b in zip(seen, seen[1:]))


def test_stopping_the_profile_search_keeps_the_best_so_far():
    full = gpvi.fit(gpvi.GP(RBF(), L.Bernoulli()), X, Y_BIN, learn_hyperparameters=LEARN)
    seen = []

    def stop_at_round_2(m, s, p):
        seen.append(p)
        return p.round == 2

    fit = gpvi.fit(gpvi.GP(RBF(), L.Bernoulli()), X, Y_BIN, learn_hyperparameters=LEARN, on_state=stop_at_round_2)
    assert full.hyperparameter_rounds > 2
    assert fit.hyperparameter_rounds == 2 and fit.search_message == STOPPED
    assert seen[-1].round == 2  # no call after the one that said stop
    # q is fitted, unwatched, at the best hyperparameters evaluated: converged there
    assert fit.converged and fit.vlb < full.vlb
    assert fit.iterations < full.iterations


def test_collapsed_bound_rounds_have_no_state_and_can_be_stopped():
    seen, hook = _watch()
    model = gpvi.GP(RBF(), L.Gaussian(variance=0.1))
    fit = gpvi.fit(model, X, Y_REG, learn_hyperparameters=LEARN + ["likelihood.variance"], on_state=hook)
    rounds = [(m, s, p) for m, s, p in seen if p.round is not None]
    assert len(rounds) == fit.hyperparameter_rounds >= 2
    assert all(s is None for _, s, _ in rounds)
    assert all(s is not None for _, s, p in seen if p.round is None)
    stopped = gpvi.fit(model, X, Y_REG, learn_hyperparameters=LEARN + ["likelihood.variance"],
                       on_state=lambda m, s, p: p.round == 1)
    assert stopped.hyperparameter_rounds == 1 and stopped.search_message.startswith(STOPPED)
    # q is then fitted, unwatched, at the round's hyperparameters: a converged posterior there
    assert stopped.converged and stopped.vlb < fit.vlb


@pytest.mark.slow
def test_engine_owned_search_is_watched_and_stopped():
    seen, hook = _watch()
    model = gpvi.GP(RBF(), L.Bernoulli())
    fit = gpvi.fit(model, X, Y_BIN, engine="jj", learn_hyperparameters=LEARN, max_rounds=5, on_state=hook)
    assert len(seen) == fit.trace.shape[0]  # every traced iterate, the start included
    stopped = gpvi.fit(model, X, Y_BIN, engine="jj", learn_hyperparameters=LEARN, max_rounds=5,
                       on_state=lambda m, s, p: p.iteration >= 2)
    assert not stopped.converged and STOPPED in stopped.message
    assert stopped.trace.shape[0] == 3


def test_fit_stream_hook_sees_every_epoch_and_stops():
    model = gpvi.SparseGP(RBF(), L.Gaussian(variance=0.1), inducing=X[:6])
    seen, hook = _watch()
    fit = gpvi.fit_stream(model, X, Y_REG, epochs=3, batch_size=20, on_state=hook)
    assert [p.iteration for _, _, p in seen] == [2, 4, 6] and fit.iterations == 6
    stopped = gpvi.fit_stream(model, X, Y_REG, epochs=3, batch_size=20, on_state=lambda m, s, p: True)
    assert stopped.iterations == 2 and STOPPED in stopped.message
    with pytest.raises(ValueError, match="fit_stream arguments"):
        gpvi.fit_stream(model, X, Y_REG, engine_options={"on_state": hook})


def test_bad_hooks_are_refused():
    model = gpvi.GP(RBF(), L.Bernoulli())
    with pytest.raises(ValueError, match="on_state must be callable"):
        gpvi.fit(model, X, Y_BIN, on_state=3)
    with pytest.raises(ValueError, match="on_state"):
        gpvi.fit(model, X, Y_BIN, posterior="mog", on_state=lambda m, s, p: None)
    with pytest.raises(ValueError, match="on_state must be callable"):
        gpvi.fit_stream(gpvi.SparseGP(RBF(), L.Gaussian(), inducing=X[:6]), X, Y_REG, on_state="x")
