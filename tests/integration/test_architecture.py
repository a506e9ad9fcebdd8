"""The package's architecture, checked from its source: layers, private names, import cycles.

- ``test_import_contracts`` runs import-linter (``lint-imports``, in the test extra) on the
  contracts in pyproject.toml's ``[tool.importlinter]``: imports point only down the layers
  front ends > fitting > engines > data > objective > models > likelihoods > kernels > core
  (lazy imports inside functions count).  .ci/run also runs ``lint-imports`` before pytest.
- ``test_no_private_names_across_modules``: no module uses a private name (``_name``, not a
  dunder) of another gpvi module, neither by ``from gpvi.x import _name`` nor as ``x._name`` on
  an imported module.  Private *modules* (``gpvi._module``, ``gpvi.engines._common``) may be
  imported from anywhere: what they define without an underscore is their interface.  A private
  name is an implementation detail of its module: give it a public name (or move the code that
  needs it) before another module uses it.
- ``test_no_import_cycles``: the graph of imports between gpvi's modules, function-local ones
  included, has no cycle.

The last two read the source with :mod:`ast` (nothing is imported) in well under a second, and
``test_checks_catch_offenders`` runs them on a small made-up package to show that they find what
they should and nothing else.  Each failure lists every offender: the work list for fixing them.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Package:
    """The modules of one package under ``src``, read with :mod:`ast` (each file parsed once)."""

    def __init__(self, src: Path, name: str, root: Path | None = None):
        self.src, self.name, self.root = src, name, root or src.parent
        self.modules: dict[str, Path] = {}
        for path in sorted((src / name).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self.trees = {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in self.modules.items()}
        # every import statement of each module, wherever it is (module level, in functions, under if)
        self.imports = {m: [n for n in ast.walk(t) if isinstance(n, (ast.Import, ast.ImportFrom))]
                        for m, t in self.trees.items()}

    def inside(self, name: str | None) -> bool:
        return name is not None and (name == self.name or name.startswith(self.name + "."))

    def where(self, module: str, node: ast.AST) -> str:
        return f"{self.modules[module].relative_to(self.root)}:{node.lineno}"

    def source_of(self, module: str, node: ast.ImportFrom) -> str | None:
        """The absolute name of the module a ``from ... import`` reads (relative ones resolved)."""
        if not node.level:
            return node.module
        base = module.split(".")
        if self.modules[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    @functools.cached_property
    def _bound(self) -> dict[str, dict[str, tuple[str, str | None]]]:
        """module -> {name it binds: (module imported from, name there or None for a module)}."""
        bound: dict[str, dict[str, tuple[str, str | None]]] = {}
        for module, nodes in self.imports.items():
            names = bound[module] = {}
            for node in nodes:
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:  # import gpvi.x.y as z
                            names[alias.asname] = (alias.name, None)
                        else:  # import gpvi.x.y binds gpvi
                            names[alias.name.partition(".")[0]] = (alias.name.partition(".")[0], None)
                else:
                    source = self.source_of(module, node)
                    for alias in node.names:
                        if alias.name != "*":
                            names[alias.asname or alias.name] = (source, alias.name)
        return bound

    def submodule(self, module: str, name: str, _seen: frozenset = frozenset()) -> str | None:
        """The module that ``module.name`` is, or None when it is not one of the package's modules.

        A submodule, or a module that ``module`` re-exports under ``name``
        (``gpvi.stream`` is gpvi.data.stream, imported as ``stream`` by gpvi/__init__.py).
        """
        if f"{module}.{name}" in self.modules:
            return f"{module}.{name}"
        if module in _seen or name not in self._bound.get(module, {}):
            return None
        source, original = self._bound[module][name]
        if original is None:
            return source if source in self.modules else None
        return self.submodule(source, original, _seen | {module})

    def module_names(self, module: str) -> dict[str, str]:
        """The names that ``module`` binds to modules of the package (scopes not told apart)."""
        return {local: target for local in self._bound[module]
                if self.inside(self._bound[module][local][0])
                and (target := self._binding_target(module, local)) is not None}

    def _binding_target(self, module: str, local: str) -> str | None:
        source, original = self._bound[module][local]
        if original is None:
            return source if source in self.modules else None
        return self.submodule(source, original)


# --- private names --------------------------------------------------------------------------


def private_name_uses(package: Package) -> list[str]:
    """Every use of another module's private name, as 'file:line imports|uses NAME from MODULE'.

    ``from X import _name`` where X is another module of the package and X._name is not a
    module; and ``x._name`` (also ``gpvi.x._name``) where x is a name the file binds to another
    module of the package.  Names bound inside functions count for the whole file (a local
    variable reusing a module's name elsewhere in the same file would be taken for that module).
    """
    found = set()
    for module, tree in package.trees.items():
        for node in package.imports[module]:
            if isinstance(node, ast.ImportFrom):
                source = package.source_of(module, node)
                if package.inside(source) and source != module:
                    for alias in node.names:
                        if _is_private(alias.name) and package.submodule(source, alias.name) is None:
                            found.add((package.where(module, node), "imports", alias.name, source))
        names = package.module_names(module)
        if not names:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or isinstance(node.ctx, ast.Del):
                continue
            chain = []
            base = node
            while isinstance(base, ast.Attribute):
                chain.append(base)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in names:
                continue
            target = names[base.id]
            for link in reversed(chain):
                inner = package.submodule(target, link.attr)
                if inner is not None:  # gpvi.engines._common: a (private) module, fine
                    target = inner
                    continue
                if _is_private(link.attr) and target != module:
                    found.add((package.where(module, link), "uses", link.attr, target))
                break
    return [f"{where} {verb} {name} from {source}"
            for where, verb, name, source in sorted(found, key=lambda f: (f[0].rpartition(":")[0], int(f[0].rpartition(":")[2]), f[2]))]


# --- import cycles --------------------------------------------------------------------------


def import_graph(package: Package) -> dict[str, dict[str, str]]:
    """importer -> {imported: 'file:line' of its first import of it}, between the package's modules.

    Every import statement counts, wherever it is (module level, inside functions, under ``if``),
    and so does ``importlib.import_module("gpvi....")`` with a literal name.  ``from gpvi.x import
    y`` imports gpvi.x.y when that is a module, else gpvi.x; ``import gpvi.x.y`` imports gpvi.x.y.

    Not in the graph: the implicit import of a parent package (importing gpvi.x.y first runs
    gpvi/x/__init__.py).  With it, every package __init__ that re-exports its submodules (and
    gpvi/__init__.py, which imports every layer) would close a cycle with each of them, while
    Python resolves those: the package is already in sys.modules, partly initialised, and the
    submodule does not read names from it.  A submodule that does (``from gpvi.x import name``
    in gpvi/x/y.py, ``import gpvi`` in a module that gpvi/__init__.py imports) has an explicit
    edge to the package, which is in the graph, so no module is left out of cycle detection.
    """
    graph: dict[str, dict[str, str]] = {m: {} for m in package.modules}

    def add(importer, imported, node):
        while imported not in package.modules and "." in imported:  # gpvi.x.NotAModule -> gpvi.x
            imported = imported.rpartition(".")[0]
        if imported in package.modules and imported != importer:
            graph[importer].setdefault(imported, package.where(importer, node))

    for module, tree in package.trees.items():
        for node in package.imports[module]:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if package.inside(alias.name):
                        add(module, alias.name, node)
            else:
                source = package.source_of(module, node)
                if package.inside(source):
                    for alias in node.names:
                        sub = f"{source}.{alias.name}"
                        add(module, sub if sub in package.modules else source, node)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and package.inside(node.args[0].value)
                    and "import_module" in (getattr(node.func, "attr", None), getattr(node.func, "id", None))):
                add(module, node.args[0].value, node)
    return graph


def _strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module, each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def import_cycles(package: Package, limit: int = 50) -> list[str]:
    """The elementary import cycles (at most ``limit`` per tangle), each with its import lines."""
    graph = import_graph(package)
    lines = []
    for component in _strongly_connected(graph):
        cycles: list[list[str]] = []
        for i, start in enumerate(component):  # the cycles whose smallest member is ``start``
            allowed = set(component[i:])
            path = [start]

            def walk(node):
                for child in sorted(graph[node]):
                    if len(cycles) >= limit:
                        return
                    if child == start:
                        cycles.append(path + [start])
                    elif child in allowed and child not in path:
                        path.append(child)
                        walk(child)
                        path.pop()

            walk(start)
        for cycle in cycles:
            lines.append(" ".join([cycle[0]] + [f"-> {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]))
    return lines


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpvi_source():
    return Package(SRC, "gpvi", root=ROOT)


def test_no_private_names_across_modules(gpvi_source):
    offenders = private_name_uses(gpvi_source)
    print(f"{len(offenders)} private names used outside their module:", *offenders, sep="\n  ")
    assert not offenders, (
        f"{len(offenders)} uses of another module's private name (give it a public name, or move "
        "the code that needs it):\n  " + "\n  ".join(offenders))


def test_no_import_cycles(gpvi_source):
    cycles = import_cycles(gpvi_source)
    print(f"{len(cycles)} import cycles (each arrow with its import line):", *cycles, sep="\n  ")
    assert not cycles, f"{len(cycles)} import cycles between gpvi's modules:\n  " + "\n  ".join(cycles)


def test_checks_catch_offenders(tmp_path):
    """The two checks above, on a made-up package: every offender found, nothing legitimate."""
    files = {
        "pkg/__init__.py": """
            from pkg.sub import deep as shortcut   # re-exports a module under another name
            __version__ = "1"
            _REGISTRY = {}
        """,
        "pkg/_priv.py": """
            import pkg
            public = 1
            _secret = 2
            def f():
                from pkg._priv import _secret      # its own private name: fine
                return pkg._priv.public, pkg.__version__, pkg.a._hidden   # last one: offender
        """,
        "pkg/a.py": """
            _hidden = 0
            def lazy():
                from pkg import b                  # lazy import: closes the cycle a -> b -> a
                return b
        """,
        "pkg/b.py": """
            import pkg.a as A
            from pkg import a, _priv, __version__, shortcut   # _priv is a module: fine
            from pkg._priv import public           # public name of a private module: fine
            from pkg._priv import _secret          # offender
            from pkg.a import _hidden              # offender
            from . import _REGISTRY                # offender (relative import of pkg)
            x = A._hidden + a._hidden              # two offenders
            y = shortcut._inner                    # offender, through the re-export
            z = _priv.public + A.__name__
        """,
        "pkg/sub/__init__.py": """
            from pkg.sub import deep               # re-exports its submodule: no cycle by itself
        """,
        "pkg/sub/deep.py": """
            import importlib
            _inner = 1
            def load():                            # reads pkg.sub itself: cycle pkg.sub <-> deep
                return importlib.import_module("pkg.sub").deep
        """,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    package = Package(tmp_path, "pkg", root=tmp_path)
    assert private_name_uses(package) == [
        "pkg/_priv.py:7 uses _hidden from pkg.a",
        "pkg/b.py:5 imports _secret from pkg._priv",
        "pkg/b.py:6 imports _hidden from pkg.a",
        "pkg/b.py:7 imports _REGISTRY from pkg",
        "pkg/b.py:8 uses _hidden from pkg.a",   # A._hidden and a._hidden, one line
        "pkg/b.py:9 uses _inner from pkg.sub.deep",
    ]
    # b and _priv read the root package (from pkg import ..., import pkg), which imports neither
    assert import_cycles(package) == [
        "pkg.a -> pkg.b (pkg/a.py:4) -> pkg.a (pkg/b.py:2)",
        "pkg.sub -> pkg.sub.deep (pkg/sub/__init__.py:2) -> pkg.sub (pkg/sub/deep.py:5)",
    ]


def test_import_contracts():
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[test]')")
    # ``python -m importlinter.cli`` would run nothing (the module has no __main__ block): call
    # the command behind the ``lint-imports`` script with this interpreter.  src/ goes first on
    # the path so that the gpvi checked is this checkout's, however gpvi is installed; --no-cache
    # leaves no .import_linter_cache folder behind.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
         "lint_imports_command(prog_name='lint-imports')", "--no-cache", "--no-logo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    summary = re.search(r"Contracts: (\d+) kept, (\d+) broken", proc.stdout)
    assert summary, f"lint-imports did not check its contracts:\n{proc.stdout}\n{proc.stderr}"
    assert summary[2] == "0" and proc.returncode == 0, (
        f"lint-imports: {summary[2]} broken import contracts (pyproject.toml [tool.importlinter]):\n"
        f"{proc.stdout}\n{proc.stderr}")
