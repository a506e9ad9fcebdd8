"""``Softmax(reference=r)``: the multinomial logit with class r's logit held at 0 and C − 1 latents.

Checked against truths written apart from gpvi: a 120² Gauss–Hermite rule in NumPy over the two
free logits (E and the class probabilities), JAX's derivatives of ``expected_log_prob`` (ρ, λ and
the mean Hessians), and a fit of the same model written with C latents whose reference latent has
a negligible prior variance.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpvi
from gpvi import kernels
from gpvi.fitting import codec
from gpvi.likelihoods.softmax import Softmax
from gpvi.models.multilatent import MultiLatent


def _gauss_hermite(m, v, y, r, n=120):
    """(E[log p(y | f)], E[softmax(f)]) for three classes, logit r fixed at 0 and the other two
    independent N(m_j, v_j): a tensor Gauss–Hermite rule of n² nodes, in NumPy."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    f0 = m[0] + np.sqrt(v[0]) * x[:, None] + 0.0 * x[None, :]
    f1 = m[1] + np.sqrt(v[1]) * x[None, :] + 0.0 * x[:, None]
    full = np.insert(np.stack([f0, f1], -1), r, 0.0, axis=-1)
    lse = np.logaddexp.reduce(full, axis=-1)
    W = w[:, None] * w[None, :]
    return np.sum(W * (full[..., int(y)] - lse)), np.einsum("ij,ijc->c", W, np.exp(full - lse[..., None]))


def _rows(seed, n=8, Q=2):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, Q + 1, n).astype(float), 2.0 * rng.standard_normal((n, Q)),
            np.exp(rng.uniform(np.log(0.02), np.log(5.0), (n, Q))))


@pytest.mark.parametrize("r", [0, 1, 2])
def test_expectation_and_probabilities_against_a_fine_rule(r):
    y, m, v = _rows(r)
    lik = Softmax(num_classes=3, reference=r)
    assert lik.num_latents == 2
    E = np.asarray(lik.expected_log_prob(y, m, v))
    P = np.asarray(lik.predict_proba(m, v))
    ref = [_gauss_hermite(m[i], v[i], y[i], r) for i in range(len(y))]
    # the rule's own error (14² nodes over the differences) is 1e-5 to 1e-4 on such rows (the
    # module test_softmax_rules measures it: up to 4e-4 in E for C = 3)
    np.testing.assert_allclose(E, [e for e, _ in ref], atol=3e-4)
    np.testing.assert_allclose(P, [p for _, p in ref], atol=3e-4)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=1e-12)
    lp = np.asarray(lik.predictive_log_density(y, m, v))
    np.testing.assert_allclose(lp, np.log(P[np.arange(len(y)), y.astype(int)]), atol=1e-12)


@pytest.mark.parametrize("C,r,rule", [(3, 2, "differences"), (3, 0, "latents"), (4, 1, "differences"),
                                      (6, 3, "differences")])
def test_moments_are_the_derivatives_of_the_expectation(C, r, rule):
    """ρ = ∂E/∂m, λ = 2 ∂E/∂v and h = ∂²E/∂m² over the C − 1 latents, against autodiff, for the
    product rules (C ≤ 4) and the QMC rule (C = 6)."""
    lik = Softmax(num_classes=C, reference=r, rule=rule)
    y, m, v = _rows(C + r, n=5, Q=C - 1)
    E, rho, lam, h = lik.moments_and_mean_hessians(y, m, v)
    assert rho.shape == lam.shape == (5, C - 1) and h.shape == (5, C - 1, C - 1)
    gm, gv = jax.grad(lambda a, b: jnp.sum(lik.expected_log_prob(y, a, b)), argnums=(0, 1))(m, v)
    H = jax.vmap(jax.hessian(lambda a, b, c: lik.expected_log_prob(c[None], a[None], b[None])[0]))(m, v, y)
    np.testing.assert_allclose(rho, gm, atol=1e-12)
    np.testing.assert_allclose(lam, 2.0 * gv, atol=1e-12)
    np.testing.assert_allclose(h, H, atol=1e-12)
    np.testing.assert_allclose(E, lik.expected_log_prob(y, m, v), atol=1e-13)
    assert np.all(np.isfinite(np.asarray(lam)))


def test_bad_reference_is_a_value_error():
    for kw in (dict(num_classes=3, reference=3), dict(num_classes=2, reference=0),
               dict(num_classes=3, reference=-1), dict(num_classes=3, reference=True),
               dict(num_classes=3, reference=1.5)):
        with pytest.raises(ValueError, match="reference"):
            Softmax(**kw)
    assert Softmax(num_classes=3).num_latents == 3


def _three_blobs(n=45, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n // 3).astype(float)
    X = rng.normal(size=(len(y), 2)) * 0.8 + np.array([[0.0, 0.0], [2.0, 0.5], [1.0, 2.0]])[y.astype(int)]
    return X, y


def test_fit_equals_the_model_with_a_constant_latent():
    """Two latents with class 2 as the reference give the bound and predictions of three latents
    whose third has prior variance 1e-10 (so that its logit is 0 to within 1e-5): another way of
    writing the same model, through the C-latent code paths."""
    X, y = _three_blobs()
    k = kernels.RBF(variance=2.0, lengthscale=1.0)
    two = gpvi.fit(MultiLatent.full([k, k], Softmax(num_classes=3, reference=2)), X, y, tol=1e-10)
    tiny = kernels.RBF(variance=1e-10, lengthscale=1.0)
    three = gpvi.fit(MultiLatent.full([k, k, tiny], Softmax(num_classes=3)), X, y, tol=1e-10)
    assert two.converged and three.converged
    assert abs(two.vlb - three.vlb) < 1e-4 * len(y)
    Xt = X[::4] + 0.3
    np.testing.assert_allclose(two.predict_proba(Xt), three.predict_proba(Xt), atol=1e-4)
    m, _ = two.predict_f(Xt)
    assert np.shape(m) == (len(Xt), 2)


def test_model_file_keeps_the_reference(tmp_path):
    spec = json.loads(json.dumps(codec.encode(Softmax(num_classes=4, reference=1), {}, "lik")))
    back = codec.decode(spec, {})
    assert back.reference == 1 and back.num_latents == 3
    del spec["fields"]["reference"]  # as gpvi wrote a Softmax before the field existed
    assert codec.decode(spec, {}).reference is None


def test_search_names_the_class_whose_kernel_variance_vanished():
    """With per-class kernels learned, a latent whose kernel variance is negligible against the
    others' (here it starts there, and the search cannot bring it back in two rounds) is named in
    the search's message, with the reference-class model that fits that optimum directly; a
    search whose variances stay comparable, or a model with a reference already, gets no hint."""
    from gpvi.fitting.hyper import softmax_shift_hint

    X, y = _three_blobs()
    ks = [kernels.RBF(variance=2.0, lengthscale=1.0), kernels.RBF(variance=1.0, lengthscale=1.0),
          kernels.RBF(variance=1e-9, lengthscale=1.0)]
    fit = gpvi.fit(MultiLatent.full(ks, Softmax(num_classes=3)), X, y, learn_hyperparameters=True, max_rounds=2)
    assert "Softmax(num_classes=3, reference=2)" in fit.search_message
    names = ["latents.0.kernel.variance", "latents.1.kernel.variance", "latents.2.kernel.variance"]
    even = MultiLatent.full([kernels.RBF(variance=v) for v in (2.0, 1.0, 0.5)], Softmax(num_classes=3))
    assert softmax_shift_hint(even, names) == ""
    ref = MultiLatent.full([kernels.RBF(variance=2.0), kernels.RBF(variance=1e-9)], Softmax(num_classes=3, reference=0))
    assert softmax_shift_hint(ref, names[:2]) == ""
    assert softmax_shift_hint(MultiLatent.full(ks, Softmax(num_classes=3)), ["latents.0.kernel.lengthscale"]) == ""
