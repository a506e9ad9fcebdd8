"""gpvi fit --stream (Parquet row groups / CSV blocks) and its model files in gpvi predict."""
import numpy as np
import pytest

from gpvi.cli import main


@pytest.fixture
def files(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    N = 800
    X = rng.normal(size=(N, 2))
    lab = (rng.random(N) < 1 / (1 + np.exp(-3 * np.sin(X[:, 0])))).astype(int)
    cnt = rng.poisson(np.exp(0.5 * X[:, 1]))
    cols = {"a": X[:, 0], "b": X[:, 1], "lab": lab, "cnt": cnt}
    pq.write_table(pa.table(cols), tmp_path / "d.parquet", row_group_size=200)
    with open(tmp_path / "d.csv", "w") as f:
        f.write("a,b,lab,cnt\n")
        for i in range(N):
            f.write(f"{float(X[i, 0])!r},{float(X[i, 1])!r},{lab[i]},{cnt[i]}\n")
    return tmp_path


@pytest.mark.slow
def test_fit_stream_then_predict(files, capsys):
    out = files / "m.gpvi"
    rc = main(["fit", str(files / "d.parquet"), "-t", "lab", "-l", "bernoulli", "--drop", "cnt", "--stream",
               "--batch-size", "100", "--epochs", "4", "-M", "10", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "epoch 4/4" in cap.err and "rows/s" in cap.err and "row groups" in cap.out
    rc = main(["predict", str(out), str(files / "d.csv"), "-o", str(files / "p.csv")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    err = float(cap.err.split("error rate")[1].split(",")[0]) if "error rate" in cap.err else \
        float(cap.out.split("error rate")[1].split(",")[0])
    assert err < 0.3  # the labels follow sin(a) with slope 3: a fitted model is right ~80 % of the time
    rc = main(["fit", str(files / "d.csv"), "-t", "cnt", "-l", "poisson", "--drop", "lab", "--stream", "-e", "svi",
               "--batch-size", "200", "-M", "8", "-q", "-o", str(files / "c.gpvi")])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("extra, match", [
    (["--batch-size", "0"], "--batch-size"), (["--batch-size", "801"], "--batch-size"),
    (["-e", "fpi"], "sfp or svi"), (["--epochs", "0"], "--epochs"), (["-m", "full"], "sparse or glm"),
    (["--init-rows", "0"], "--init-rows must be a positive number"),
])
def test_fit_stream_bad_options(files, capsys, extra, match):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one error line, no NumPy warnings before it (--init-rows 0 gave one)
        rc = main(["fit", str(files / "d.parquet"), "-t", "lab", "-l", "bernoulli", "--stream", "-M", "5",
                   "-o", str(files / "x.gpvi")] + extra)
    err = capsys.readouterr().err
    assert rc == 2 and match in err and len(err.strip().splitlines()) == 1, err
