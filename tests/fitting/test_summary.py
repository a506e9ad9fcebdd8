"""A fit you can read (issue 33): ``repr(fit)`` is one line and ``print(fit)`` / ``fit.summary()``
at most about 30 lines for any model (sparse M = 30, 3-class softmax, GLM, mixture posterior),
the summary's numbers are the result's own (parsed back from the text), the parameter table
holds the model's parameters (inducing inputs and state only as shapes), and the result records
why the hyperparameter search stopped and the jitter the Cholesky factorisation used."""
import re

import numpy as np
import pytest

import gpvi
from gpvi import GLM, GP, SparseGP, kernels
from gpvi import likelihoods as L
from gpvi.fitting.posterior import effective_jitter
from gpvi.kernels import same_rows
from gpvi.models.multilatent import MultiLatent

MAX_LINES = 30


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


def _field(text, label, pattern=r"(\S+)"):
    """The value after ``label`` in ``text`` (a regex group), as a string."""
    m = re.search(re.escape(label) + pattern, text)
    assert m is not None, f"{label!r} not in:\n{text}"
    return m.group(1)


def _table(text):
    """{name: (value, constraint, learned)} of the summary's parameter table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["parameter"])
    out = {}
    for line in lines[start + 1:]:
        if line.strip().startswith("..."):
            continue
        parts = re.split(r"\s{2,}", line.strip())
        out[parts[0]] = tuple(parts[1:])
    return out


@pytest.fixture(scope="module")
def sparse_fit():
    X, y = _data()
    model = SparseGP(kernels.RBF(), L.Gaussian(), inducing=30)
    return gpvi.fit(model, X, y, learn_hyperparameters=True)


def test_sparse_repr_is_one_line_and_print_at_most_30(sparse_fit):
    fit = sparse_fit
    r = repr(fit)
    assert r.count("\n") == 0 and r.startswith("FitResult(") and len(r) < 250
    text = str(fit)
    assert text == fit.summary()
    assert len(text.splitlines()) <= MAX_LINES
    assert len(text) < 3000  # no arrays: the (30, 2) inducing inputs and the (30, 30) factor are not printed
    # the shapes of the inducing inputs and of the state, on one line
    hidden = _field(text, "not in the table: ", r"(.*)")
    assert "(30, 2)" in hidden and "(30, 30)" in hidden
    assert "inducing" not in _table(text)


def test_summary_numbers_are_the_results_own(sparse_fit):
    fit = sparse_fit
    text = fit.summary()
    assert float(_field(text, "VLB: ")) == pytest.approx(fit.vlb, rel=1e-9, abs=1e-9)
    gap = float(_field(text, "gap: "))
    assert gap == pytest.approx(fit.gap, rel=1e-9, abs=1e-12)
    assert int(_field(text, "iterations: ")) == fit.iterations
    assert int(_field(text, "evaluations: ")) == fit.evaluations
    assert int(_field(text, "hyperparameter rounds: ", r"(\d+)")) == fit.hyperparameter_rounds
    assert _field(text, "converged: ", r"(\w+)") == str(fit.converged)
    assert _field(text, "engine: ", r"(\w+)") == fit.engine == "fpi"
    assert float(_field(text, "jitter: ")) == pytest.approx(fit.jitter, rel=1e-9)
    assert fit.hyperparameter_rounds >= 1 and fit.iterations >= fit.hyperparameter_rounds
    assert "SparseGP" in text and "M=30" in text and "likelihood: Gaussian" in text
    # why the search stopped: SciPy's L-BFGS-B message, recorded and shown
    assert fit.search_message and fit.search_message.split(" (")[0] in text
    # the table: every learnable parameter, its value as the model holds it, its constraint
    table = _table(text)
    params, trans = fit.model.parameters(), fit.model.transforms()
    assert set(table) == set(gpvi.learnable_parameters(fit.model))
    for name, (value, constraint, learned) in table.items():
        assert float(value) == pytest.approx(float(params[name]), rel=1e-5)
        assert constraint == trans[name]
        assert learned == "yes"


def test_jitter_recorded_is_the_factorisations(sparse_fit):
    fit = sparse_fit
    assert fit.jitter == pytest.approx(fit.model.jitter)
    # the prior cache is the factor of K_ZZ + j·s·I: its diagonal of L Lᵀ exceeds K_ZZ's by j·s
    Z = np.asarray(fit.model.inducing)
    K = np.asarray(fit.model.kernel(Z, Z))
    Lz = np.asarray(fit.prior)
    added = np.mean(np.sum(Lz**2, axis=1) - np.diag(K))
    assert added == pytest.approx(fit.jitter * np.mean(np.diag(K)), rel=1e-3)


class _Indefinite(kernels.RBF):
    """An RBF kernel less 1e-12 on the diagonal: not positive definite (for a test of the jitter)."""

    def _K(self, X1, X2):
        return super()._K(X1, X2) - 1e-12 * same_rows(X1, X2)

    def _diag(self, X):
        return super()._diag(X) - 1e-12


def test_jitter_grown_is_reported():
    # a kernel matrix with eigenvalues near −1e-12 (an RBF of long lengthscale, whose smallest
    # eigenvalues are ~0, less 1e-12 I): a relative jitter of 1e-15 cannot factorise it, so the
    # factorisation grows it tenfold until it can; the fit reports the value it used
    X, y = _data(30, seed=1)
    kern = _Indefinite(lengthscale=5.0)
    K = np.asarray(kern(X, X))
    s = np.mean(np.diag(K))
    assert np.linalg.eigvalsh(K).min() < -5e-13
    model = GP(kern, L.Gaussian(variance=0.1), jitter=1e-15)
    fit = gpvi.fit(model, X, y)
    nugget = float(fit.prior[2])  # the absolute jitter the prior cache holds
    assert fit.jitter in (pytest.approx(1e-12), pytest.approx(1e-11))
    assert nugget == pytest.approx(fit.jitter * s, rel=1e-9)
    np.linalg.cholesky(K + fit.jitter * s * np.eye(30))  # it factorises K in NumPy too
    assert effective_jitter(fit.model, None, X) == pytest.approx(fit.jitter)
    assert "grown from model.jitter 1e-15" in fit.summary()
    assert fit.search_message == "no hyperparameters learned"
    assert fit.learned == ()


def test_softmax_three_classes_summary():
    X, _ = _data(30, seed=2)
    y = np.digitize(X[:, 0], [-0.4, 0.4]).astype(float)
    model = MultiLatent.full([kernels.RBF()], L.Softmax(num_classes=3))
    fit = gpvi.fit(model, X, y, learn_hyperparameters=["latents.*.kernel.lengthscale"], max_rounds=3)
    r, text = repr(fit), str(fit)
    assert "\n" not in r and len(text.splitlines()) <= MAX_LINES
    assert "MultiLatent of 3 GP latent functions" in text and "num_classes=3" in text
    table = _table(text)
    params = fit.model.parameters()
    assert set(table) == set(gpvi.learnable_parameters(fit.model))
    for name, (value, _, learned) in table.items():
        assert float(value) == pytest.approx(float(params[name]), rel=1e-5)
        # the tied lengthscale was learned, the rest kept
        assert learned == ("yes" if name.endswith("kernel.lengthscale") else "no")
    assert fit.hyperparameter_rounds <= 3 and fit.search_message
    if fit.hyperparameter_rounds == 3:
        assert fit.search_message.startswith("max_rounds reached")
    assert int(_field(text, "hyperparameter rounds: ", r"(\d+)")) == fit.hyperparameter_rounds


def test_max_rounds_reached_on_the_profile_search():
    X, y = _data(30, seed=3)
    model = GP(kernels.RBF(), L.Bernoulli())
    fit = gpvi.fit(model, X, (y > 0).astype(float), learn_hyperparameters=True, max_rounds=1)
    assert fit.hyperparameter_rounds == 1
    assert fit.search_message.startswith("max_rounds reached")
    assert fit.search_message in fit.summary()


def test_long_vectors_by_shape_and_range_and_the_table_is_capped():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 10))
    ell = np.linspace(0.5, 5.0, 10)
    model = GP(kernels.RBF(lengthscale=ell), L.Bernoulli())
    fit = gpvi.fit(model, X, (X[:, 0] > 0).astype(float))
    value = _table(fit.summary())["kernel.lengthscale"][0]
    assert value == "shape (10,), min 0.5, max 5"
    assert _table(fit.summary())["kernel.variance"][2] == "no"  # nothing learned
    # many latents (18 parameters): at most 15 rows, the rest counted on one line (the summary
    # reads the model only: a result built by hand, not fitted, is enough)
    ml = MultiLatent.full([kernels.RBF()], L.Softmax(num_classes=6))
    fit6 = gpvi.FitResult(model=ml, state=gpvi.prior_state(4, 6), vlb=-1.0, iterations=0, converged=False,
                          message="", trace=np.zeros((0, 2)), engine="fpi")
    text = fit6.summary()
    assert "search stopped: (not recorded)" in text and "was not recorded" in text
    assert len(text.splitlines()) <= MAX_LINES
    assert re.search(r"\.\.\. and \d+ more", text)


def test_glm_summary():
    rng = np.random.default_rng(5)
    X = np.c_[np.ones(40), rng.normal(size=(40, 2))]
    y = rng.poisson(2.0, size=40).astype(float)
    fit = gpvi.fit(GLM(L.Poisson()), X, y)
    text = fit.summary()
    assert len(text.splitlines()) <= MAX_LINES
    assert "GLM" in text and "jitter: none" in text and np.isnan(fit.jitter)
    assert fit.search_message == "no hyperparameters learned"
    assert float(_field(text, "VLB: ")) == pytest.approx(fit.vlb, rel=1e-9)


@pytest.mark.slow
def test_mog_repr_and_summary():
    X, y = _data(12, seed=6)
    fit = gpvi.fit(GP(kernels.RBF(), L.Bernoulli()), X, (y > 0).astype(float), posterior="mog", components=2,
                   learn_hyperparameters=["kernel.lengthscale"])
    r, text = repr(fit), str(fit)
    assert r.startswith("MoGResult(") and "components=2" in r and "\n" not in r
    assert len(text.splitlines()) <= MAX_LINES and len(text) < 3000
    assert "2 diagonal Gaussian component(s)" in text
    assert float(_field(text, "VLB: ")) == pytest.approx(fit.vlb, rel=1e-9)
    assert int(_field(text, "hyperparameter rounds: ", r"(\d+)")) == fit.hyperparameter_rounds
    assert fit.search_message and fit.search_message in text
    assert fit.jitter == pytest.approx(1e-8)


@pytest.mark.slow
def test_loaded_mog_result_reads_its_jitter(tmp_path):
    X, y = _data(12, seed=6)
    fit = gpvi.fit(GP(kernels.RBF(), L.Bernoulli()), X, (y > 0).astype(float), posterior="mog", components=2)
    back = gpvi.io.load(gpvi.io.save(fit, tmp_path / "mog.gpvi"))
    assert np.isnan(back.jitter)  # not in the file
    assert float(_field(back.summary(), "jitter: ")) == pytest.approx(fit.jitter)
    assert len(str(back).splitlines()) <= MAX_LINES and repr(back).startswith("MoGResult(")


def test_hyperprior_summary_states_bound_log_prior_and_objective():
    X, y = _data(30, seed=7)
    model = GP(kernels.RBF(), L.Gaussian())
    prior = {"kernel.lengthscale": gpvi.priors.LogNormal(0.0, 0.5)}
    fit = gpvi.fit(model, X, y, learn_hyperparameters=True, hyperprior=prior)
    text = fit.summary()
    lp = float(fit.extras["log_prior"])
    assert "the bound alone" in text
    assert float(_field(text, "VLB: ")) == pytest.approx(fit.vlb, rel=1e-9)
    assert float(_field(text, "log prior: ")) == pytest.approx(lp, rel=1e-9, abs=1e-9)
    assert float(_field(text, "objective maximised (bound + log prior): ")) == pytest.approx(fit.vlb + lp, rel=1e-9)
    # without a prior there is no such line
    assert "log prior" not in gpvi.fit(model, X, y).summary()


def test_loaded_result_reads_the_same(sparse_fit, tmp_path):
    path = gpvi.io.save(sparse_fit, tmp_path / "fit.gpvi")
    back = gpvi.io.load(path)
    text = back.summary()
    assert len(text.splitlines()) <= MAX_LINES
    assert float(_field(text, "VLB: ")) == pytest.approx(sparse_fit.vlb, rel=1e-9)
    # the jitter is not stored in the file: it is read off the stored prior cache
    assert float(_field(text, "jitter: ")) == pytest.approx(sparse_fit.jitter)
    # the same parameters (which ones were learned is not stored: "-")
    before, after = _table(sparse_fit.summary()), _table(text)
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    assert {v[2] for v in after.values()} == {"-"}


def test_predict_f_cov_diagonal_is_predict_f(sparse_fit):
    X, _ = _data(12, seed=8)
    m, v = sparse_fit.predict_f(X)
    mc, C = sparse_fit.predict_f_cov(X)
    np.testing.assert_allclose(mc, m, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diag(C), v, rtol=1e-8, atol=1e-12)
    assert np.allclose(C, C.T) and np.linalg.eigvalsh(C).min() > -1e-10


def test_each_model_describes_itself():
    # the summary's first line comes from Model.describe() and Kernel.structure() (no isinstance
    # switch in FitResult): a new model or combinator kernel says what it is without an edit there
    k = gpvi.kernels
    Z = np.zeros((4, 1))
    assert gpvi.GP(k.RBF() + k.Periodic(), L.Bernoulli()).describe() == "GP (full), kernel RBF + Periodic"
    assert gpvi.SparseGP(2.0 * k.Matern52() * k.Linear(), L.Poisson(), inducing=Z).describe() == \
        "SparseGP (M=4 inducing inputs), kernel Scale * (Matern52) * Linear"
    assert gpvi.SparseGP(k.RBF(), L.Poisson(), inducing=7).describe() == "SparseGP (M=7 inducing inputs), kernel RBF"
    assert gpvi.GLM(L.Bernoulli()).describe() == "GLM (Bayesian generalised linear model)"
    ml = gpvi.MultiLatent.sparse([k.RBF(), k.Matern32()], gpvi.Softmax(num_classes=2), inducing=Z)
    assert ml.describe() == "MultiLatent of 2 SparseGP latent functions, M=4 inducing inputs each, kernels RBF, Matern32"

    class DescribedKernel(k.Kernel):
        def _K(self, X1, X2):
            return X1 @ X2.T

        def _diag(self, X):
            return np.sum(X * X, axis=1)

    assert gpvi.GP(DescribedKernel() + k.White(0.1), L.Gaussian()).describe() == \
        "GP (full), kernel DescribedKernel + White"
