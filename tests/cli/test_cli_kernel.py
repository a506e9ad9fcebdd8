"""`gpvi fit --kernel SPEC` and `--ard/--no-ard` (issue 33): the kernel grammar, the default
left exactly as it was, and bad specs as one `gpvi: error:` line."""
import csv

import numpy as np
import pytest

import gpvi
from gpvi import kernels as K
from clitools import assert_bad_input, run  # noqa: E402


def _csv(path, X, y):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"x{j}" for j in range(X.shape[1])] + ["y"])
        for row, t in zip(X, y):
            w.writerow([repr(float(v)) for v in row] + [int(t) if float(t).is_integer() else repr(float(t))])
    return path




@pytest.fixture(scope="module")
def periodic_csv(tmp_path_factory):
    rng = np.random.default_rng(7)
    X = np.sort(rng.uniform(0, 10, 60))[:, None]
    y = 0.3 * X[:, 0] + np.sin(2 * np.pi * X[:, 0] / 2.5) + 0.1 * rng.standard_normal(60)
    return _csv(tmp_path_factory.mktemp("per") / "periodic.csv", X, y)


@pytest.fixture(scope="module")
def two_feature_csv(tmp_path_factory):
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 2)) * [1.0, 3.0]
    y = (np.sin(X[:, 0]) + 0.2 * X[:, 1] + 0.3 * rng.standard_normal(40) > 0).astype(int)
    return _csv(tmp_path_factory.mktemp("two") / "two.csv", X, y)


def test_rbf_plus_periodic_fits_saves_and_predicts(periodic_csv, tmp_path, capsys):
    out = tmp_path / "m.gpvi"
    rc, text, err = run(capsys, "fit", periodic_csv, "-t", "y", "-l", "gaussian", "--kernel", "rbf+periodic",
                        "--max-rounds", "20", "-o", out)
    assert rc == 0, err
    assert text.splitlines()[0].startswith("gpvi fit: full GP (kernel rbf+periodic, ARD), gaussian likelihood")
    fit = gpvi.io.load(out)
    k = fit.model.kernel
    assert isinstance(k, K.Sum) and [type(c) for c in k.kernels] == [K.RBF, K.Periodic]
    names = set(fit.model.parameters())
    assert {"kernel.kernels.0.lengthscale", "kernel.kernels.1.period"} <= names
    assert "kernel.kernels.1.period" in text  # the summary lists the learned period
    assert fit.hyperparameter_rounds > 0
    rc, _, err = run(capsys, "predict", out, periodic_csv, "-q", "-o", tmp_path / "p.csv")
    assert rc == 0, err
    assert (tmp_path / "p.csv").read_text().count("\n") == 61


@pytest.mark.slow
def test_product_without_ard_has_one_lengthscale(two_feature_csv, tmp_path, capsys):
    out = tmp_path / "m.gpvi"
    rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--kernel", "Matern52 * linear",
                     "--no-ard", "--max-rounds", "4", "-q", "-o", out)
    assert rc == 0, err
    k = gpvi.io.load(out).model.kernel
    assert isinstance(k, K.Product) and [type(c) for c in k.kernels] == [K.Matern52, K.Linear]
    assert np.ndim(k.kernels[0].lengthscale) == 0
    # with ARD (the default for --kernel) one lengthscale per feature
    rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--kernel", "rq",
                     "--max-rounds", "4", "-q", "-o", out)
    assert rc == 0, err
    k = gpvi.io.load(out).model.kernel
    assert isinstance(k, K.RationalQuadratic) and np.shape(k.lengthscale) == (2,)


@pytest.mark.slow
def test_no_kernel_option_and_kernel_rbf_give_the_default_model(two_feature_csv, tmp_path, capsys):
    """Bernoulli on two features: the default's isotropic-then-ARD search.  No --kernel, --kernel
    rbf and --ard give the same file contents; --no-ard alone an isotropic RBF."""
    fits = {}
    for name, extra in [("default", []), ("rbf", ["--kernel", "RBF"]), ("ard", ["--ard"])]:
        out = tmp_path / f"{name}.gpvi"
        rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--max-rounds", "4", "-q",
                         "-o", out, *extra)
        assert rc == 0, err
        fits[name] = gpvi.io.load(out)
    ref = fits["default"]
    assert type(ref.model.kernel) is K.RBF and np.shape(ref.model.kernel.lengthscale) == (2,)
    for name in ("rbf", "ard"):
        got = fits[name]
        assert type(got.model.kernel) is K.RBF and got.vlb == ref.vlb
        assert got.hyperparameter_rounds == ref.hyperparameter_rounds
        for (n, a), (m, b) in zip(ref.model.parameters().items(), got.model.parameters().items()):
            assert n == m
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    out = tmp_path / "iso.gpvi"
    rc, text, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--max-rounds", "4",
                        "--no-ard", "-o", out)
    assert rc == 0, err
    assert "kernel rbf" in text.splitlines()[0] and "ARD" not in text.splitlines()[0]
    k = gpvi.io.load(out).model.kernel
    assert type(k) is K.RBF and np.ndim(k.lengthscale) == 0


@pytest.mark.parametrize("spec, needles", [
    ("rbf+cosine", ["--kernel: unknown kernel 'cosine'", "rbf, matern12"]),
    ("rbff", ["did you mean 'rbf'"]),
    ("rbf+", ["empty term"]),
    ("*linear", ["empty term"]),
])
def test_bad_kernel_specs_are_one_line_errors(two_feature_csv, tmp_path, capsys, spec, needles):
    rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--kernel", spec,
                     "-o", tmp_path / "m.gpvi")
    assert_bad_input(rc, err, *needles)
    assert not (tmp_path / "m.gpvi").exists()


def test_kernel_with_glm_or_stream_is_refused(two_feature_csv, tmp_path, capsys):
    rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--kernel", "rbf", "-m", "glm",
                     "-o", tmp_path / "m.gpvi")
    assert_bad_input(rc, err, "--kernel and --ard apply to GP models, not --model glm")
    rc, _, err = run(capsys, "fit", two_feature_csv, "-t", "y", "-l", "bernoulli", "--kernel", "periodic",
                     "--stream", "-o", tmp_path / "m.gpvi")
    assert_bad_input(rc, err, "--stream")
