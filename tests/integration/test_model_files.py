"""Model files written by an earlier gpvi keep loading and predict what they predicted then.

The files under ``tests/fixtures/models`` were written by ``tests/fixtures/make_model_files.py``
with the gpvi of the commit that added them (before the package was reorganised into layers),
together with the predictions that gpvi made from them.  Nothing here regenerates them.

The predictions are made in a child process with the user's XLA flags: the suite compiles with
LLVM optimisation off (tests/conftest.py), which changes the last bits of some results.  They
are compared to rounding, not bit for bit: XLA:CPU generates code for the host's vector units,
so the same program on another CPU differs in the last bits.  On a 2-core AMD EPYC without
AVX-512 the largest differences from the stored files were 5e-13 relative (the regressor's mean)
and, in the command line's file, 4e-12 relative on a latent mean of 82 (2026-11-29).  RTOL is
far below what a changed meaning of a file would do (a jitter, a kernel parameter or a
likelihood setting read differently moves predictions by 1e-8 or more).
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from userenv import user_environment


HERE = Path(__file__).resolve().parents[1] / "fixtures" / "models"
RTOL = 1e-10  # relative to each array's largest stored magnitude (see the module's docstring)
NAMES = sorted(p.stem for p in HERE.glob("*.npz"))


def test_fixtures_are_present():
    assert len(NAMES) >= 11, NAMES


_PREDICT = r"""
import sys
from pathlib import Path
import numpy as np
import gpvi, gpvi.cli

here, out = Path(sys.argv[1]), Path(sys.argv[2])
for path in sorted(here.glob("*.npz")):
    stored = np.load(path)
    obj = gpvi.io.load(here / f"{path.stem}.gpvi")
    X = stored["X"]
    got = {}
    if isinstance(obj, gpvi.FitResult):
        got["f_mean"], got["f_var"] = obj.predict_f(X)
        if "y_mean" in stored:
            got["y_mean"], got["y_var"] = obj.predict_y(X)
    else:
        got["predict"] = obj.predict(X)
        if "proba" in stored:
            got["proba"] = obj.predict_proba(X)
        if "std" in stored:
            got["std"] = obj.predict(X, return_std=True)[1]
    np.savez(out / f"{path.stem}.npz", **{k: np.asarray(v) for k, v in got.items()})
code = gpvi.cli.main(["predict", "-q", str(here / "cli_bernoulli.gpvi"), str(here / "cli_data.csv"),
                      "--out", str(out / "cli_pred.csv")])
sys.exit(code)
"""


@pytest.fixture(scope="module")
def predictions(tmp_path_factory):
    """Every fixture's predictions, made by today's gpvi in a child process with the user's XLA
    flags and threading."""
    out = tmp_path_factory.mktemp("predictions")
    env = user_environment()
    run = subprocess.run([sys.executable, "-c", _PREDICT, str(HERE), str(out)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_old_model_file_predicts_the_same_to_rounding(name, predictions):
    stored = np.load(HERE / f"{name}.npz")
    got = np.load(predictions / f"{name}.npz")
    assert set(got.files) == set(stored.files) - {"X"}
    for key in got.files:
        assert_same_to_rounding(got[key], stored[key], f"{name}: {key}")


def assert_same_to_rounding(got, stored, what):
    """Equal shapes and kinds; class labels (integers) exactly; numbers within RTOL of the
    array's largest magnitude."""
    assert got.shape == stored.shape and got.dtype.kind == stored.dtype.kind, what
    if stored.dtype.kind in "iub":
        np.testing.assert_array_equal(got, stored, err_msg=what)
    else:
        np.testing.assert_allclose(got, stored, rtol=0, atol=RTOL * np.max(np.abs(stored), initial=1e-300),
                                   err_msg=what)


def read_csv(path):
    header, *lines = path.read_text().splitlines()
    return header, np.array([[float(v) for v in line.split(",")] for line in lines])


@pytest.mark.slow
def test_old_command_line_model_predicts_the_same_file(predictions):
    header, got = read_csv(predictions / "cli_pred.csv")
    stored_header, stored = read_csv(HERE / "cli_bernoulli_predictions.csv")
    assert header == stored_header and header.endswith(",label")
    assert_same_to_rounding(got[:, -1].astype(int), stored[:, -1].astype(int), "label")
    for j, name in enumerate(header.split(",")[:-1]):
        assert_same_to_rounding(got[:, j], stored[:, j], name)


def test_a_prediction_moved_beyond_rounding_is_caught():
    """The comparison fails where a file's meaning changed: a shift of 1e-8 relative."""
    stored = np.load(HERE / "gp_gaussian.npz")["f_mean"]
    assert_same_to_rounding(stored * (1 + 1e-13), stored, "rounding")
    with pytest.raises(AssertionError):
        assert_same_to_rounding(stored * (1 + 1e-8), stored, "moved")
