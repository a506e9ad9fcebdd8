"""Multiclass (softmax) from the command line (issue 33, acceptance 3): ``gpvi fit`` with
``--likelihood softmax`` or without ``--likelihood`` (chosen from the target, with a line saying
so), ``gpvi predict`` with one probability column per class, and the bad inputs."""
import contextlib
import io
from types import SimpleNamespace

import numpy as np
import pytest

import gpvi
import gpvi.cli.fit as cli_fit
from gpvi.cli.common import UsageError
from gpvi.cli.table import Table, choose_likelihood
from gpvi.cli import main
from gpvi.cli.common import AUTO_INTEGER_CLASSES, MAX_CLASSES
from clitools import assert_bad_input, read_csv, run, write_csv  # noqa: E402

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@pytest.fixture(scope="module")
def iris(tmp_path_factory):
    """60 training rows and the other 90 of scikit-learn's iris, species as text labels."""
    from sklearn.datasets import load_iris

    d = load_iris()
    order = np.random.default_rng(0).permutation(150)
    folder = tmp_path_factory.mktemp("iris")

    def rows(idx):
        return [[repr(float(v)) for v in d.data[i]] + [d.target_names[d.target[i]]] for i in idx]

    train = write_csv(folder / "iris.csv", FEATURES + ["species"], rows(order[:60]))
    test = write_csv(folder / "test.csv", FEATURES + ["species"], rows(order[60:]))
    return SimpleNamespace(folder=folder, train=train, test=test, X=d.data[order], codes=d.target[order],
                           names=list(d.target_names))


@pytest.fixture(scope="module")
def fitted(iris):
    """``gpvi fit iris.csv --target species`` (no --likelihood), with the fit object that was saved."""
    out = iris.folder / "iris.gpvi"
    saved = {}
    real_save = cli_fit.save_model

    def keep(fit, path, extra):
        saved["fit"], saved["extra"] = fit, extra
        return real_save(fit, path, extra)

    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        mp.setattr(cli_fit, "save_model", keep)
        rc = main(["fit", str(iris.train), "--target", "species", "--max-rounds", "4", "--out", str(out)])
    assert rc == 0, stderr.getvalue()
    return SimpleNamespace(path=out, out=stdout.getvalue(), err=stderr.getvalue(), **saved)


# ------------------------------------------------------------------------------ fit → predict
@pytest.mark.slow
def test_fit_without_likelihood_chooses_softmax_and_says_so(fitted):
    lines = fitted.out.splitlines()
    assert lines[0].startswith("gpvi fit: no --likelihood given: target 'species' has 3 distinct text labels")
    assert "so softmax (multiclass" in lines[0]
    assert sum("no --likelihood given" in line for line in lines) == 1
    assert "3 latent functions (one per class), softmax likelihood, engine fpi" in fitted.out
    assert "setosa = 0, versicolor = 1, virginica = 2" in fitted.out
    assert "latents.2.kernel.lengthscale[petal_width]" in fitted.out
    training = [line for line in lines if line.strip().startswith("training")]
    assert len(training) == 1 and "error rate" in training[0], fitted.out
    assert float(training[0].split("error rate")[1].split()[0]) < 0.1
    extra = fitted.extra
    assert extra["likelihood"] == "softmax" and extra["labels"] == ["setosa", "versicolor", "virginica"]
    assert extra["version"] == 2 and extra["model"] == "full"
    assert fitted.fit.model.likelihood.num_classes == 3


@pytest.mark.slow
def test_predict_writes_a_probability_column_per_class_and_scores(fitted, iris, tmp_path, capsys):
    out = tmp_path / "pred.csv"
    rc, _, err = run(capsys, "predict", fitted.path, iris.test, "--out", out)
    assert rc == 0, err
    header, rows = read_csv(out)
    assert header == ["p_setosa", "p_versicolor", "p_virginica", "label"]
    proba = np.array([[float(v) for v in r[:3]] for r in rows])
    assert proba.shape == (90, 3) and np.all(proba >= 0)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-8)
    labels = [r[3] for r in rows]
    assert labels == [iris.names[k] for k in proba.argmax(axis=1)]
    assert "90 predictions (p_setosa, p_versicolor, p_virginica, label)" in err
    score = [line for line in err.splitlines() if line.startswith("scored on target 'species'")]
    assert len(score) == 1 and "NLPD" in score[0], err
    rate = float(score[0].split("error rate")[1].split(",")[0])
    truth = [iris.names[k] for k in iris.codes[60:]]
    assert rate == pytest.approx(np.mean(np.array(labels) != np.array(truth)), rel=1e-3)
    assert rate < 0.1


@pytest.mark.slow
def test_model_file_round_trip_predicts_identical_numbers(fitted, iris, tmp_path, capsys):
    """The probabilities `gpvi predict` writes from the file are the saved fit's own, bit for bit."""
    out = tmp_path / "pred.csv"
    assert run(capsys, "predict", fitted.path, iris.test, "--out", out, "-q")[0] == 0
    _, rows = read_csv(out)
    from_file = np.array([[float(v) for v in r[:3]] for r in rows])
    extra = fitted.extra
    Xs = (iris.X[60:] - np.asarray(extra["x_mean"])) / np.asarray(extra["x_scale"])
    np.testing.assert_array_equal(from_file, np.asarray(fitted.fit.predict_proba(Xs)))
    loaded, loaded_extra = gpvi.io.load(fitted.path, with_extra=True)
    assert loaded_extra == extra
    np.testing.assert_array_equal(np.asarray(loaded.predict_proba(Xs)), from_file)


@pytest.mark.slow
def test_unseen_labels_at_predict_are_named(fitted, iris, tmp_path, capsys):
    """Predictions do not depend on the target column: they are written, and the score line says
    which labels the model does not know instead of scoring."""
    header, rows = read_csv(iris.test)
    rows = [list(r) for r in rows[:10]]
    rows[3][-1] = "zebra"
    data = write_csv(tmp_path / "unseen.csv", header, rows)
    rc, _, err = run(capsys, "predict", fitted.path, data, "--out", tmp_path / "p.csv")
    assert rc == 0, err
    assert "target column 'species' not scored: 1 row(s) have labels 'zebra'" in err
    assert "'setosa', 'versicolor', 'virginica'" in err
    assert len(read_csv(tmp_path / "p.csv")[1]) == 10


@pytest.mark.slow
def test_explicit_softmax_glm_with_integer_labels(iris, tmp_path, capsys):
    """`--likelihood softmax --model glm` on integer class codes: one GLM per class with its own
    intercept; the probability columns are named by the codes."""
    rows = [[repr(float(v)) for v in x] + [int(c)] for x, c in zip(iris.X[:60], iris.codes[:60])]
    data = write_csv(tmp_path / "coded.csv", FEATURES + ["y"], rows)
    model = tmp_path / "g.gpvi"
    rc, out, err = run(capsys, "fit", data, "-t", "y", "-l", "softmax", "--model", "glm", "--max-rounds", "3",
                       "-o", model)
    assert rc == 0, err
    assert "no --likelihood given" not in out
    assert "Bayesian GLM, 3 latent functions (one per class), softmax likelihood" in out
    assert "0 = 0, 1 = 1, 2 = 2" in out
    rc, csv_out, err = run(capsys, "predict", model, data)
    assert rc == 0, err
    header = csv_out.splitlines()[0].split(",")
    assert header == ["p_0", "p_1", "p_2", "label"]
    assert float(err.split("error rate")[1].split(",")[0]) < 0.1


# --------------------------------------------------------------- the rule without --likelihood
def _table(values):
    return Table("d.csv", {"y": [str(v) for v in values]}, len(values), list(range(2, len(values) + 2)))


def _choose(values, levels=None, positive=None, exposure=None):
    args = SimpleNamespace(levels=levels, positive=positive, exposure=exposure)
    return choose_likelihood(_table(values), "y", args)


@pytest.mark.parametrize("values, expected, words", [
    (["a", "b", "c", "a"], "softmax", ["3 distinct text labels", "'a', 'b', 'c'", "softmax"]),
    (["yes", "no", "no"], "bernoulli", ["2 distinct text labels", "bernoulli"]),
    ([0, 1, 2, 1, 0], "softmax", ["3 distinct integer labels", "poisson for counts"]),
    ([0, 1, 1, 0], "bernoulli", ["2 distinct integer labels"]),
    (list(range(AUTO_INTEGER_CLASSES)), "softmax", [f"{AUTO_INTEGER_CLASSES} distinct integer labels"]),
    (list(range(AUTO_INTEGER_CLASSES + 1)), "gaussian", ["gaussian regression", "poisson for counts"]),
    ([0.5, 1.0, 1.5, 0.5], "gaussian", ["3 distinct values", "gaussian regression"]),
    ([1.0, 2.0, 1.0, 3.0], "softmax", ["3 distinct integer labels"]),
])
def test_likelihood_rule(values, expected, words):
    name, why = _choose(values)
    assert name == expected
    for w in words:
        assert w in why, (w, why)


def test_likelihood_rule_follows_levels_and_positive():
    assert _choose(["lo", "hi", "mid"], levels="lo,mid,hi")[0] == "ordinal"
    assert _choose(["a", "b"], positive="b")[0] == "bernoulli"


def test_likelihood_rule_refuses(capsys):
    with pytest.raises(UsageError, match="only one value 'a'.*nothing to learn"):
        _choose(["a", "a", "a"])
    with pytest.raises(UsageError, match=f"60 distinct labels.*more than the {MAX_CLASSES} classes"):
        _choose([f"c{k}" for k in range(60)])
    with pytest.raises(UsageError, match="--exposure needs --likelihood poisson or exponential"):
        _choose([1, 2, 3], exposure="t")


def test_continuous_target_without_likelihood_is_gaussian(tmp_path, capsys):
    x = np.linspace(-1, 1, 30)
    data = write_csv(tmp_path / "r.csv", ["x", "y"], [[repr(float(a)), repr(float(np.sin(3 * a) + 0.1 * a))] for a in x])
    rc, out, err = run(capsys, "fit", data, "-t", "y", "--model", "glm", "-o", tmp_path / "r.gpvi")
    assert rc == 0, err
    assert out.splitlines()[0] == ("gpvi fit: no --likelihood given: target 'y' holds numbers with 30 distinct "
                                   "values, so gaussian regression (give --likelihood poisson for counts, studentt "
                                   "or laplace for heavy tails)")
    assert "gaussian likelihood" in out and gpvi.io.load(tmp_path / "r.gpvi", with_extra=True)[1]["likelihood"] \
        == "gaussian"
    # --quiet: no line
    rc, out, err = run(capsys, "fit", data, "-t", "y", "--model", "glm", "-q", "-o", tmp_path / "r.gpvi")
    assert rc == 0 and out == "" and err == ""


# ------------------------------------------------------------------------------------ bad input
def test_bad_multiclass_input_is_one_line(iris, tmp_path, capsys):
    header, rows = read_csv(iris.train)
    one = write_csv(tmp_path / "one.csv", header, [r[:-1] + ["setosa"] for r in rows[:10]])
    rc, _, err = run(capsys, "fit", one, "-t", "species", "-l", "softmax")
    assert_bad_input(rc, err, "target column 'species' has only one label 'setosa'", "at least two classes")
    rc, _, err = run(capsys, "fit", one, "-t", "species")
    assert_bad_input(rc, err, "target column 'species' has only one value 'setosa'")
    many = write_csv(tmp_path / "many.csv", ["x", "y"], [[k, f"class{k}"] for k in range(MAX_CLASSES + 1)])
    for extra in ([], ["-l", "softmax"]):
        rc, _, err = run(capsys, "fit", many, "-t", "y", *extra)
        assert_bad_input(rc, err, f"{MAX_CLASSES + 1} distinct labels", f"more than the {MAX_CLASSES} classes")
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "-l", "softmax", "--engine", "laplace")
    assert_bad_input(rc, err, "--likelihood softmax", "--engine fpi or gradient, not laplace")
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "-l", "softmax", "--positive", "setosa")
    assert_bad_input(rc, err, "--levels and --positive do not apply to --likelihood softmax")
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "-l", "bernoulli")
    assert_bad_input(rc, err, "3 distinct labels", "use --likelihood softmax for several classes")
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "-l", "poisson")
    assert_bad_input(rc, err, "target column 'species' has non-numeric value", "softmax or ordinal")


def test_stream_refuses_softmax_and_a_missing_likelihood(iris, capsys):
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "-l", "softmax", "--stream")
    assert_bad_input(rc, err, "--stream does not support --likelihood softmax", "without --stream")
    rc, _, err = run(capsys, "fit", iris.train, "-t", "species", "--stream")
    assert_bad_input(rc, err, "--stream needs --likelihood")


@pytest.mark.slow
def test_damaged_softmax_model_files_are_refused(fitted, iris, tmp_path, capsys):
    fit, extra = gpvi.io.load(fitted.path, with_extra=True)
    for change, needle in (({"labels": ["setosa", "versicolor"]}, "3 distinct classes"),
                           ({"labels": ["a", "a", "b"]}, "3 distinct classes"),
                           ({"version": 1}, "version 2"),
                           ({"likelihood": "bernoulli"}, "3 latent functions")):
        bad = tmp_path / "bad.gpvi"
        gpvi.io.save(fit, bad, extra={**extra, **change})
        rc, _, err = run(capsys, "predict", bad, iris.test)
        assert_bad_input(rc, err, "bad.gpvi is a damaged gpvi model file", needle)
    newer = tmp_path / "newer.gpvi"
    gpvi.io.save(fit, newer, extra={**extra, "version": 3})
    rc, _, err = run(capsys, "predict", newer, iris.test)
    assert_bad_input(rc, err, "written by a newer gpvi")


def test_help_describes_the_choice(capsys):
    rc, out, _ = run(capsys, "fit", "--help")
    assert rc == 0
    text = " ".join(out.split())
    assert "softmax" in text and "Without --likelihood it is chosen from the target" in text
    assert f"at most {AUTO_INTEGER_CLASSES} distinct values" in text


@pytest.mark.slow
def test_same_model_and_vlb_as_the_estimator(fitted, iris):
    """One policy (gpvi.fitting.defaults): the CLI's softmax fit is GPClassifier's on the same rows."""
    from gpvi.sklearn.estimators import GPClassifier

    est = GPClassifier(max_rounds=4).fit(iris.X[:60], np.asarray(iris.names)[iris.codes[:60]])
    assert est.classes_.tolist() == fitted.extra["labels"]
    np.testing.assert_allclose(est.fit_result_.vlb, fitted.fit.vlb, rtol=1e-10)
