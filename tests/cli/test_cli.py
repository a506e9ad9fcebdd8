"""The `gpvi` command line: fit → predict on CSV/Parquet files, the demo, and every bad-input case
(exit code 2, one line on stderr naming the problem, no traceback)."""
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import gpvi
from gpvi.cli import main
from clitools import assert_bad_input, read_csv, run, write_csv  # noqa: E402


# --------------------------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def breast_csv(tmp_path_factory):
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    names = [n.replace(" ", "_") for n in d.feature_names]
    rows = [[repr(float(v)) for v in x] + [d.target_names[t]] for x, t in zip(d.data, d.target)]
    path = tmp_path_factory.mktemp("bc") / "breast_cancer.csv"
    return write_csv(path, names + ["diagnosis"], rows), names, np.asarray(d.target_names)[d.target]


@pytest.fixture(scope="module")
def breast_model(breast_csv):
    path, _, _ = breast_csv
    out = path.with_suffix(".gpvi")
    assert main(["fit", str(path), "-t", "diagnosis", "-l", "bernoulli", "-M", "10", "--max-rounds", "6",
                 "-q", "-o", str(out)]) == 0
    assert out.exists()
    return out


@pytest.fixture(scope="module")
def poisson_csv(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (250, 2))
    rate = np.exp(0.8 + np.sin(1.5 * X[:, 0]) + 0.4 * X[:, 1])
    y = rng.poisson(rate)
    path = tmp_path_factory.mktemp("pois") / "counts.csv"
    rows = [[f"{a:.6f}", f"{b:.6f}", int(c), f"{r:.6f}"] for (a, b), c, r in zip(X, y, rate)]
    return write_csv(path, ["x1", "x2", "count", "truth"], rows)


# ------------------------------------------------------------------------- fit → predict runs
@pytest.mark.slow
def test_breast_cancer_fit_then_predict(breast_csv, tmp_path, capsys):
    path, _, labels = breast_csv
    model = tmp_path / "bc.gpvi"
    rc, out, err = run(capsys, "fit", path, "--target", "diagnosis", "--likelihood", "bernoulli",
                       "--inducing", "10", "--max-rounds", "6", "--out", model)
    assert rc == 0, err
    for word in ("iterations", "VLB", "time", "hyperparameters", "kernel.lengthscale", "benign = 0",
                 "malignant = 1", f"wrote model to {model}"):
        assert word in out
    assert model.exists()
    assert err == ""  # no progress display when stderr is not a terminal

    pred = tmp_path / "pred.csv"
    rc, out, err = run(capsys, "predict", model, path, "--out", pred)
    assert rc == 0, err
    assert "error rate" in err and "569 predictions" in err
    header, rows = read_csv(pred)
    assert header == ["mean", "variance", "latent_mean", "latent_variance", "p_benign", "p_malignant", "label"]
    assert len(rows) == 569
    num = np.array([[float(v) for v in r[:6]] for r in rows])
    p = num[:, 4:6]
    assert np.all((p >= 0) & (p <= 1))
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-9)
    np.testing.assert_allclose(num[:, 0], p[:, 1])  # mean = P(positive class)
    assert np.all(num[:, 1] >= 0) and np.all(num[:, 3] > 0)
    predicted = np.array([r[6] for r in rows])
    assert set(predicted) <= {"benign", "malignant"}
    accuracy = np.mean(predicted == labels)
    assert accuracy > 0.9  # chance (majority class) is 0.63


@pytest.mark.slow
def test_poisson_fit_then_predict(poisson_csv, tmp_path, capsys):
    rc, out, err = run(capsys, "fit", poisson_csv, "-t", "count", "-l", "poisson", "--drop", "truth", "-M", "15",
                       "--max-rounds", "10")
    assert rc == 0, err
    model = poisson_csv.with_suffix(".gpvi")  # default: next to the data
    assert model.exists() and "2 feature(s)" in out
    rc, out, err = run(capsys, "predict", model, poisson_csv, "--keep", "truth")  # CSV to stdout
    assert rc == 0, err
    rows = list(csv.reader(out.splitlines()))
    assert rows[0] == ["truth", "mean", "variance", "latent_mean", "latent_variance"]
    arr = np.array(rows[1:], dtype=float)
    truth, mean, var = arr[:, 0], arr[:, 1], arr[:, 2]
    assert arr.shape[0] == 250
    assert np.all(mean > 0) and np.all(var >= mean)  # Poisson mixture: variance ≥ mean
    assert np.corrcoef(mean, truth)[0, 1] > 0.9
    np.testing.assert_allclose(mean, np.exp(arr[:, 3] + arr[:, 4] / 2), rtol=1e-10)
    assert "MAE" in err and "NLPD" in err


@pytest.mark.slow  # end-to-end, > 5 s; runs in CI's full suite
def test_ordinal_text_labels_with_levels(tmp_path, capsys):
    rng = np.random.default_rng(5)
    x = rng.uniform(-3, 3, 90)
    lev = np.digitize(x + 0.3 * rng.normal(size=x.size), [-1.0, 1.0])
    names = np.array(["low", "mid", "high"])[lev]
    path = write_csv(tmp_path / "ord.csv", ["x", "grade"], [[f"{a:.5f}", n] for a, n in zip(x, names)])
    rc, _, err = run(capsys, "fit", path, "-t", "grade", "-l", "ordinal", "-M", "8", "--max-rounds", "5", "-q")
    assert_bad_input(rc, err, "grade", "--levels")  # text labels need their order
    rc, out, err = run(capsys, "fit", path, "-t", "grade", "-l", "ordinal", "--levels", "low,mid,high",
                       "-M", "6", "--max-rounds", "4")
    assert rc == 0, err
    assert "likelihood.edges" in out and "low = 0, mid = 1, high = 2" in out
    pred = tmp_path / "ord_pred.csv"
    rc, _, err = run(capsys, "predict", path.with_suffix(".gpvi"), path, "-o", pred)
    assert rc == 0, err
    header, rows = read_csv(pred)
    assert header == ["mean", "variance", "latent_mean", "latent_variance", "p_low", "p_mid", "p_high", "label"]
    p = np.array([[float(v) for v in r[4:7]] for r in rows])
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-8)
    assert np.mean(np.array([r[7] for r in rows]) == names) > 0.7


@pytest.mark.slow
def test_gaussian_target_is_standardised_and_restored(tmp_path, capsys):
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 6, 150)
    y = 1000.0 + 50.0 * np.sin(x) + rng.normal(0, 5.0, x.size)
    path = write_csv(tmp_path / "reg.csv", ["x", "y"], [[a, b] for a, b in zip(x, y)])
    rc, out, err = run(capsys, "fit", path, "-t", "y", "-l", "gaussian", "-M", "12", "-q")
    assert rc == 0 and out == "", err
    rc, out, err = run(capsys, "predict", path.with_suffix(".gpvi"), path, "-q")
    assert rc == 0 and err == ""
    arr = np.array(list(csv.reader(out.splitlines()))[1:], dtype=float)
    assert np.mean(np.abs(arr[:, 0] - y)) < 8.0  # in the original units
    assert np.all(arr[:, 1] > arr[:, 3])  # predictive variance = latent + noise
    np.testing.assert_allclose(arr[:, 0], arr[:, 2])  # identity link


@pytest.mark.slow  # end-to-end, > 5 s; runs in CI's full suite
def test_model_auto_glm_and_numeric_labels(tmp_path, capsys):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 3))
    y = (X @ [1.5, -1.0, 0.5] + 0.3 * rng.normal(size=200) > 0).astype(int) * 2 - 1  # labels -1/+1
    path = write_csv(tmp_path / "lin.csv", ["a", "b", "c", "y"], [[*r, t] for r, t in zip(X, y)])
    rc, out, err = run(capsys, "fit", path, "-t", "y", "-l", "probit", "--model", "auto", "--no-learn")
    assert rc == 0, err
    assert "full GP" in out and "-1 = 0, 1 = 1" in out
    rc, out, err = run(capsys, "fit", path, "-t", "y", "-l", "bernoulli", "--model", "glm", "-o", tmp_path / "g.gpvi")
    assert rc == 0, err
    assert "Bayesian GLM" in out and "prior_variance" in out
    rc, out, err = run(capsys, "predict", tmp_path / "g.gpvi", path)
    rows = list(csv.reader(out.splitlines()))
    assert rows[0][-3:] == ["p_-1", "p_1", "label"]
    assert np.mean(np.array([r[-1] for r in rows[1:]]) == y.astype(str)) > 0.85


@pytest.mark.slow
def test_parquet_in_and_out(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, 80)
    counts = rng.poisson(np.exp(1 + x))
    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": x, "n": counts, "site": [f"s{i}" for i in range(80)]}), data)
    rc, _, err = run(capsys, "fit", data, "-t", "n", "-l", "poisson", "-m", "glm", "--drop", "site", "-q")
    assert rc == 0, err
    out = tmp_path / "p.parquet"
    rc, _, err = run(capsys, "predict", data.with_suffix(".gpvi"), data, "--keep", "site", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.column_names == ["site", "mean", "variance", "latent_mean", "latent_variance"]
    assert t.num_rows == 80 and np.all(t.column("mean").to_numpy() > 0)


def test_exposure_column(tmp_path, capsys):
    rng = np.random.default_rng(8)
    x = rng.uniform(0, 1, 120)
    expo = rng.choice([1.0, 10.0], 120)
    n = rng.poisson(expo * np.exp(x))
    path = write_csv(tmp_path / "e.csv", ["x", "years", "n"], [[a, e, c] for a, e, c in zip(x, expo, n)])
    rc, _, err = run(capsys, "fit", path, "-t", "n", "-l", "poisson", "-m", "glm", "--exposure", "years", "-q")
    assert rc == 0, err
    rc, out, err = run(capsys, "predict", path.with_suffix(".gpvi"), path, "-q")
    mean = np.array([float(r[0]) for r in list(csv.reader(out.splitlines()))[1:]])
    ratio = mean / np.exp(x)
    assert np.all(np.abs(ratio[expo == 10] / 10 - 1) < 0.35) and np.all(np.abs(ratio[expo == 1] - 1) < 0.35)
    nox = write_csv(tmp_path / "nox.csv", ["x"], [[a] for a in x])
    rc, _, err = run(capsys, "predict", path.with_suffix(".gpvi"), nox)
    assert_bad_input(rc, err, "exposure column 'years'", "not found in")
    zero = write_csv(tmp_path / "zero.csv", ["x", "years", "n"], [[0.5, 0, 1]])
    rc, _, err = run(capsys, "fit", zero, "-t", "n", "-l", "poisson", "--exposure", "years")
    assert_bad_input(rc, err, "exposure column 'years'", "non-positive value 0")


def test_missing_optional_dependencies_name_the_extra(tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow → ImportError
    rc, _, err = run(capsys, "fit", data, "-t", "n", "-l", "poisson")
    assert_bad_input(rc, err, "pyarrow", 'pip install "gpvi[parquet]"')
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run(capsys, "demo", "--out-dir", tmp_path)
    assert_bad_input(rc, err, "matplotlib", 'pip install "gpvi[plot]"', "--no-plot")


def test_progress_only_on_a_terminal_and_not_quiet(poisson_csv, tmp_path, capsys, monkeypatch):
    seen = []
    real_fit = gpvi.fit

    def spy(*a, progress=False, **k):
        seen.append(progress)
        return real_fit(*a, progress=False, **k)

    monkeypatch.setattr(gpvi, "fit", spy)
    args = ["fit", poisson_csv, "-t", "count", "-l", "poisson", "--drop", "truth", "-m", "glm", "-o",
            tmp_path / "m.gpvi"]
    assert run(capsys, *args)[0] == 0
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert run(capsys, *args)[0] == 0
    assert run(capsys, *args, "--quiet")[0] == 0
    assert seen == [False, True, False]


@pytest.mark.slow  # end-to-end, > 5 s; runs in CI's full suite
def test_demo_prints_table_and_writes_plot(tmp_path, capsys):
    rc, out, err = run(capsys, "demo", "--out-dir", tmp_path)
    assert rc == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("engine"))
    for col in ("rounds", "VLB", "test MAE", "test NLPD", "seconds"):
        assert col in header
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["fpi"], ["gradient"])}
    assert set(rows) == {"fpi", "gradient"}
    vlb = {k: float(v[3]) for k, v in rows.items()}
    assert abs(vlb["fpi"] - vlb["gradient"]) < 1e-3  # same bound, same optimum
    assert all(float(v[4]) < 1.3 for v in rows.values())  # better than the constant rate (MAE ≈ 1.39)
    assert "compilation" in out
    png = tmp_path / "gpvi-demo.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


# ------------------------------------------------------------------------------- bad input
def test_bad_input_fit(breast_csv, poisson_csv, tmp_path, capsys):
    path, _, _ = breast_csv
    fit = ["fit", "-M", "5", "--max-rounds", "2"]
    cases = []
    # missing target column
    cases.append(([*fit, path, "-t", "Diagnosis", "-l", "bernoulli"], ["target column 'Diagnosis' not found",
                                                                     "did you mean 'diagnosis'"]))
    # non-numeric and empty feature values
    bad = write_csv(tmp_path / "nonnum.csv", ["a", "b", "y"], [["1", "2", "0"], ["3", "abc", "1"], ["2", "1", "1"]])
    cases.append(([*fit, bad, "-t", "y", "-l", "bernoulli"], ["column 'b'", "non-numeric value 'abc'", "line 3"]))
    empty = write_csv(tmp_path / "empty_cell.csv", ["a", "y"], [["1", "0"], ["", "1"], ["2", "1"]])
    cases.append(([*fit, empty, "-t", "y", "-l", "bernoulli"], ["missing value in feature column 'a' on line 3"]))
    nan = write_csv(tmp_path / "nan.csv", ["a", "y"], [["1", "0"], ["nan", "1"], ["2", "1"]])
    cases.append(([*fit, nan, "-t", "y", "-l", "bernoulli"], ["missing value 'nan' in feature column 'a' on line 3"]))
    # labels outside the support
    three = write_csv(tmp_path / "three.csv", ["a", "y"], [["1", "x"], ["2", "y"], ["3", "z"], ["4", "x"]])
    cases.append(([*fit, three, "-t", "y", "-l", "bernoulli"], ["target column 'y'", "3 distinct labels", "exactly 2"]))
    one = write_csv(tmp_path / "one.csv", ["a", "y"], [["1", "x"], ["2", "x"]])
    cases.append(([*fit, one, "-t", "y", "-l", "probit"], ["target column 'y'", "only one label 'x'"]))
    neg = write_csv(tmp_path / "neg.csv", ["a", "n"], [["1", "2"], ["2", "-1"], ["3", "0"]])
    cases.append(([*fit, neg, "-t", "n", "-l", "poisson"], ["target column 'n'", "[-1.0]", "Poisson support"]))
    frac = write_csv(tmp_path / "frac.csv", ["a", "n"], [["1", "2"], ["2", "1.5"], ["3", "0"]])
    cases.append(([*fit, frac, "-t", "n", "-l", "poisson"], ["target column 'n'", "[1.5]", "Poisson support"]))
    word = write_csv(tmp_path / "word.csv", ["a", "n"], [["1", "2"], ["2", "many"]])
    cases.append(([*fit, word, "-t", "n", "-l", "poisson"], ["target column 'n'", "non-numeric value 'many'"]))
    ordl = write_csv(tmp_path / "ordl.csv", ["a", "g"], [["1", "lo"], ["2", "hi"], ["3", "huge"]])
    cases.append(([*fit, ordl, "-t", "g", "-l", "ordinal", "--levels", "lo,hi"], ["target column 'g'", "'huge'",
                                                                                 "--levels"]))
    # missing or malformed files
    cases.append(([*fit, tmp_path / "nope.csv", "-t", "y", "-l", "poisson"], ["nope.csv: no such file"]))
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b,y\n1,2,0\n3,1\n")
    cases.append(([*fit, ragged, "-t", "y", "-l", "bernoulli"], ["ragged.csv line 3", "2 fields", "3 columns"]))
    blank = tmp_path / "blank.csv"
    blank.write_text("")
    cases.append(([*fit, blank, "-t", "y", "-l", "poisson"], ["blank.csv is empty"]))
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    cases.append(([*fit, binary, "-t", "y", "-l", "poisson"], ["binary.csv is not a UTF-8 text CSV file"]))
    # options that do not fit together / bad output path
    cases.append(([*fit, poisson_csv, "-t", "count", "-l", "poisson", "-m", "full"], ["--inducing", "sparse"]))
    cases.append(([*fit, poisson_csv, "-t", "count", "-l", "poisson", "--features", "x1,x3"],
                  ["feature column 'x3' not found"]))
    cases.append(([*fit, poisson_csv, "-t", "count", "-l", "poisson", "-o", tmp_path / "no" / "m.gpvi"],
                  ["folder", "does not exist"]))
    cases.append(([*fit, poisson_csv, "-t", "count", "-l", "poisson", "-M", "100000"],
                  ["inducing", "M = 100000"]))
    for argv, needles in cases:
        rc, _, err = run(capsys, *argv)
        assert_bad_input(rc, err, *needles)


@pytest.mark.slow
def test_bad_input_predict(breast_csv, breast_model, tmp_path, capsys):
    path, _, _ = breast_csv
    header, rows = read_csv(path)
    # a feature column missing at predict time
    drop = header.index("mean_texture")
    missing = write_csv(tmp_path / "missing.csv", header[:drop] + header[drop + 1:],
                        [r[:drop] + r[drop + 1:] for r in rows[:5]])
    rc, _, err = run(capsys, "predict", breast_model, missing)
    assert_bad_input(rc, err, "feature column", "'mean_texture'", "not found in", "missing.csv")
    # non-numeric feature value at predict time
    bad_rows = [list(r) for r in rows[:4]]
    bad_rows[2][0] = "twelve"
    nonnum = write_csv(tmp_path / "nonnum.csv", header, bad_rows)
    rc, _, err = run(capsys, "predict", breast_model, nonnum)
    assert_bad_input(rc, err, "'mean_radius'", "non-numeric value 'twelve'", "line 4")
    # missing and corrupt model files
    rc, _, err = run(capsys, "predict", tmp_path / "none.gpvi", path)
    assert_bad_input(rc, err, "none.gpvi: no such file")
    corrupt = tmp_path / "corrupt.gpvi"
    corrupt.write_bytes(breast_model.read_bytes()[:300])
    rc, _, err = run(capsys, "predict", corrupt, path)
    assert_bad_input(rc, err, "corrupt.gpvi", "not a readable gpvi model file")
    text = tmp_path / "text.gpvi"
    text.write_text("hello")
    rc, _, err = run(capsys, "predict", text, path)
    assert_bad_input(rc, err, "text.gpvi", "not a readable gpvi model file")
    # a valid model file without the command line's column metadata
    X = np.linspace(0, 1, 20)[:, None]
    plain = gpvi.fit(gpvi.GLM(likelihood=gpvi.likelihoods.Poisson()), X, np.arange(20) % 3)
    gpvi.io.save(plain, tmp_path / "plain.gpvi")
    rc, _, err = run(capsys, "predict", tmp_path / "plain.gpvi", path)
    assert_bad_input(rc, err, "not written by `gpvi fit`")
    # data file missing
    rc, _, err = run(capsys, "predict", breast_model, tmp_path / "absent.csv")
    assert_bad_input(rc, err, "absent.csv: no such file")


def test_usage_errors_exit_2(capsys):
    rc, out, err = run(capsys, "fit", "x.csv", "-t", "y", "-l", "poissson")
    assert_bad_input(rc, err, "unknown likelihood 'poissson'", "did you mean 'poisson'")
    rc, out, err = run(capsys, "fit", "x.csv", "-l", "poisson")
    assert_bad_input(rc, err, "--target")
    rc, out, err = run(capsys)
    assert_bad_input(rc, err, "COMMAND")
    rc, out, err = run(capsys, "--help")
    assert rc == 0 and "fit" in out and "predict" in out and "demo" in out


@pytest.mark.slow
def test_installed_script(tmp_path):
    """The console script `gpvi` is installed and reports bad input as one line, exit code 2."""
    exe = shutil.which("gpvi", path=str(Path(sys.executable).parent)) or shutil.which("gpvi")
    assert exe, "the `gpvi` command is not installed: pip install -e ."
    proc = subprocess.run([exe, "predict", str(tmp_path / "m.gpvi"), str(tmp_path / "d.csv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"gpvi: error: {tmp_path / 'm.gpvi'}: no such file"


# ------------------------------------------------------------------- gpvi.io extra metadata
def test_io_extra_metadata_round_trip(tmp_path):
    X = np.linspace(0, 1, 10)[:, None]
    fit = gpvi.fit(gpvi.GLM(likelihood=gpvi.likelihoods.Gaussian()), X, X[:, 0])
    extra = {"features": ["a"], "x_mean": [0.5], "labels": None}
    gpvi.io.save(fit, tmp_path / "m.gpvi", extra=extra)
    obj, got = gpvi.io.load(tmp_path / "m.gpvi", with_extra=True)
    assert got == extra and isinstance(obj, gpvi.FitResult)
    assert isinstance(gpvi.io.load(tmp_path / "m.gpvi"), gpvi.FitResult)  # default: the object only
    gpvi.io.save(fit, tmp_path / "n.gpvi")
    assert gpvi.io.load(tmp_path / "n.gpvi", with_extra=True)[1] == {}
    with pytest.raises(ValueError, match="JSON"):
        gpvi.io.save(fit, tmp_path / "o.gpvi", extra={"bad": object()})
    with pytest.raises(ValueError, match="JSON"):
        gpvi.io.save(fit, tmp_path / "o.gpvi", extra={"nan": float("nan")})


# ------------------------------------------------------- issue 14: outputs, missing values, choices
@pytest.fixture(scope="module")
def glm_model(poisson_csv):
    """A quick model file written by `gpvi fit` (Poisson GLM, no hyperparameters learned)."""
    out = poisson_csv.parent / "glm.gpvi"
    assert main(["fit", str(poisson_csv), "-t", "count", "-l", "poisson", "-m", "glm", "--drop", "truth",
                 "--no-learn", "-q", "-o", str(out)]) == 0
    return out


def _no_fit(monkeypatch):
    """Make gpvi.fit fail loudly: the checks under test must come before any fitting."""
    def boom(*args, **kwargs):
        raise AssertionError("gpvi.fit was called: the output path was not checked before fitting")
    monkeypatch.setattr(gpvi, "fit", boom)


def test_output_that_is_an_input_is_refused(poisson_csv, glm_model, tmp_path, capsys, monkeypatch):
    """Issue 14 B5: `fit d.csv -o d.csv` and `predict m.gpvi d.csv -o m.gpvi` destroyed their input."""
    _no_fit(monkeypatch)
    data = tmp_path / "d.csv"
    data.write_bytes(poisson_csv.read_bytes())
    model = tmp_path / "m.gpvi"
    model.write_bytes(glm_model.read_bytes())
    (tmp_path / "link.csv").symlink_to(data)
    (tmp_path / "link.gpvi").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    before = {p: p.read_bytes() for p in (data, model)}
    fit = ["fit", "-t", "count", "-l", "poisson", "--drop", "truth"]
    for src, out in [(data, data), ("d.csv", "./d.csv"), (data, tmp_path / "link.csv"), ("link.csv", "d.csv")]:
        rc, _, err = run(capsys, *fit[:1], src, *fit[1:], "-o", out)
        assert_bad_input(rc, err, "the model file", "is the data file", "choose another --out")
    # the default output (DATA with suffix .gpvi) of a data file named *.gpvi is the data itself
    rc, _, err = run(capsys, "fit", model, "-t", "count", "-l", "poisson")
    assert_bad_input(rc, err, "is the data file")
    for out, what in [(model, "is the model file"), ("./m.gpvi", "is the model file"),
                      ("link.gpvi", "is the model file"), (data, "is the data file"), ("link.csv", "is the data file")]:
        rc, _, err = run(capsys, "predict", "m.gpvi", "d.csv", "-o", out)
        assert_bad_input(rc, err, "the output file", what)
    for p, content in before.items():
        assert p.read_bytes() == content
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "link.gpvi").is_symlink()


def test_predict_out_is_written_atomically(poisson_csv, glm_model, tmp_path, capsys, monkeypatch):
    """Issue 14 B4: `gpvi predict --out` truncated the previous file before writing; a failed write
    (here a full disk after 100 cells) destroyed it."""
    import gpvi.cli.predict as cli

    out = tmp_path / "pred.csv"
    out.write_text("previous predictions\n")
    real = cli._format_cell
    calls = []

    def failing(v):
        calls.append(1)
        if len(calls) > 100:
            raise OSError(28, "No space left on device")
        return real(v)

    monkeypatch.setattr(cli, "_format_cell", failing)
    rc, _, err = run(capsys, "predict", glm_model, poisson_csv, "-o", out)
    assert_bad_input(rc, err, "No space left on device")
    assert out.read_text() == "previous predictions\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.csv"]  # no temporary file left
    monkeypatch.setattr(cli, "_format_cell", real)
    # success: the file is replaced whole; through a symlink the target is written, the link kept
    (tmp_path / "link.csv").symlink_to(out)
    rc, _, err = run(capsys, "predict", glm_model, poisson_csv, "-o", tmp_path / "link.csv", "-q")
    assert rc == 0, err
    header, rows = read_csv(out)
    assert header == ["mean", "variance", "latent_mean", "latent_variance"] and len(rows) == 250
    assert (tmp_path / "link.csv").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "pred.csv"]


def test_predict_out_to_a_pipe_is_written_in_place(poisson_csv, glm_model, tmp_path, capsys):
    """A named pipe (like /dev/stdout) is written to, not replaced by a regular file."""
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    rc, _, err = run(capsys, "predict", glm_model, poisson_csv, "-o", fifo, "-q")
    reader.join(30)
    assert rc == 0, err
    assert got and got[0].startswith("mean,variance,") and got[0].count("\n") == 251
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _labels_csv(path, labels, bad_line=11, bad="", multiline=False):
    """A CSV whose target on line ``bad_line`` (header = line 1) is ``bad``; with ``multiline`` the
    bad row's text column spans two lines (the row still starts on ``bad_line``)."""
    rows = []
    for i in range(14):
        line = i + 2
        note = "first\nsecond" if (multiline and line == bad_line) else f"n{i}"
        rows.append([f"{0.3 * i:.2f}", note, bad if line == bad_line else labels[i % len(labels)]])
    return write_csv(path, ["x", "note", "y"], rows)


@pytest.mark.parametrize("lik, labels, bad", [
    ("bernoulli", ["yes", "no"], ""),
    ("bernoulli", ["yes", "no"], "NA"),
    ("probit", ["0", "1"], "nan"),
    ("ordinal", ["1", "2", "3"], "?"),
    ("poisson", ["0", "3", "1"], "NA"),
    ("poisson", ["0", "3", "1"], ""),
    ("gaussian", ["0.5", "1.5"], "NaN"),
])
def test_missing_target_value_is_reported_with_its_line(lik, labels, bad, tmp_path, capsys, monkeypatch):
    """Issue 14 §3: a missing target value is 'missing value in target column 'y' on line 11', not a
    third label (bernoulli said '3 distinct labels') nor a non-numeric value."""
    _no_fit(monkeypatch)
    path = _labels_csv(tmp_path / "d.csv", labels, bad=bad)
    rc, _, err = run(capsys, "fit", path, "-t", "y", "-l", lik, "--drop", "note")
    shown = f" {bad!r}" if bad else ""
    assert_bad_input(rc, err, f"missing value{shown} in target column 'y' on line 11 of {path}")


def test_missing_value_line_counts_lines_as_a_user_does(tmp_path, capsys, monkeypatch):
    """The line of a record whose quoted field spans two lines is the line where the record starts."""
    _no_fit(monkeypatch)
    path = _labels_csv(tmp_path / "d.csv", ["yes", "no"], bad_line=11, bad="NA", multiline=True)
    assert path.read_text().splitlines()[10] == "2.70,\"first"  # line 11 (1-based) starts the record
    rc, _, err = run(capsys, "fit", path, "-t", "y", "-l", "bernoulli", "--drop", "note")
    assert_bad_input(rc, err, "missing value 'NA' in target column 'y' on line 11 of")
    path = _labels_csv(tmp_path / "e.csv", ["yes", "no"], bad_line=7, bad="", multiline=True)
    rc, _, err = run(capsys, "fit", path, "-t", "y", "-l", "bernoulli", "--drop", "note")
    assert_bad_input(rc, err, "missing value in target column 'y' on line 7 of")


def test_unknown_choices_are_one_line_listing_them(capsys):
    """Issue 14 §3: an unknown --likelihood/--engine/--model printed argparse's usage (8 lines)."""
    rc, _, err = run(capsys, "fit", "d.csv", "-t", "y", "-l", "poissson")
    assert_bad_input(rc, err, "unknown likelihood 'poissson'", "did you mean 'poisson'",
                     "choose from gaussian, bernoulli, probit, poisson, ordinal, laplace, studentt, exponential")
    rc, _, err = run(capsys, "fit", "d.csv", "-t", "y", "-l", "poisson", "--engine", "newton")
    assert_bad_input(rc, err, "unknown engine 'newton'", "choose from " + ", ".join(gpvi.engines.names()))
    rc, _, err = run(capsys, "fit", "d.csv", "-t", "y", "-l", "poisson", "-m", "dense")
    assert_bad_input(rc, err, "unknown model 'dense'", "choose from sparse, full, glm, auto")
    rc, _, err = run(capsys, "fit", "d.csv", "-t", "y", "-l", "poisson", "--max-iter", "many")
    assert_bad_input(rc, err, "--max-iter", "'many'")
    rc, _, err = run(capsys, "predict", "m.gpvi")
    assert_bad_input(rc, err, "DATA")
    # names are case-insensitive: parsing succeeds and the missing file is what is reported
    rc, _, err = run(capsys, "fit", "absent.csv", "-t", "y", "-l", "Poisson", "-e", "FPI")
    assert_bad_input(rc, err, "absent.csv: no such file")


def _read_only_folder(tmp_path):
    """A folder this process cannot create files in, or None (root ignores permissions: then a
    read-only file system such as /sys is used where there is one)."""
    import os
    import tempfile

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for folder in (ro, Path("/sys")):
        try:
            fd, name = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(fd)
        os.unlink(name)
    return None


def test_unwritable_out_is_detected_before_fitting(poisson_csv, glm_model, tmp_path, capsys, monkeypatch):
    """Issue 14 §3: an --out that cannot be written (read-only folder, a folder, a file as folder,
    a missing folder) is one line and exit 2 before any fitting."""
    import os

    _no_fit(monkeypatch)
    fit = ["fit", poisson_csv, "-t", "count", "-l", "poisson"]
    cases = [(tmp_path / "no" / "m.gpvi", ["folder", "does not exist"]),
             (tmp_path, ["it is a folder"]),
             (poisson_csv / "m.gpvi", ["is not a folder"])]
    ro = _read_only_folder(tmp_path)
    if ro is not None:
        cases.append((ro / "m.gpvi", [f"folder {os.path.realpath(ro)} is not writable"]))
    for out, needles in cases:
        rc, _, err = run(capsys, *fit, "-o", out)
        assert_bad_input(rc, err, "cannot write the model file", *needles)
        rc, _, err = run(capsys, "predict", glm_model, poisson_csv, "-o", out)
        assert_bad_input(rc, err, "cannot write the predictions", *needles)
    if ro is None:
        pytest.skip("no read-only folder available to this user (root without a read-only file system)")


def _rewrite_meta(src, dst, change):
    """Copy model file ``src`` to ``dst`` with ``change(meta)`` applied to its meta.json."""
    import json

    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays.pop("meta.json")).decode())
    change(meta)
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays, **{"meta.json": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    return dst


def test_model_file_errors_are_one_line(poisson_csv, glm_model, tmp_path, capsys, monkeypatch):
    """Issue 14 B7 (CLI part): every error reading a model file is one line and exit 2 in `gpvi
    predict`, never a traceback (a crafted `"version": "2"` raised TypeError)."""
    crafted = _rewrite_meta(glm_model, tmp_path / "v2.gpvi", lambda m: m.update(version="2"))
    rc, _, err = run(capsys, "predict", crafted, poisson_csv)
    assert_bad_input(rc, err, "v2.gpvi")
    unknown = _rewrite_meta(glm_model, tmp_path / "cls.gpvi", lambda m: m["model"].update({"class": "Kernel"}))
    rc, _, err = run(capsys, "predict", unknown, poisson_csv)
    assert_bad_input(rc, err, "cls.gpvi")
    # whatever gpvi.io.load raises for a damaged file
    model = tmp_path / "m.gpvi"
    model.write_bytes(glm_model.read_bytes())
    for exc, needles in [(ValueError(f"{model} is a damaged gpvi model file: bad shape"), ["damaged", "bad shape"]),
                         (TypeError("'>' not supported between instances of 'str' and 'int'"), ["TypeError"]),
                         (RecursionError("maximum recursion depth exceeded while decoding a JSON array"),
                          ["RecursionError"]),
                         (MemoryError(), ["MemoryError"]),
                         (NotImplementedError(), ["NotImplementedError"]),
                         (PermissionError(13, "Permission denied", str(model)), ["m.gpvi: Permission denied"])]:
        def load(*args, _exc=exc, **kwargs):
            raise _exc
        monkeypatch.setattr(gpvi.io, "load", load)
        rc, _, err = run(capsys, "predict", model, poisson_csv)
        assert_bad_input(rc, err, *needles)
        if not isinstance(exc, (ValueError, OSError)):
            assert "m.gpvi is not a readable gpvi model file" in err


def test_no_advice_to_load_pickles(poisson_csv, glm_model, tmp_path, capsys, monkeypatch):
    """Issue 14 §3: NumPy's "you can load it unsafely using allow_pickle" reached the user for a
    pickled file given as a model."""
    import pickle

    pkl = tmp_path / "model.gpvi"
    pkl.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))
    npy = tmp_path / "objects.gpvi"
    with open(npy, "wb") as fh:
        np.save(fh, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    objects = tmp_path / "members.gpvi"
    with np.load(glm_model) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["fit.trace"] = np.array([{"a": 1}], dtype=object)
    with open(objects, "wb") as fh:
        np.savez(fh, **arrays)
    for bad in (pkl, npy, objects):
        rc, _, err = run(capsys, "predict", bad, poisson_csv)
        assert_bad_input(rc, err, bad.name)
        assert "allow_pickle" not in err and "unsafe" not in err and "pickle.load" not in err
    # the message NumPy gives, however it reaches the command line
    advice = ("This file contains pickled (object) data. If you trust the file you can load it unsafely "
              "using the `allow_pickle=` keyword argument or `pickle.load()`.")
    for raised in (ValueError(f"{pkl} is not a readable gpvi model file: {advice}"),
                   ValueError("Object arrays cannot be loaded when allow_pickle=False")):
        def load(*args, _exc=raised, **kwargs):
            raise _exc
        monkeypatch.setattr(gpvi.io, "load", load)
        rc, _, err = run(capsys, "predict", pkl, poisson_csv)
        assert_bad_input(rc, err, "gpvi never loads")
        assert "allow_pickle" not in err and "unsafe" not in err and "pickle.load" not in err
    monkeypatch.undo()
    _no_fit(monkeypatch)
    rc, _, err = run(capsys, "fit", npy, "-t", "y", "-l", "poisson")  # a data file that is a pickle
    assert_bad_input(rc, err, "objects.gpvi")
    assert "allow_pickle" not in err and "unsafe" not in err


def test_interrupt_in_process_returns_130(poisson_csv, tmp_path, capsys, monkeypatch):
    """Called in-process, an interrupt during the fit returns 130 after the one line (no exit)."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(gpvi, "fit", interrupted)
    out = tmp_path / "m.gpvi"
    rc, out_text, err = run(capsys, "fit", poisson_csv, "-t", "count", "-l", "poisson", "-o", out)
    assert rc == 130 and err == "gpvi: interrupted\n" and out_text == ""
    assert not out.exists()


def test_interrupt_as_a_command_ends_the_process_at_once(poisson_csv, tmp_path, capsys, monkeypatch):
    """Issue 21: as the `gpvi` command an interrupt ends the process with os._exit(130) after
    flushing, so no interpreter teardown runs while XLA threads (a compilation) are still live."""
    import gpvi.cli.app as cli

    def interrupted(*args, **kwargs):
        print("partial summary")  # buffered output must be flushed before the exit
        raise KeyboardInterrupt
    monkeypatch.setattr(gpvi, "fit", interrupted)
    exits, flushed = [], []

    class Exit(BaseException):
        pass

    def fake_exit(code):
        exits.append(code)
        raise Exit

    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    monkeypatch.setattr(cli, "_flush_std", lambda: flushed.append(True))
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Exit):
            main([str(a) for a in ("fit", poisson_csv, "-t", "count", "-l", "poisson", "-o", tmp_path / "m.gpvi")],
                 exit_on_interrupt=True)
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert exits == [130] and flushed == [True]
    assert capsys.readouterr().err == "gpvi: interrupted\n"


def _with_extra(model_file, extra, out):
    """A copy of ``model_file`` whose stored ``extra`` is replaced (written by hand: ``save``
    itself only stores valid JSON-able extras)."""
    with zipfile.ZipFile(model_file) as zin:
        members = {n: zin.read(n) for n in zin.namelist()}
    meta = json.loads(np.load(io.BytesIO(members["meta.json.npy"])).tobytes())
    meta["extra"] = extra
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    members["meta.json.npy"] = buf.getvalue()
    with zipfile.ZipFile(out, "w") as zout:
        for name, blob in members.items():
            zout.writestr(name, blob)
    return out


@pytest.mark.parametrize("field, value, needle", [
    ("version", "2", "version"),
    ("version", None, "version"),
    ("features", "x", "features"),
    ("x_scale", [0.0], "x_scale"),
    ("x_mean", ["a"], "x_mean"),
    ("intercept", "yes", "intercept"),
    ("likelihood", "gamma", "likelihood"),
    ("y_scale", -1.0, "y_scale"),
    ("labels", {"a": 1}, "labels"),
])
def test_predict_refuses_damaged_column_information(field, value, needle, poisson_csv, glm_model, tmp_path,
                                                    capsys):
    # The command line's own fields in a model file (issue 14 B7): a string version ended in a
    # TypeError traceback; a missing or mistyped field in a KeyError or a wrong prediction.
    _, extra = gpvi.io.load(glm_model, with_extra=True)
    if value is None:
        del extra[field]
    else:
        extra[field] = value * len(extra["features"]) if field in ("x_scale", "x_mean") else value
    bad = _with_extra(glm_model, extra, tmp_path / "bad.gpvi")
    rc, out, err = run(capsys, "predict", bad, poisson_csv)
    assert_bad_input(rc, err, str(bad), needle)
    # the control: the same hand-written file with the original fields predicts
    control = _with_extra(glm_model, gpvi.io.load(glm_model, with_extra=True)[1], tmp_path / "ok.gpvi")
    assert run(capsys, "predict", control, poisson_csv)[0] == 0


# ------------------------------------------------- issue 30 §2: huge values, the compilation cache
def _gpvi_exe():
    exe = shutil.which("gpvi", path=str(Path(sys.executable).parent)) or shutil.which("gpvi")
    assert exe, "the `gpvi` command is not installed: pip install -e ."
    return exe


# Runs the command given after it with no regular file allowed to grow beyond 0 bytes
# (RLIMIT_FSIZE; SIGXFSZ ignored, so a write fails with EFBIG instead of killing the process), the
# way a full disk makes writes fail.  A launcher rather than a preexec_fn: forking this process
# (JAX's threads running) to run Python code in the child can deadlock.
_NO_BIGGER_FILES = ("import os, resource, signal, sys\n"
                    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                    "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
                    "os.execv(sys.argv[1], sys.argv[1:])\n")


def _gpvi_command(*argv, env=None, no_bigger_files=False):
    """Run the installed `gpvi` command (what a user sees: Python's warnings included)."""
    cmd = [_gpvi_exe(), *(str(a) for a in argv)]
    if no_bigger_files:
        cmd = [sys.executable, "-c", _NO_BIGGER_FILES, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def assert_one_error_line(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpvi: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.slow
def test_huge_feature_values_are_refused_naming_the_column(glm_model, tmp_path):
    """A feature near 1e307 overflowed the standardisation: NumPy's RuntimeWarnings, then an error
    about X column 0 (or a model file that could not be written), instead of one line naming it."""
    rng = np.random.default_rng(5)
    rows = [[repr(float(v)), f"{b:.4f}", int(c)]
            for v, b, c in zip(rng.uniform(1, 9, 30) * 1e307, rng.normal(size=30), rng.integers(0, 5, 30))]
    data = write_csv(tmp_path / "huge.csv", ["x1", "x2", "count"], rows)
    proc = _gpvi_command("fit", data, "-t", "count", "-l", "poisson", "-m", "glm", "--no-learn", "-q",
                         "-o", tmp_path / "m.gpvi")
    assert_one_error_line(proc, "feature column 'x1'", "line 2", str(data), "1e+150", "rescale")
    assert not (tmp_path / "m.gpvi").exists()
    # predicting at such rows with a model fitted on ordinary ones: the same line
    proc = _gpvi_command("predict", glm_model, data)
    assert_one_error_line(proc, "feature column 'x1'", "line 2", "1e+150")
    # the streaming fit scales by the head of the file: the same check, naming the column
    proc = _gpvi_command("fit", data, "-t", "count", "-l", "poisson", "-m", "glm", "--stream", "-q",
                         "-o", tmp_path / "s.gpvi")
    assert_one_error_line(proc, "feature column 'x1'", "row 1", "1e+150")
    assert not (tmp_path / "s.gpvi").exists()
    # a target that is standardised (gaussian) is checked the same way; one huge value among
    # small ones made the scale infinite and the model file unwritable (JSON)
    ys = [f"{v:.3f}" for v in rng.normal(size=30)]
    ys[3] = "1e307"
    data = write_csv(tmp_path / "huge_y.csv", ["x", "y"], [[f"{i / 10:.1f}", v] for i, v in enumerate(ys)])
    proc = _gpvi_command("fit", data, "-t", "y", "-l", "gaussian", "-m", "glm", "--no-learn", "-q",
                         "-o", tmp_path / "m.gpvi")
    assert_one_error_line(proc, "target column 'y'", "line 5", "'1e307'")


@pytest.mark.slow
def test_failing_cache_writes_are_silent(poisson_csv, tmp_path):
    """A cache write that fails (here: a file-size limit; a full disk is the same) printed JAX's
    `UserWarning: Error writing persistent compilation cache entry` lines and left empty entries
    behind, which the next run failed to read (more warnings).  The fit itself must just work."""
    cache = tmp_path / "cache"
    env = {**os.environ, "GPVI_COMPILATION_CACHE": str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    fit = ("fit", poisson_csv, "-t", "count", "-l", "poisson", "-m", "glm", "--drop", "truth", "-q",
           "-o", "/dev/null")  # a device: not limited by RLIMIT_FSIZE
    proc = _gpvi_command(*fit, env=env, no_bigger_files=True)
    assert "Warning" not in proc.stderr and "Error writing" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert sorted(os.listdir(cache)) == []  # no empty (partial) entries left behind
    # the control: without the limit the same command does write entries (and reads none broken)
    proc = _gpvi_command(*fit, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert any(name.endswith("-cache") for name in os.listdir(cache))


def test_cache_info_and_clear(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    for key, size in (("jit_a-1", 3000), ("jit_b-2", 2000)):
        (cache / f"{key}-cache").write_bytes(b"x" * size)
    (cache / "notes.txt").write_text("not a compiled program")  # never touched
    monkeypatch.setenv("GPVI_COMPILATION_CACHE", str(cache))
    monkeypatch.setenv("GPVI_COMPILATION_CACHE_MAX_MB", "64")
    rc, out, err = run(capsys, "cache", "info")
    assert rc == 0 and err == "", err
    assert out.splitlines()[0] == f"gpvi cache: {cache}"
    assert "2 compiled program(s), 4.9 kB" in out and "limit 64.0 MB" in out
    assert run(capsys, "cache")[1] == out  # info is the default action
    rc, out, err = run(capsys, "cache", "clear")
    assert rc == 0 and err == "", err
    assert out == f"gpvi cache: removed 2 compiled program(s), 4.9 kB, from {cache}\n"
    assert sorted(os.listdir(cache)) == ["notes.txt"]
    assert "0 compiled program(s), 0 bytes" in run(capsys, "cache", "info")[1]
    rc, out, err = run(capsys, "cache", "clera")
    assert_bad_input(rc, err, "unknown cache action 'clera'", "did you mean 'clear'", "info, clear")
    rc, out, err = run(capsys, "--help")
    assert rc == 0 and "cache" in out


@pytest.mark.slow
def test_cache_size_limit_bad_value_is_one_error_line(tmp_path):
    env = {**os.environ, "GPVI_COMPILATION_CACHE": str(tmp_path / "cache"), "GPVI_COMPILATION_CACHE_MAX_MB": "1GB"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = _gpvi_command("cache", "info", env=env)
    assert_one_error_line(proc, "GPVI_COMPILATION_CACHE_MAX_MB", "'1GB'", "positive number")
