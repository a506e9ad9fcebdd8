"""Softmax's quadrature rules (gpvi.softmax): the product Gauss–Hermite rule for few classes, the
antithetic QMC rule beyond, their accuracy against an independent Monte Carlo reference, their
closed-form derivatives, and fits with 10 and 50 classes.

Run as a script (``python tests/likelihoods/test_softmax_rules.py [N]``) it prints the accuracy table of the
module docstring of gpvi.softmax, against an N-sample reference (default 10⁶).
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import kernels
from gpvi.models.multilatent import MultiLatent
from gpvi.likelihoods.softmax import (PRODUCT_MAX_CLASSES, Softmax, points_per_difference, product_nodes, qmc_nodes,
                          softmax_nodes, softmax_rule)


def _grid(Q, n, seed=0):
    """Rows of realistic (m, v): m ~ N(0, 2²), v log-uniform on [0.01, 10], with rows at v = 10,
    0.01 and 1 throughout."""
    rng = np.random.default_rng(seed)
    m = 2.0 * rng.standard_normal((n, Q))
    v = np.exp(rng.uniform(np.log(0.01), np.log(10.0), (n, Q)))
    v[0], v[1], v[2] = 10.0, 0.01, 1.0
    return rng.integers(0, Q, n), m, v


def _lse(f):
    mx = f.max(-1, keepdims=True)
    return (mx + np.log(np.exp(f - mx).sum(-1, keepdims=True)))[..., 0]


def _reference(y, m, v, N, seed=12345, chunk=25000):
    """Monte Carlo (E, ρ, λ) in numpy: i.i.d. antithetic draws for E, E[π] for ρ and Stein's
    identity for λ (λ_c = −E[π_c z_c]/√v_c = −E[π_c (1 − π_c)]), and the standard error of E."""
    rng = np.random.default_rng(seed)
    n, Q = m.shape
    s = np.sqrt(v)
    E, se, Ep, Epp = np.zeros(n), np.zeros(n), np.zeros((n, Q)), np.zeros((n, Q))
    for i in range(n):
        tot = tot2 = 0.0
        for _ in range(N // (2 * chunk)):
            z = rng.standard_normal((chunk, Q))
            pair = 0.0
            for zz in (z, -z):
                f = m[i] + s[i] * zz
                lse = _lse(f)
                p = np.exp(f - lse[:, None])
                pair = pair + 0.5 * lse
                Ep[i] += p.sum(0)
                Epp[i] += (p - p * p).sum(0)
            tot, tot2 = tot + pair.sum(), tot2 + (pair ** 2).sum()
        M = (N // (2 * chunk)) * chunk
        mu = tot / M
        E[i], se[i] = m[i, y[i]] - mu, np.sqrt(max(tot2 / M - mu ** 2, 0.0) / M)
        Ep[i] /= 2 * M
        Epp[i] /= 2 * M
    return E, (np.arange(Q) == y[:, None]) - Ep, -Epp, se


def _rule(Z, W, y, m, v):
    """(E, ρ, λ) of a rule (Z, W), in numpy, written apart from Softmax."""
    Z, W = np.asarray(Z), np.asarray(W)
    s = np.sqrt(v)
    f = m[:, None, :] + s[:, None, :] * Z
    lse = _lse(f)
    p = np.exp(f - lse[..., None])
    E = m[np.arange(len(y)), y] - lse @ W
    return (E, (np.arange(m.shape[1]) == y[:, None]) - np.einsum("npc,p->nc", p, W),
            -np.einsum("npc,pc,p->nc", p, Z, W) / s)


def _errors(got, ref):
    """Largest relative error of E, and of ρ and λ relative to each row's largest entry."""
    (E, rho, lam), (Er, rr, lr) = got, ref[:3]
    row = lambda a, b: np.max(np.max(np.abs(a - b), 1) / np.max(np.abs(b), 1))  # noqa: E731
    return np.max(np.abs(E - Er) / np.abs(Er)), row(rho, rr), row(lam, lr)


def test_few_classes_keep_the_product_rule():
    for C in range(2, PRODUCT_MAX_CLASSES + 1):
        Z, W = Softmax(num_classes=C)._nodes()
        Zp, Wp = product_nodes(points_per_difference(20, C), C - 1)
        np.testing.assert_array_equal(Z, Zp)
        np.testing.assert_array_equal(W, Wp)
        assert softmax_rule(20, C) == "product" and Z.shape == ({2: 40, 3: 196, 4: 216}[C], C - 1)
        Z3, _ = Softmax(num_classes=C, quadrature_points=3)._nodes()
        assert Z3.shape == ((6 if C == 2 else 3 ** (C - 1)), C - 1)


def test_rule_field_and_old_model_files():
    """``rule`` takes "differences" (the default) or "latents"; a saved Softmax records its rule,
    and a file written before the field existed (no ``rule``) is read with the old rule over all
    latents, so that it predicts as it did."""
    import json

    from gpvi.fitting import codec

    assert Softmax(num_classes=3).rule == "differences"
    assert Softmax(num_classes=3, rule="latents")._nodes()[0].shape == (1000, 3)
    with pytest.raises(ValueError, match="rule must be one of"):
        Softmax(num_classes=3, rule="sobol")
    arrays = {}
    spec = json.loads(json.dumps(codec.encode(Softmax(num_classes=3), arrays, "lik")))
    assert spec["fields"]["rule"] == {"value": "differences"}
    assert codec.decode(spec, arrays).rule == "differences"
    del spec["fields"]["rule"]  # as gpvi wrote it before the field existed
    assert codec.decode(spec, arrays).rule == "latents"


def _difference_rule(n, y, m, v):
    """(E, ρ, λ) of Softmax's product rule over the C − 1 differences from the labelled class
    (others in the order (y + j) mod C), written apart from Softmax: the covariance's factor by
    a dense Cholesky per row and the derivatives by automatic differentiation."""
    C = m.shape[1]
    Z, W = product_nodes(n, C - 1)

    def E(m_, v_):
        rows = []
        for i in range(len(y)):
            r = int(y[i])
            o = jnp.array([(r + j) % C for j in range(1, C)])
            A = jnp.linalg.cholesky(jnp.diag(v_[i, o]) + v_[i, r])
            d = (m_[i, o] - m_[i, r]) + Z @ A.T
            rows.append(-jax.scipy.special.logsumexp(jnp.concatenate([jnp.zeros((len(W), 1)), d], 1), axis=1) @ W)
        return jnp.stack(rows)

    m, v = jnp.asarray(m), jnp.asarray(v)
    tot = lambda a, b: jnp.sum(E(a, b))  # noqa: E731  (rows are independent)
    return E(m, v), jax.grad(tot, 0)(m, v), 2.0 * jax.grad(tot, 1)(m, v)


# Measured with this test's rows (seed C; 200 rows for C = 2, 3 and 100 for C = 4), largest / mean
# absolute error, the rule over the differences against the rule over all latents:
#   C = 2 (40 against 20² nodes): E 5.1e-5 / 4.4e-7 against 5.1e-5 / 1.5e-6, ρ 1.2e-4 / 1.3e-6
#         against 1.2e-4 / 3.5e-6, λ 2.9e-5 / 3.4e-7 against 3.5e-4 / 5.6e-6;
#   C = 3 (14² against 10³): E 4.1e-4 / 2.5e-5 against 1.6e-3 / 9.3e-5, ρ 1.1e-3 / 4.0e-5 against
#         2.2e-3 / 1.2e-4, λ 1.8e-3 / 3.7e-5 against 4.9e-3 / 1.2e-4;
#   C = 4 (6³ against 5⁴): E 7.5e-3 / 7.3e-4 against 1.3e-2 / 1.4e-3, ρ 1.2e-2 / 6.0e-4 against
#         2.1e-2 / 1.0e-3, λ 1.7e-2 / 5.5e-4 against 1.9e-2 / 8.0e-4.
# The largest error is not smaller on every set of rows (on 60 rows of seed 3, ρ 4.8e-3 against
# 1.8e-3, at a row with v = 10 in every class): the rules are of one class of accuracy, the
# new one is more accurate on average with 3–10× fewer nodes.
@pytest.mark.parametrize("C", [2, 3, 4])
@pytest.mark.slow
def test_difference_rule_is_as_accurate_as_the_rule_over_all_latents(C):
    """Softmax's rule over the C − 1 differences (40, 14², 6³ nodes) against the product rule over
    all C latents that gpvi used before (20², 10³, 5⁴ nodes), both against a reference of the
    latter kind at 40 (C ≤ 3) or 12 (C = 4) points per latent: the mean absolute error over the
    rows of E, ρ and λ is no larger, the largest at most 3× larger."""
    y, m, v = _grid(C, 200 if C <= 3 else 100, seed=C)
    ref = _rule(*product_nodes(40 if C <= 3 else 12, C), y, m, v)
    lik = Softmax(num_classes=C)
    new = [np.asarray(a) for a in lik.variational_moments(jnp.asarray(y, float), jnp.asarray(m), jnp.asarray(v))]
    rows = slice(0, 12)  # the rule it claims, on a few rows (the reference is slow to differentiate)
    for a, b in zip(new, _difference_rule(points_per_difference(20, C), y[rows], m[rows], v[rows])):
        np.testing.assert_allclose(a[rows], b, rtol=1e-10, atol=1e-12)
    old = _rule(*product_nodes({2: 20, 3: 10, 4: 5}[C], C), y, m, v)
    # rule="latents" is that old rule (model files written before the new one are read with it)
    kept = Softmax(num_classes=C, rule="latents").variational_moments(jnp.asarray(y, float), jnp.asarray(m), jnp.asarray(v))
    for a, b in zip(kept, old):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)
    for name, a, b, r in zip(("E", "rho", "lambda"), new, old, ref):
        e_new, e_old = np.abs(a - r), np.abs(b - r)
        assert e_new.mean() <= e_old.mean() and e_new.max() <= 3.0 * e_old.max(), (
            name, e_new.mean(), e_old.mean(), e_new.max(), e_old.max())


@pytest.mark.parametrize("C", [5, 10, 50])
def test_many_classes_use_a_small_antithetic_rule(C):
    Z, W = Softmax(num_classes=C)._nodes()
    assert softmax_rule(20, C) == "qmc" and Z.shape == (1024, C) and W.shape == (1024,)
    np.testing.assert_array_equal(Z[:512], -Z[512:])  # antithetic: odd moments are exact
    np.testing.assert_allclose(W, 1.0 / 1024, rtol=0)
    np.testing.assert_array_equal(Z, softmax_nodes(20, C)[0])  # deterministic
    assert Softmax(num_classes=C, quadrature_points=10)._nodes()[0].shape == (512, C)
    assert Softmax(num_classes=C, quadrature_points=40)._nodes()[0].shape == (2048, C)


def test_too_many_nodes_is_a_value_error():
    lik = Softmax(num_classes=2000, quadrature_points=200)  # 16384 nodes × 2000 classes
    with pytest.raises(ValueError, match="quadrature_points.*MonteCarlo"):
        lik.validate(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="QMC_MAX_ENTRIES"):
        qmc_nodes(2 ** 20, 50)
    Softmax(num_classes=2000).validate(np.array([0.0, 1999.0]))  # 1024 × 2000 entries: fine


@pytest.mark.parametrize("n", [5, 300])
@pytest.mark.slow
def test_closed_form_moments_are_the_derivatives_of_the_qmc_rule(n):
    # n = 300 rows at C = 7: more than one block of rows (91 rows a block; the last one padded)
    C = 7
    lik = Softmax(num_classes=C)
    rng = np.random.default_rng(C + n)
    m = jnp.asarray(3.0 * rng.standard_normal((n, C)))
    v = jnp.asarray(rng.uniform(0.05, 4.0, (n, C)))
    y = jnp.asarray(rng.integers(0, C, n).astype(float))
    Z, W = softmax_nodes(20, C)

    def row(m_, v_, y_):  # one row's rule, written independently of Softmax
        f = m_ + jnp.sqrt(v_) * Z
        return m_[y_.astype(int)] - jax.scipy.special.logsumexp(f, axis=-1) @ W

    E, rho, lam, h = lik.moments_and_mean_hessians(y, m, v)
    np.testing.assert_allclose(E, jax.vmap(row)(m, v, y), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(rho, jax.vmap(jax.grad(row, 0))(m, v, y), atol=1e-12)
    np.testing.assert_allclose(lam, 2.0 * jax.vmap(jax.grad(row, 1))(m, v, y), atol=1e-12)
    np.testing.assert_allclose(h, jax.vmap(jax.hessian(row, 0))(m, v, y), atol=1e-12)
    for a, b in zip(lik.variational_moments(y, m, v), (E, rho, lam)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(lik.expected_log_prob(y, m, v), E, rtol=1e-14)
    # reverse mode through the blocks of rows (the hypergradients differentiate E itself)
    g_m, g_v = jax.grad(lambda m_, v_: jnp.sum(lik.expected_log_prob(y, m_, v_)), (0, 1))(m, v)
    np.testing.assert_allclose(g_m, rho, atol=1e-12)
    np.testing.assert_allclose(2.0 * g_v, lam, atol=1e-12)
    # leading dimensions other than one row axis: the same values, in their shape
    E3, rho3, lam3 = lik.variational_moments(y[:4].reshape(2, 2), m[:4].reshape(2, 2, C), v[:4].reshape(2, 2, C))
    np.testing.assert_allclose(E3.reshape(4), E[:4], rtol=1e-14)
    np.testing.assert_allclose(lam3.reshape(4, C), lam[:4], rtol=1e-13, atol=1e-14)


# Bounds from measurements (fixed seeds, so the numbers are reproducible): against this test's
# reference (2·10⁵ samples, 6 rows; its standard error of E is 1.1e-3 relative at most, 1.7e-4
# at Q = 50) the QMC rule's largest errors are E 2.6e-3 / 9.1e-4, ρ 2.6e-3 / 3.5e-3 and λ 2.5e-2 /
# 0.149 (Q = 10 / 50; λ relative to each row's largest |λ|: the rule's λ_c = −Σ w π_c z_c / √v_c
# is least accurate for a class with small v_c in a row with large v elsewhere); the product rule
# at Q = 10 (2¹⁰ nodes, 2 per class) E 9.9e-2, ρ 0.11, λ 0.29.  A 10⁶-sample reference gives
# the same to two digits.
@pytest.mark.parametrize("Q", [10, 50])
@pytest.mark.slow
def test_qmc_rule_against_monte_carlo(Q):
    y, m, v = _grid(Q, 6)
    ref = _reference(y, m, v, N=200_000)
    assert np.max(ref[3] / np.abs(ref[0])) < 1.5e-3
    lik = Softmax(num_classes=Q)
    got = [np.asarray(a) for a in lik.variational_moments(jnp.asarray(y, float), jnp.asarray(m), jnp.asarray(v))]
    for a, b in zip(got, _rule(*softmax_nodes(20, Q), y, m, v)):  # Softmax computes the rule it claims
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    eE, er, el = _errors(got, ref)
    assert eE < 5e-3 and er < 1e-2 and el < 0.2, (eE, er, el)
    if Q == 10:  # the product rule with 2 points per class, as before, is far off
        pE, pr, pl = _errors(_rule(*product_nodes(2, Q), y, m, v), ref)
        assert pE > 10 * eE and pr > 10 * er and pl > 5 * el, (pE, pr, pl, eE, er, el)


def _classes(C, n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 2))
    centres = rng.uniform(-3, 3, (C, 2))
    F = -np.sum((X[:, None, :] - centres) ** 2, -1)
    P = np.exp(F - F.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    return X, np.array([rng.choice(C, p=p) for p in P]).astype(float)


@pytest.mark.slow
def test_ten_class_full_gp_fit():
    X, y = _classes(10, 100)
    res = gpvi.fit(MultiLatent.full([kernels.RBF()] * 10, Softmax(num_classes=10)), X, y, max_iter=5)
    assert np.isfinite(res.vlb)
    p = np.asarray(res.predict_proba(X))
    assert p.shape == (100, 10) and np.allclose(p.sum(1), 1.0)


@pytest.mark.slow
def test_fifty_class_sparse_fit_on_200_rows():
    X, y = _classes(50, 200)
    lik = Softmax(num_classes=50)
    assert lik._nodes()[0].size <= 1024 * 50  # the node array stays small
    res = gpvi.fit(MultiLatent.sparse([kernels.RBF()] * 50, lik, inducing=8), X, y, max_iter=3)
    assert np.isfinite(res.vlb)


if __name__ == "__main__":
    N = int(float(sys.argv[1])) if len(sys.argv) > 1 else 10 ** 6
    for Q in (4, 5, 6, 10, 50):
        y, m, v = _grid(Q, 12)
        ref = _reference(y, m, v, N)
        print(f"Q = {Q}: reference {N} samples, largest relative standard error of E "
              f"{np.max(ref[3] / np.abs(ref[0])):.1e}")
        rules = [] if Q > 12 else [(f"product {max(2, int(1000 ** (1 / Q)))}^{Q}",
                                    product_nodes(max(2, int(1000 ** (1 / Q) + 1e-9)), Q))]
        if Q > PRODUCT_MAX_CLASSES:
            rules.append(("softmax_nodes(20)", softmax_nodes(20, Q)))
        for name, (Z, W) in rules:
            eE, er, el = _errors(_rule(Z, W, y, m, v), ref)
            print(f"  {name:20s} nodes {len(W):5d}  E {eE:.1e}  rho {er:.1e}  lambda {el:.1e}")
