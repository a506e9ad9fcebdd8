"""The benchmark scripts run end to end (their --quick smoke versions) and write their outputs.

Timings are not asserted here (tests never time things); only that the scripts work and that
the properties that do not depend on machine load hold.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script, tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--outdir", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=600)
    name = script.removesuffix(".py")
    assert (tmp_path / f"{name}_quick.png").stat().st_size > 0
    return json.loads((tmp_path / f"{name}_quick.json").read_text())


@pytest.mark.slow
def test_engines_benchmark_quick(tmp_path):
    out = _run("engines.py", tmp_path)
    for lik, res in out["results"].items():
        fpi = res["median"]["fpi"]
        assert fpi["converged"] and fpi["reached_target"], lik
        assert fpi["iterations_to_target"] <= 15, lik


@pytest.mark.slow
def test_scale_benchmark_quick(tmp_path):
    out = _run("scale.py", tmp_path)
    assert all(run["converged"] for run in out["runs"])
    assert out["n_ratio"] == 10
