"""Griffe extension (mkdocs.yml, mkdocstrings ``extensions:``): Sphinx conventions of gpvi's
docstrings, for Markdown.

``#:`` comments above a module constant are its docstring (as for Sphinx's autodoc).

Sphinx roles become cross-references.
gpvi's docstrings name other objects the Sphinx way, ``:func:`fit```, ``:class:`~gpvi.kernels.RBF```,
``:mod:`gpvi.io```.  Markdown would show the role verbatim; this rewrites each one as inline code
wrapped in an *optional* autorefs link: the name resolved in the docstring's scope (``Sum`` inside
``gpvi.kernels`` is ``gpvi.kernels.Sum``) links to its reference entry when the site has one, and
stays plain code without a warning when it has none (a private helper, a NumPy function).
"""
from __future__ import annotations

import html
import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const):`(?P<target>[^`]+)`")


class SphinxRoles(griffe.Extension):
    """Read ``#:`` comments as docstrings; rewrite ``:role:`target``` as an optional cross-reference."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None and obj.kind is griffe.Kind.ATTRIBUTE:
            text = _comment_docstring(obj)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
        if obj.docstring is None or ":`" not in obj.docstring.value:
            return
        scope = obj if obj.kind in (griffe.Kind.MODULE, griffe.Kind.CLASS) else obj.parent
        obj.docstring.value = _ROLE.sub(lambda m: _reference(m.group("target"), scope), obj.docstring.value)


def _reference(target: str, scope) -> str:
    target = target.strip()
    shown = target
    if "<" in target and target.endswith(">"):  # :func:`title <path>`
        shown, target = (part.strip() for part in target[:-1].split("<", 1))
    elif target.startswith("~"):
        target = target[1:]
        shown = target.rsplit(".", 1)[-1]
    target = target.removesuffix("()")
    identifier = _resolve(target, scope)
    code = f"<code>{html.escape(shown)}</code>"
    return f'<autoref identifier="{html.escape(identifier)}" optional>{code}</autoref>'


def _resolve(target: str, scope) -> str:
    if target.startswith("gpvi") or scope is None:
        return target
    head, _, rest = target.partition(".")
    try:
        path = scope.resolve(head)
    except Exception:  # noqa: BLE001 - an unknown name stays as written (optional: no warning)
        return target
    return f"{path}.{rest}" if rest else path


def _comment_docstring(obj) -> str:
    """The ``#:`` comment lines right above ``obj``'s assignment, without the markers."""
    if not obj.lineno or obj.filepath is None or isinstance(obj.filepath, list):
        return ""
    try:
        lines = obj.filepath.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    found = []
    i = obj.lineno - 2  # the line above the assignment (lineno counts from 1)
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        found.append(lines[i].lstrip()[2:].strip())
        i -= 1
    return "\n".join(reversed(found))
