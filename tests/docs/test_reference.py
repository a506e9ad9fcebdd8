"""The API reference has an entry for every public name (issue 35, acceptance 2).

Reads the mkdocstrings directives of docs/reference/*.md (no site build: fast) and matches each
name of ``gpvi.__all__`` and of the public modules' ``__all__`` with the object a directive
renders.  tests/docs/test_site.py checks the built pages for the same entries' anchors.
"""
from __future__ import annotations

import importlib
import types

import pytest

import gpvi
from docstools import REFERENCE, directives, documented, entry_for, public_modules, public_names, resolve


def test_every_public_name_has_a_reference_entry():
    entries = documented()
    missing = [f"{module}.{name}" for module, name in public_names() if entry_for(module, name, entries) is None]
    assert not missing, (f"public names without an entry in docs/reference/*.md: {missing} "
                         "(add a ::: directive for them, or list them under a directive's members:)")


def test_public_modules_cover_gpvi_all_and_the_modules_it_names():
    # every module re-exported by gpvi or named in a public __all__ is itself a public module
    # whose __all__ is checked (so a new subpackage cannot slip past the test above)
    listed = set(public_modules())
    assert "gpvi" in listed
    for module, name in public_names():
        obj = getattr(importlib.import_module(module), name)
        if isinstance(obj, types.ModuleType) and hasattr(obj, "__all__"):
            assert obj.__name__ in listed or any(
                getattr(importlib.import_module(m), "__name__", None) == obj.__name__ for m in listed), \
                f"{module}.{name} is the module {obj.__name__}, which has an __all__ but is not in PUBLIC_MODULES"
    for sub in ("kernels", "likelihoods", "models", "engines", "objective", "io", "diagnostics", "plots",
                "metrics", "priors", "pointprocess", "datasets", "sklearn.estimators", "data.sources",
                "data.executors", "data.stream"):
        assert f"gpvi.{sub}" in listed


def test_every_directive_resolves():
    for page, path, members in directives():
        resolve(path)  # an ImportError/AttributeError here is a directive for a name that is gone
        if isinstance(members, list):
            for name in members:
                assert hasattr(resolve(path), name), f"{page}: ::: {path} lists {name!r}, which it lacks"


def test_the_check_fails_for_a_name_without_an_entry(monkeypatch):
    # the test above can fail: a public name that no directive renders is reported.  The top
    # level's page lists its members one by one, so a name added to gpvi.__all__ needs an entry
    # (a module page renders its module's __all__, read by mkdocstrings from the source)
    def undocumented():
        """A function no reference page renders."""

    monkeypatch.setattr(gpvi, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(gpvi, "__all__", [*gpvi.__all__, "undocumented"])
    entries = documented()
    assert entry_for("gpvi", "undocumented", entries) is None
    assert entry_for("gpvi", "fit", entries).anchor == "gpvi.fit"
    assert entry_for("gpvi.kernels", "RBF", entries) is not None
    # a re-exported name is matched with the entry of the object it names
    assert entry_for("gpvi", "GP", entries).anchor == "gpvi.models.GP"
    assert entry_for("gpvi", "GPClassifier", entries).anchor == "gpvi.sklearn.estimators.GPClassifier"


@pytest.mark.parametrize("page", sorted(p.name for p in REFERENCE.glob("*.md")))
def test_each_reference_page_is_in_the_nav(page):
    mkdocs_yml = (REFERENCE.parents[1] / "mkdocs.yml").read_text(encoding="utf-8")
    assert f"reference/{page}" in mkdocs_yml
