"""Warm starts across a hyperparameter change keep q fixed over the prior's variables."""
import numpy as np
import pytest

import gpvi
from gpvi import likelihoods as L
from gpvi.objective import Objective, State
from gpvi.fitting.warmstart import carry


def _factor(obj):
    p = obj.prior
    return np.asarray(p[1] if isinstance(obj.model, gpvi.GP) else p)


@pytest.mark.parametrize("kind", ["sparse", "gp"])
def test_carry_keeps_q_of_u(rng, kind):
    X = rng.normal(size=(30, 2))
    y = (X[:, 0] > 0).astype(float)
    if kind == "sparse":
        make = lambda v, ls, mu: gpvi.SparseGP(gpvi.kernels.RBF(variance=v, lengthscale=ls), L.Bernoulli(),  # noqa: E731
                                               inducing=X[:7], mean=mu)
    else:
        make = lambda v, ls, mu: gpvi.GP(gpvi.kernels.RBF(variance=v, lengthscale=ls), L.Bernoulli(), mean=mu)  # noqa: E731
    old, new = Objective(make(1.0, 0.8, 0.3), X, y), Objective(make(7.0, 1.3, -0.2), X, y)
    d = old.dim
    C = np.tril(rng.normal(size=(d, d))) * 0.3 + np.eye(d)
    state = State(rng.normal(size=d), C)
    out = carry(old, new, state)
    Lo, Ln = _factor(old), _factor(new)
    np.testing.assert_allclose(Ln @ np.asarray(out.mean) - 0.2, Lo @ state.mean + 0.3, atol=1e-8)
    Vo = Lo @ C @ C.T @ Lo.T
    Cn = np.asarray(out.chol)
    np.testing.assert_allclose(Ln @ Cn @ Cn.T @ Ln.T, Vo, atol=1e-8)
    assert np.allclose(np.triu(Cn, 1), 0.0)


def test_carry_keeps_q_of_each_latent(rng):
    """Several latents: the map is applied latent by latent (q is factorised over them)."""
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax

    X = rng.normal(size=(25, 2))
    y = rng.integers(0, 3, 25).astype(float)

    def make(vs, ls, mus):
        return MultiLatent.full([gpvi.kernels.RBF(variance=v, lengthscale=s) for v, s in zip(vs, ls)],
                                Softmax(num_classes=3), mean=mus)

    old = Objective(make([1.0, 2.0, 0.5], [0.8, 1.0, 1.5], [0.3, 0.0, -0.1]), X, y)
    new = Objective(make([7.0, 0.4, 3.0], [1.3, 0.6, 2.0], [-0.2, 0.1, 0.0]), X, y)
    d = old.dim
    C = np.tril(rng.normal(size=(3, d, d))) * 0.3 + np.eye(d)
    state = State(rng.normal(size=(3, d)), C)
    out = carry(old, new, state)
    for q, (mo, mn) in enumerate(zip([0.3, 0.0, -0.1], [-0.2, 0.1, 0.0])):
        Lo, Ln = np.asarray(old.prior[q][1]), np.asarray(new.prior[q][1])
        np.testing.assert_allclose(Ln @ np.asarray(out.mean[q]) + mn, Lo @ state.mean[q] + mo, atol=1e-8)
        Cn = np.asarray(out.chol[q])
        np.testing.assert_allclose(Ln @ Cn @ Cn.T @ Ln.T, Lo @ C[q] @ C[q].T @ Lo.T, atol=1e-8)
        assert np.allclose(np.triu(Cn, 1), 0.0)


def test_carry_with_one_shared_prior_matches_latent_by_latent(rng, monkeypatch):
    """Latents that share one kernel object (one factor, computed once) but have their own means:
    the shared map keeps q of every latent fixed, as the per-latent map does."""
    from gpvi.models.multilatent import MultiLatent
    from gpvi.likelihoods.softmax import Softmax
    from gpvi.fitting import warmstart

    X = rng.normal(size=(25, 2))
    y = rng.integers(0, 3, 25).astype(float)

    def make(v, ls, mus):
        return MultiLatent.full(gpvi.kernels.RBF(variance=v, lengthscale=ls), Softmax(num_classes=3), mean=mus)

    old = Objective(make(1.0, 0.8, [0.3, 0.0, -0.1]), X, y)
    new = Objective(make(7.0, 1.3, [-0.2, 0.1, 0.0]), X, y)
    assert old.model._same_prior() == new.model._same_prior() == [0, 0, 0]
    d = old.dim
    C = np.tril(rng.normal(size=(3, d, d))) * 0.3 + np.eye(d)
    state = State(rng.normal(size=(3, d)), C)
    per_latent = warmstart._carry_latents
    with monkeypatch.context() as mp:  # the shared factor is solved for once, not per latent
        mp.setattr(warmstart, "_carry_latents", None)
        out = carry(old, new, state)
    Lo, Ln = np.asarray(old.prior[0][1]), np.asarray(new.prior[0][1])
    for q, (mo, mn) in enumerate(zip([0.3, 0.0, -0.1], [-0.2, 0.1, 0.0])):
        np.testing.assert_allclose(Ln @ np.asarray(out.mean[q]) + mn, Lo @ state.mean[q] + mo, atol=1e-8)
        Cn = np.asarray(out.chol[q])
        np.testing.assert_allclose(Ln @ Cn @ Cn.T @ Ln.T, Lo @ C[q] @ C[q].T @ Lo.T, atol=1e-8)
        assert np.allclose(np.triu(Cn, 1), 0.0)
    # the same numbers as the per-latent map
    both = per_latent(tuple(p[1] for p in old.prior), tuple(p[1] for p in new.prior),
                                    (0.3, 0.0, -0.1), (-0.2, 0.1, 0.0), state)
    np.testing.assert_allclose(np.asarray(out.mean), np.asarray(both.mean), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(out.chol), np.asarray(both.chol), rtol=1e-10, atol=1e-12)
