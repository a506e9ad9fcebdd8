"""Every benchmark script imports: its top-level imports (gpvi's modules, the tests' shared
problems) resolve without running the benchmark.  The smoke runs in test_benchmarks.py run the
scripts that have a quick mode; this catches the others (agreement.py, concurrent_fits.py, ...)
when a module they import moves."""
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_scripts_are_found():
    assert len(SCRIPTS) >= 15, SCRIPTS


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_script_imports(path, monkeypatch):
    source = path.read_text()
    if "argparse" in source:  # a script, not a helper module such as datasets.py
        assert 'if __name__ == "__main__":' in source, f"{path.name} runs on import"
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
