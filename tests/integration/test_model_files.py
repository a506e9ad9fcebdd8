"""Model files written by an earlier gpvi keep loading and predict bit for bit.

The files under ``tests/fixtures/models`` were written by ``tests/fixtures/make_model_files.py``
with the gpvi of the commit that added them (before the package was reorganised into layers),
together with the predictions that gpvi made from them.  Nothing here regenerates them.

The predictions are made in a child process with the user's XLA flags: the suite compiles with
LLVM optimisation off (tests/conftest.py), which changes the last bits of some results.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


HERE = Path(__file__).resolve().parents[1] / "fixtures" / "models"
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
    """Every fixture's predictions, made by today's gpvi in a child process with the user's XLA flags."""
    out = tmp_path_factory.mktemp("predictions")
    env = {**os.environ, "XLA_FLAGS": os.environ.get("GPVI_TEST_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))}
    run = subprocess.run([sys.executable, "-c", _PREDICT, str(HERE), str(out)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_old_model_file_predicts_bit_for_bit(name, predictions):
    stored = np.load(HERE / f"{name}.npz")
    got = np.load(predictions / f"{name}.npz")
    assert set(got.files) == set(stored.files) - {"X"}
    for key in got.files:
        np.testing.assert_array_equal(got[key], stored[key], err_msg=f"{name}: {key}")


def test_old_command_line_model_predicts_the_same_file(predictions):
    assert (predictions / "cli_pred.csv").read_text() == (HERE / "cli_bernoulli_predictions.csv").read_text()
