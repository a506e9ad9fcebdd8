"""Model files written by an earlier gpvi keep loading and predict bit for bit.

The files under ``tests/fixtures/models`` were written by ``tests/fixtures/make_model_files.py``
with the gpvi of the commit that added them (before the package was reorganised into layers),
together with the predictions that gpvi made from them.  Nothing here regenerates them.
"""
from pathlib import Path

import numpy as np
import pytest

import gpvi
import gpvi.cli

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "models"
NAMES = sorted(p.stem for p in HERE.glob("*.npz"))


def test_fixtures_are_present():
    assert len(NAMES) >= 11, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_old_model_file_predicts_bit_for_bit(name):
    stored = np.load(HERE / f"{name}.npz")
    obj = gpvi.io.load(HERE / f"{name}.gpvi")
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
    assert set(got) == set(stored.files) - {"X"}
    for key, value in got.items():
        np.testing.assert_array_equal(np.asarray(value), stored[key], err_msg=f"{name}: {key}")


def test_old_command_line_model_predicts_the_same_file(tmp_path):
    out = tmp_path / "pred.csv"
    code = gpvi.cli.main(["predict", "-q", str(HERE / "cli_bernoulli.gpvi"), str(HERE / "cli_data.csv"),
                          "--out", str(out)])
    assert code == 0
    assert out.read_text() == (HERE / "cli_bernoulli_predictions.csv").read_text()
