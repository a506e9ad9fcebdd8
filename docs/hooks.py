"""MkDocs hooks of the gpvi site (mkdocs.yml ``hooks:``).

- The command-line reference (``docs/cli.md``) is generated from gpvi's own argparse parser
  (:func:`gpvi.cli.build_parser`): the marker ``<!-- gpvi-cli-help -->`` becomes the ``--help``
  text of ``gpvi`` and of each sub-command, so the page cannot drift from the parser.
- ``CHANGELOG.md`` at the repository root is published as ``changelog.md``.
- The table of contents of an executed example (mkdocs-jupyter) points at the ids nbconvert gave
  its headings: mkdocs-jupyter drops inline code from its own slugs, so a heading such as
  "The same classifier with `gpvi.fit`" had a sidebar link to an anchor that does not exist.
- Every public name (``gpvi.__all__`` and the ``__all__`` of the modules listed in
  :data:`PUBLIC_MODULES`) must have a docstring: a name without one is a warning, which
  ``mkdocs build --strict`` turns into a failed build.  (That every public name also has a
  reference entry is checked by ``tests/docs/test_reference.py``.)
"""
from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import re
import types
from pathlib import Path

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.gpvi")

ROOT = Path(__file__).resolve().parent.parent
CLI_MARKER = "<!-- gpvi-cli-help -->"
HELP_WIDTH = "80"  # fits the page's text column

# the modules whose __all__ is public API (tests/docs/test_reference.py uses the same list)
PUBLIC_MODULES = (
    "gpvi", "gpvi.kernels", "gpvi.likelihoods", "gpvi.models", "gpvi.engines", "gpvi.objective", "gpvi.io",
    "gpvi.diagnostics", "gpvi.plots", "gpvi.metrics", "gpvi.priors", "gpvi.pointprocess", "gpvi.datasets",
    "gpvi.sklearn.estimators", "gpvi.data.sources", "gpvi.data.executors", "gpvi.data.stream", "gpvi.cli",
    "gpvi.engines.auto", "gpvi.engines.dual", "gpvi.engines.fpb", "gpvi.engines.fpi", "gpvi.engines.gradient", "gpvi.engines.ivsgpr",
    "gpvi.engines.jj", "gpvi.engines.laplace", "gpvi.engines.sfp", "gpvi.engines.svi",
    "gpvi.likelihoods.montecarlo", "gpvi.likelihoods.softmax", "gpvi.likelihoods.warped",
    "gpvi.models.multilatent", "gpvi.sklearn.damping",
)

# modules rendered with mkdocstrings' force_inspection (docs/reference/*.md): the estimators'
# docstrings are assembled from shared parts when the module is imported
INSPECTED_MODULES = ("gpvi.sklearn.estimators",)


def on_config(config, **kwargs):
    # argparse wraps help text to the terminal width: fix it so the page is the same everywhere
    os.environ["COLUMNS"] = HELP_WIDTH
    return config


def on_pre_build(config, **kwargs):
    for module, name in _public_names():
        obj = getattr(importlib.import_module(module), name)
        if not _has_docstring(module, name, obj):
            log.warning("public name %s.%s has no docstring (the API reference would show nothing for it)",
                        module, name)


def on_files(files, config, **kwargs):
    changelog = ROOT / "CHANGELOG.md"
    if changelog.exists():
        files.append(File.generated(config, "changelog.md", content=changelog.read_text(encoding="utf-8")))
    return files


def on_page_content(html, page, config, files, **kwargs):
    if page.file.src_uri.startswith("examples/") and page.file.src_uri.endswith(".py") and page.toc:
        _fix_notebook_toc(html, page)
    return html


_HEADING = re.compile(r'<h([1-6])\b[^>]*\bid="([^"]+)"', re.S)


def _fix_notebook_toc(html: str, page) -> None:
    """Give the table-of-contents entries of a notebook page the ids of its headings, in order and
    level by level (the same headings, slugged differently)."""
    headings = [(int(level), hid) for level, hid in _HEADING.findall(html)]
    i = 0

    def walk(items):
        nonlocal i
        for item in items:
            while i < len(headings) and headings[i][0] != item.level:
                i += 1
            if i == len(headings):
                log.warning("%s: no heading for the table-of-contents entry %r", page.file.src_uri, item.title)
                return
            item.id = headings[i][1]
            i += 1
            walk(item.children)

    walk(page.toc.items)


def on_page_markdown(markdown, page, config, files, **kwargs):
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


def cli_reference() -> str:
    """Markdown with the ``--help`` text of ``gpvi`` and of each of its sub-commands."""
    from gpvi.cli import build_parser

    parser = build_parser()
    parts = ["## gpvi", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser):
        parts += [f"## gpvi {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(parts)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _public_names():
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            yield module, name


def _griffe_module(module: str):
    """``module`` as mkdocstrings reads it: by static analysis, except the modules whose pages
    ask for ``force_inspection`` (their docstrings are built at import time), with the site's own
    extension, which reads the ``#:`` comments above constants."""
    if module in INSPECTED_MODULES:
        return _griffe_load(module, True)
    package = _griffe_load("gpvi", False)
    return package[module.removeprefix("gpvi").removeprefix(".")] if module != "gpvi" else package


@functools.lru_cache(maxsize=None)
def _griffe_load(module: str, inspect_it: bool):
    import griffe

    extensions = griffe.load_extensions(str(ROOT / "docs" / "griffe_sphinx.py"))
    return griffe.load(module, search_paths=[str(ROOT / "src")], extensions=extensions, force_inspection=inspect_it)


def _has_docstring(module: str, name: str, obj) -> bool:
    """Whether mkdocstrings will find a docstring for ``module.name``: read by griffe, as the
    site reads it (``mze = error_rate`` is an attribute without one, however documented the
    function it names is); a name griffe cannot see (made by a module ``__getattr__``) is
    judged by its object's ``__doc__``."""
    try:
        member = _griffe_module(module)[name]
    except Exception:  # noqa: BLE001 - not visible statically
        return isinstance(obj, (types.ModuleType, type, types.FunctionType)) and bool((obj.__doc__ or "").strip())
    target = member.final_target if member.is_alias else member
    return target.docstring is not None and bool(target.docstring.value.strip())
