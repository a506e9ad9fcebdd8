"""Every ```python block of README.md runs as written, with only what the README installs.

Conventions (read these before adding a block to the README):

- Each ```python block runs on its own, in a fresh Python process whose working directory is a
  new temporary folder (so files it writes, e.g. ``diabetes.gpvi``, land there), with a time
  limit of ``TIMEOUT_S`` seconds.  No block sees the variables of another: every block in the
  README today is self-contained, and a new one that continues an earlier one should repeat
  what it needs or get a ``setup=`` (below).  The test fails if a block raises, exits non-zero
  or runs out of time; tracebacks carry the README's own line numbers (file ``README.md``).
- A block may be preceded, on the line right before its fence, by one marker
  ``<!-- readme-test: DIRECTIVE; DIRECTIVE ... -->`` with these directives:

  ``setup=NAME``
      run ``SETUPS[NAME]`` first: its code runs in a separate process in the same folder
      (it writes the files the block reads, e.g. ``counts.parquet``), and the names it lists
      (the data a block assumes the reader has, e.g. ``X, y``) are handed to the block as
      NumPy arrays.  Setups never import into the block's process, so the import check below
      sees only what the block itself needs.
  ``until "TEXT" (REASON)``
      run the block only up to the first line that starts with TEXT (for lines that cannot run
      on a test machine, e.g. connecting to a Dask scheduler at ``scheduler:8786``).
  ``skip (REASON)``
      do not run the block at all (only checked to compile).  Prefer ``setup=``.

  A marker with an unknown directive, a ``setup=`` without a ``SETUPS`` entry, an ``until``
  text that matches no line, or a marker not followed by a ```python fence fails the test.
- A block runs with only what the README's first set-up command (``pip install -e ".[EXTRAS]"``)
  installs: gpvi's requirements and those extras' are read from pyproject.toml and followed
  through the installed packages' metadata, and importing any other installed distribution
  (the test extras: pandas, pyarrow, dask, pytest, ...) raises ``ModuleNotFoundError`` in the
  block's process, as it would for the reader.  Optional imports (pandas trying pyarrow, joblib
  trying psutil) then take their fallback, as they would there.  Without this, a block needing
  e.g. pandas would pass here, where the test extras bring it, and fail for a reader.
- Every python block, skipped parts included, must at least compile (a fast test).
- ```bash blocks are not run: they install packages (not cheap, and no network in tests), run
  the whole suite, or fit from files the reader has; ``gpvi demo`` and the ``gpvi fit`` /
  ``gpvi predict`` commands are covered by tests/cli/test_cli.py.

Running all blocks takes 1-1.5 min on 2 cores (each block starts JAX and compiles its programs;
compiled programs are kept in the suite's persistent cache, see conftest.py), so those tests are
marked slow.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")
_DIRECTIVE = re.compile(r'^(?:setup=(?P<setup>[\w-]+)|until\s+"(?P<until>[^"]+)"\s*\((?P<ureason>[^)]+)\)'
                        r"|skip\s*\((?P<sreason>[^)]+)\))$")


# ---------------------------------------------------------------------------------------------
# Setups: data the README assumes the reader has.  ``code`` runs in its own process in the
# block's folder; ``names`` are saved from its namespace and given to the block.


@dataclass(frozen=True)
class Setup:
    code: str
    names: tuple = ()


SETUPS = {
    # Large data: a small Poisson data set with exposures in a Parquet file of 2 row groups.
    "counts_parquet": Setup("""
        import numpy as np, pyarrow as pa, pyarrow.parquet as pq
        rng = np.random.default_rng(0)
        n = 1200
        x0, x1 = rng.uniform(-2, 2, n), rng.uniform(-2, 2, n)
        log_exposure = np.log(rng.uniform(0.5, 2.0, n))
        y = rng.poisson(np.exp(np.sin(x0) + 0.5 * x1 + log_exposure)).astype(float)
        pq.write_table(pa.table({"x0": x0, "x1": x1, "y": y, "log_exposure": log_exposure}),
                       "counts.parquet", row_group_size=600)
    """),
    # Streaming: a Parquet file just over one batch of 4096 rows, and new rows for the update.
    "big_parquet": Setup("""
        import numpy as np, pyarrow as pa, pyarrow.parquet as pq
        rng = np.random.default_rng(1)
        n = 5000
        X = rng.uniform(-2, 2, (n + 200, 2))
        y = rng.poisson(np.exp(np.sin(X[:, 0]) + 0.3 * X[:, 1])).astype(float)
        pq.write_table(pa.table({"x0": X[:n, 0], "x1": X[:n, 1], "y": y[:n]}), "big.parquet",
                       row_group_size=2500)
        X_new, y_new = X[n:], y[n:]
    """, ("X_new", "y_new")),
    # Black-box likelihoods: regression, 3-class, binary and event-time data.
    "nguyen_data": Setup("""
        import numpy as np
        rng = np.random.default_rng(2)
        X = rng.uniform(-3, 3, (60, 1))
        X_test = np.linspace(-3, 3, 7)[:, None]
        y = np.sin(X[:, 0]) + 0.3 * rng.standard_t(4, 60)
        labels = np.digitize(X[:, 0], [-1.0, 1.0]).astype(float)
        y01 = (X[:, 0] + 0.5 * rng.standard_normal(60) > 0).astype(float)
        T = 100.0
        times = np.sort(rng.uniform(0, T, 150))
    """, ("X", "X_test", "y", "labels", "y01", "T", "times")),
}


# ---------------------------------------------------------------------------------------------
# Parsing


@dataclass
class Block:
    lang: str
    line: int  # 1-based line number of the first code line
    code: str
    section: str
    setup: str | None = None
    until: str | None = None
    skip: str | None = None
    until_reason: str | None = None
    id: str = ""  # the section's name, stable when lines move: "scikit-learn", "large-data", ...

    def runnable_code(self):
        """The code that runs: up to the ``until`` line, padded with blank lines so that line
        numbers in tracebacks are the README's."""
        lines = self.code.split("\n")
        if self.until is not None:
            stop = next(i for i, s in enumerate(lines) if s.lstrip().startswith(self.until))
            lines = lines[:stop]
        return "\n" * (self.line - 1) + "\n".join(lines) + "\n"


def parse_readme(text: str) -> list[Block]:
    """Every fenced block of ``text`` with its section and marker; malformed markers raise."""
    lines = text.split("\n")
    blocks, section, pending, i = [], "top", None, 0
    while i < len(lines):
        s = lines[i]
        if s.startswith("#") and not s.startswith("#!"):
            section = s.lstrip("#").strip()
        m = _MARKER.match(s.strip())
        if m:
            pending = (i + 1, m.group(1).strip())
            i += 1
            if i >= len(lines) or not lines[i].startswith("```python"):
                raise ValueError(f"README.md:{pending[0]}: a readme-test marker must be on the line right before "
                                 f"a ```python fence")
            continue
        f = _FENCE.match(s)
        if f:
            start = i + 1
            j = start
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"README.md:{i + 1}: unclosed code fence")
            block = Block(f.group(1), start + 1, "\n".join(lines[start:j]), section)
            slug = re.sub(r"[^a-z0-9]+", "-", section.lower())[:30].strip("-")
            same = sum(b.section == section and b.lang == block.lang for b in blocks)
            block.id = slug if not same else f"{slug}-{same + 1}"
            if pending is not None:
                _apply_marker(block, *pending)
                pending = None
            blocks.append(block)
            i = j + 1
            continue
        i += 1
    return blocks


def _apply_marker(block: Block, line: int, body: str):
    for part in (p.strip() for p in body.split(";")):
        d = _DIRECTIVE.match(part)
        if not d:
            raise ValueError(f"README.md:{line}: unknown readme-test directive {part!r} "
                             f'(expected setup=NAME, until "TEXT" (REASON) or skip (REASON))')
        if d["setup"]:
            if d["setup"] not in SETUPS:
                raise ValueError(f"README.md:{line}: setup={d['setup']} has no entry in SETUPS ({sorted(SETUPS)})")
            block.setup = d["setup"]
        elif d["until"]:
            if not any(s.lstrip().startswith(d["until"]) for s in block.code.split("\n")):
                raise ValueError(f"README.md:{line}: until {d['until']!r} matches no line of the block")
            block.until, block.until_reason = d["until"], d["ureason"]
        else:
            block.skip = d["sreason"]


BLOCKS = parse_readme(README.read_text(encoding="utf-8"))
PYTHON = [b for b in BLOCKS if b.lang == "python"]


# ---------------------------------------------------------------------------------------------
# What the README's install command brings


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_install_extras() -> list[str]:
    """The extras of the README's first set-up command, ``pip install -e ".[a,b]"``."""
    for b in BLOCKS:
        if b.lang != "bash":
            continue
        for s in b.code.split("\n"):
            s = s.split("#")[0].strip()
            if s.startswith("pip install"):
                args = shlex.split(s.split("&&")[0])
                spec = next(a for a in args[2:] if not a.startswith("-"))
                m = re.fullmatch(r"\.\[([\w,\-]+)\]", spec)
                assert m, f"unexpected install target {spec!r}"
                return m.group(1).split(",")
    raise AssertionError("the README has no `pip install` set-up command")


def installed_closure(extras) -> set[str]:
    """Canonical names of the distributions that installing gpvi with ``extras`` brings:
    gpvi's requirements from pyproject.toml, then each requirement's own requirements (and
    requested extras) from the installed metadata."""
    from packaging.requirements import Requirement

    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen_extras = set()

    def add_extras(names):
        for e in names:
            if e not in seen_extras:
                seen_extras.add(e)
                todo.extend(Requirement(r) for r in project["optional-dependencies"][e])

    add_extras(extras)
    done: set[tuple] = set()
    out = {"gpvi"}
    while todo:
        req = todo.pop()
        name = _canon(req.name)
        if name == "gpvi":
            add_extras(req.extras)
            continue
        key = (name, frozenset(req.extras))
        if key in done:
            continue
        done.add(key)
        out.add(name)
        try:
            reqs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            envs = [{"extra": e} for e in ("", *req.extras)]
            if r.marker is None or any(r.marker.evaluate(env) for env in envs):
                todo.append(r)
    return out


# ---------------------------------------------------------------------------------------------
# Running


_DRIVER = r"""
import json, sys
mode, path = sys.argv[1], sys.argv[2]
ns = {"__name__": "__main__"}
if mode == "setup":
    names = json.loads(sys.argv[3])
    exec(compile(open(path, encoding="utf-8").read(), "<readme-test setup>", "exec"), ns)
    if names:
        import numpy as np
        np.savez("readme_setup.npz", **{n: ns[n] for n in names})
    sys.exit(0)

blocked = set(json.loads(open("readme_blocked.json", encoding="utf-8").read()))
install = sys.argv[3]


class NotInstalledByReadme:
    # Imports of what the README's install command would not bring fail as they would there.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (readme-test: it is installed here, but "
                                      f"not by the README's `{install}`)", name=name)
        return None


sys.meta_path.insert(0, NotInstalledByReadme())
if len(sys.argv) > 4:
    import numpy as np
    with np.load(sys.argv[4]) as data:
        ns.update({k: (data[k].item() if data[k].ndim == 0 else data[k]) for k in data.files})
exec(compile(open(path, encoding="utf-8").read(), "README.md", "exec"), ns)
"""


def _env():
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["MPLBACKEND"] = "Agg"
    # compiled programs kept where the rest of the suite keeps them: conftest.py set
    # GPVI_COMPILATION_CACHE in this process's environment, which the child inherits
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def _run(args, cwd, what):
    try:
        proc = subprocess.run([sys.executable, "-c", _DRIVER, *args], cwd=cwd, env=_env(),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish within {TIMEOUT_S} s")
    if proc.returncode != 0:
        pytest.fail(f"{what} failed (exit code {proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def blocked_modules(closure) -> list[str]:
    """Top-level module names of the installed distributions outside ``closure`` (nor gpvi):
    the modules a reader who ran the README's install command would not have."""
    keep = closure | {"gpvi", "pip", "setuptools", "wheel"}  # the installer's own tools are there too
    out = set()
    for module, dists in md.packages_distributions().items():
        if module not in sys.stdlib_module_names and not any(_canon(d) in keep for d in dists):
            out.add(module)
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# Tests


def test_readme_blocks_found_and_markers_well_formed():
    assert len(PYTHON) >= 5, [b.id for b in PYTHON]
    # the blocks the README has today are all run, at least in part
    assert not [b.id for b in PYTHON if b.skip], "a block is skipped entirely: prefer setup="
    for b in PYTHON:
        assert b.code.strip(), b.id


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_readme_block_compiles(block):
    compile(block.code + "\n", f"README.md:{block.line}", "exec")


def test_parser_rejects_bad_markers():
    good = 'x\n<!-- readme-test: setup=nguyen_data; until "y" (why) -->\n```python\nx = 1\ny = 2\n```\n'
    (b,) = parse_readme(good)
    assert (b.setup, b.until, b.until_reason, b.skip) == ("nguyen_data", "y", "why", None)
    assert b.runnable_code() == "\n" * 3 + "x = 1\n"
    for bad, msg in [(good.replace("setup=nguyen_data", "setup=nope"), "no entry in SETUPS"),
                     (good.replace('until "y"', 'until "z"'), "matches no line"),
                     (good.replace("setup=nguyen_data", "run it"), "unknown readme-test"),
                     (good.replace("-->\n```python", "-->\n\n```python"), "line right before")]:
        with pytest.raises(ValueError, match=msg):
            parse_readme(bad)


def test_install_closure_follows_extras():
    extras = readme_install_extras()
    assert "plot" in extras  # the demo draws gpvi-demo.png
    closure = installed_closure(extras)
    assert {"jax", "numpy", "scikit-learn", "matplotlib", "joblib"} <= closure  # joblib via scikit-learn
    # what the examples need beyond gpvi's dependencies: DataFrames (scikit-learn), Parquet files
    assert {"pandas", "pyarrow"} <= closure
    assert "pytest" not in closure and "hypothesis" not in closure


def run_block(block: Block, tmp_path: Path):
    """Run ``block`` (after its setup) in a fresh process in ``tmp_path``; fails the test if it
    raises, exits non-zero, runs out of time or imports what the README does not install."""
    where = f"README.md block at line {block.line} ({block.section})"
    tmp_path.mkdir(parents=True, exist_ok=True)
    npz = []
    if block.setup:
        setup = SETUPS[block.setup]
        (tmp_path / "readme_setup.py").write_text(textwrap.dedent(setup.code), encoding="utf-8")
        _run(["setup", "readme_setup.py", json.dumps(list(setup.names))], tmp_path, f"setup {block.setup} of {where}")
        if setup.names:
            npz = ["readme_setup.npz"]
    extras = readme_install_extras()
    install = f'pip install -e ".[{",".join(extras)}]"'
    (tmp_path / "readme_blocked.json").write_text(json.dumps(blocked_modules(installed_closure(extras))))
    (tmp_path / "readme_block.py").write_text(block.runnable_code(), encoding="utf-8")
    return _run(["block", "readme_block.py", install, *npz], tmp_path, where)


@pytest.mark.slow
def test_runner_fails_on_an_error_and_on_what_the_readme_does_not_install(tmp_path):
    """The runner itself, on tiny blocks (no JAX): a block that raises or imports a test-only
    package fails with the README's line number; a good block passes and sees its setup."""
    (b,) = parse_readme("## S\n\n<!-- readme-test: setup=nguyen_data -->\n```python\n"
                        "import json\nassert X.shape == (60, 1) and T == 100.0\nprint('ok', json.dumps(1))\n```\n")
    assert "ok 1" in run_block(b, tmp_path / "good").stdout
    for k, (code, expected) in enumerate([("x = 1\nraise ValueError('boom')", 'README.md", line 6'),
                                          ("import pytest", "not by the README's `pip install -e"),
                                          ("import sys\nsys.exit(3)", "exit code 3")]):
        (b,) = parse_readme(f"## S\n\ntext\n```python\n{code}\n```\n")
        with pytest.raises(pytest.fail.Exception, match=re.escape(expected)):
            run_block(b, tmp_path / str(k))


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in PYTHON if not b.skip], ids=lambda b: b.id)
def test_readme_block_runs(block, tmp_path):
    run_block(block, tmp_path)
