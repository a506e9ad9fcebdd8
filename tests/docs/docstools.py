"""What the API reference (docs/reference/*.md) documents, read from its mkdocstrings directives.

A directive ``::: gpvi.kernels`` renders a module with the members of its ``__all__`` (mkdocs.yml:
``filters: public``, ``show_submodules: false``); ``members: [a, b]`` under its ``options:``
renders those members only, ``members: false`` none.  :func:`documented` turns the directives into
the Python objects they render, so that a public name can be matched with its entry whatever
path it is re-exported under (``gpvi.GP`` is rendered as ``gpvi.models.GP``).
"""
from __future__ import annotations

import ast
import importlib
import re
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
HOOKS = ROOT / "docs" / "hooks.py"

_DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\s*$")


@dataclass(frozen=True)
class Entry:
    """One rendered object: the path its anchor has in the site, and the object itself."""

    anchor: str
    obj: object
    page: str


def public_modules() -> tuple[str, ...]:
    """The modules whose ``__all__`` is public API: ``PUBLIC_MODULES`` of docs/hooks.py (read
    without importing mkdocs), which the site build also checks for docstrings."""
    tree = ast.parse(HOOKS.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PUBLIC_MODULES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("docs/hooks.py defines no PUBLIC_MODULES")


def public_names() -> list[tuple[str, str]]:
    """(module, name) for every name in the ``__all__`` of every public module."""
    names = []
    for module in public_modules():
        mod = importlib.import_module(module)
        names += [(module, name) for name in getattr(mod, "__all__", ())]
    return names


def directives() -> list[tuple[str, str, object]]:
    """(page, path, members) for every ``:::`` directive; members is None (the default), False or a list."""
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = _DIRECTIVE.match(line)
            if not m:
                continue
            block = []
            for follow in lines[i + 1:]:
                if follow.startswith("    "):  # the directive's indented options block
                    block.append(follow)
                else:
                    break
            found.append((page.name, m.group("path"), _members(block, page.name, m.group("path"))))
    return found


def _members(block: list[str], page: str, path: str):
    members = None
    for j, line in enumerate(block):
        text = line.strip()
        if text.startswith("members:"):
            value = text[len("members:"):].strip()
            if value == "false":
                members = False
            elif value == "":
                members = [b.strip()[2:].strip() for b in block[j + 1:] if b.strip().startswith("- ")]
            else:
                raise AssertionError(f"{page}: ::: {path}: members: {value!r} is not a form this test reads")
    return members


def resolve(path: str):
    """The object at a dotted path (the longest importable module prefix, then attributes)."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def documented() -> list[Entry]:
    """Every object the reference renders, as an :class:`Entry`."""
    entries = []
    for page, path, members in directives():
        obj = resolve(path)
        entries.append(Entry(path, obj, page))
        if not isinstance(obj, types.ModuleType) or members is False:
            continue
        names = members if members is not None else [
            n for n in getattr(obj, "__all__", ())
            if not isinstance(getattr(obj, n), types.ModuleType)]  # show_submodules: false
        entries += [Entry(f"{path}.{n}", getattr(obj, n), page) for n in names]
    return entries


def is_constant(obj) -> bool:
    """A value (number, string, tuple, dict) rather than a module, class or function: it can only
    be matched by its path, not by identity (``2`` is many constants)."""
    return not isinstance(obj, (types.ModuleType, type, types.FunctionType)) and not callable(obj)


def entry_for(module: str, name: str, entries: list[Entry]) -> Entry | None:
    """The reference entry of the public name ``module.name``, or None."""
    obj = getattr(importlib.import_module(module), name)
    for e in entries:
        if e.anchor == f"{module}.{name}":
            return e
    if is_constant(obj):
        return None
    for e in entries:
        if e.obj is obj:
            return e
    return None
