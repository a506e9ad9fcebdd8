"""The built documentation site, opened in a real browser (issue 35: "How it is checked").

The site is built once per test run with ``mkdocs build --strict`` into ``.cache/docs-site``
(the examples are executed: minutes, less when mkdocs-jupyter's cache in ``.cache/`` still holds
an example's outputs), or taken from ``GPVI_DOCS_SITE`` when that names a built site
(``.ci/run`` builds it first and passes it here).  Then

- every public name's reference entry has its anchor in the built page (tests/docs/docstools.py
  says where each name is rendered);
- headless Chromium from Debian's packages (``/usr/bin/chromium``, or ``GPVI_CHROMIUM``), driven
  by playwright, loads every page from ``python -m http.server``: the test fails on a console
  error, an uncaught page error, a failed or 4xx/5xx request to the site, an image that does not
  load, an internal link to a page or anchor that does not exist, or an equation MathJax did not
  render.  Requests to other hosts are blocked (CI has no network) and listed, not failed: the
  site needs none of them.
- screenshots of the home page, an API page, an example page (with its first figure) and the
  convergence guide (its equations) go to
  ``docs-artifacts/`` (or ``GPVI_DOCS_ARTIFACTS``) for a person to look at.

Needs the docs extra (``pip install -e ".[docs]"``); skipped with the reason when mkdocs,
playwright or Chromium is missing.
"""
from __future__ import annotations

import fcntl
import html
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from docstools import ROOT, documented, entry_for, public_names

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("GPVI_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("GPVI_DOCS_ARTIFACTS", ROOT / "docs-artifacts"))
SCREENSHOTS = {  # file name -> page (site-relative URL path)
    "home.png": "",
    "api-kernels.png": "reference/kernels/",
    "example-getting-started.png": "examples/getting_started/",
    "guide-convergence.png": "guide/convergence/",  # equations typeset by MathJax
}
_ID = re.compile(r'\bid="([^"]+)"')
_HREF = re.compile(r'<a\s[^>]*?href="([^"]*)"', re.S)


@pytest.fixture(scope="session")
def site() -> Path:
    given = os.environ.get("GPVI_DOCS_SITE")
    if given:
        path = Path(given)
        assert (path / "index.html").is_file(), f"GPVI_DOCS_SITE={given} is not a built site (no index.html)"
        return path
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    # one build per test run, whichever xdist worker asks first (the others wait for it and reuse it)
    out, lock = ROOT / ".cache" / "docs-site", ROOT / ".cache" / "docs-site.lock"
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid {os.getpid()}"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        marker = out / ".built-by"
        if marker.is_file() and marker.read_text() == run_id:
            return out
        proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=3600)
        assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
        marker.write_text(run_id)
    return out


def _pages(site: Path) -> list[str]:
    """Site-relative URL paths of every page (directory URLs: ``reference/kernels/``)."""
    pages = []
    for f in sorted(site.rglob("index.html")):
        rel = f.parent.relative_to(site).as_posix()
        pages.append("" if rel == "." else rel + "/")
    return pages


def _ids(site: Path, page: str) -> set[str]:
    return set(_ID.findall((site / page / "index.html").read_text(encoding="utf-8")))


def test_every_public_name_has_an_anchor_in_the_built_reference(site):
    entries = documented()
    missing = []
    for module, name in public_names():
        e = entry_for(module, name, entries)
        assert e is not None, f"{module}.{name} has no reference entry (tests/docs/test_reference.py says more)"
        if e.anchor not in _ids(site, f"reference/{Path(e.page).stem}"):
            missing.append(f"{module}.{name} (#{e.anchor} on reference/{Path(e.page).stem}/)")
    assert not missing, f"reference entries not rendered (no docstring? a griffe failure?): {missing}"


def _internal_link_problems(site: Path, page: str) -> list[str]:
    """Links on ``page`` to pages, files or anchors of the site that do not exist."""
    text = (site / page / "index.html").read_text(encoding="utf-8")
    base = "http://site/" + page
    problems = []
    for href in {html.unescape(h) for h in _HREF.findall(text)}:
        url = urllib.parse.urlsplit(urllib.parse.urljoin(base, href))
        if url.scheme not in ("http", "https") or url.netloc != "site":
            continue  # another host, mailto:, javascript:
        target = site / urllib.parse.unquote(url.path.lstrip("/"))
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"{page or '/'}: link {href!r} to a missing page or file")
            continue
        if url.fragment and target.suffix == ".html":
            ids = set(_ID.findall(target.read_text(encoding="utf-8")))
            if urllib.parse.unquote(url.fragment) not in ids:
                problems.append(f"{page or '/'}: link {href!r} to a missing anchor")
    return problems


def test_internal_links_resolve(site):
    problems = [p for page in _pages(site) for p in _internal_link_problems(site, page)]
    assert not problems, "\n".join(problems)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(site):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"python -m http.server did not answer on {url}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_page_loads_cleanly_in_chromium(site, server):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set GPVI_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the docs extra)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    origin = server.rstrip("/")
    problems, external = [], set()
    pages = _pages(site)
    assert "" in pages and "reference/kernels/" in pages and "guide/convergence/" in pages, pages

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        def route(r):
            if r.request.url.startswith(origin) or r.request.url.startswith("data:"):
                r.continue_()
            else:
                external.add(r.request.url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        current = {"url": ""}

        def on_console(msg):
            if msg.type != "error":
                return
            where = (msg.location or {}).get("url", "")
            if where and not where.startswith(origin) and where in external:
                return  # the console line of a blocked request to another host
            problems.append(f"{current['url']}: console error: {msg.text} ({where})")

        page.on("console", on_console)
        page.on("pageerror", lambda err: problems.append(f"{current['url']}: page error: {err}"))
        page.on("requestfailed", lambda req: req.url.startswith(origin) and problems.append(
            f"{current['url']}: request failed: {req.url} ({req.failure})"))
        page.on("response", lambda res: res.url.startswith(origin) and res.status >= 400 and problems.append(
            f"{current['url']}: HTTP {res.status} for {res.url}"))

        for rel in pages:
            current["url"] = url = server + rel
            page.goto(url, wait_until="load")
            page.wait_for_load_state("networkidle")
            broken = page.evaluate(
                "() => Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
                ".map(i => i.currentSrc || i.src)")
            problems += [f"{url}: image did not load: {src[:120]}" for src in broken]
            if page.locator(".arithmatex").count():
                # MathJax typesets asynchronously: every marked equation becomes an mjx-container
                try:
                    page.wait_for_function(
                        "() => document.querySelectorAll('.arithmatex').length <= "
                        "document.querySelectorAll('.arithmatex mjx-container').length", timeout=15000)
                except sync_api.TimeoutError:
                    problems.append(f"{url}: MathJax did not render the page's equations")
            for name, target in SCREENSHOTS.items():
                if target == rel:
                    page.screenshot(path=str(ARTIFACTS / name))
                    if target.startswith("examples/"):
                        figure = page.locator("img").first
                        if figure.count():
                            figure.scroll_into_view_if_needed()
                            page.wait_for_timeout(500)  # let the header's title transition finish
                            page.screenshot(path=str(ARTIFACTS / name.replace(".png", "-figure.png")))
        browser.close()

    print(f"{len(pages)} pages opened; blocked requests to other hosts: {sorted(external) or 'none'}")
    assert not problems, "\n".join(problems)
    for name in SCREENSHOTS:
        assert (ARTIFACTS / name).stat().st_size > 10_000, f"screenshot {name} is (nearly) empty"


def test_no_page_needs_another_host(site):
    # the site works offline: no script, stylesheet or font from another host (MathJax is served
    # from the site; Material's Google font is off)
    needs = set()
    for rel in _pages(site):
        text = (site / rel / "index.html").read_text(encoding="utf-8")
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", text):
            m = re.search(r'(?:src|href)="(https?://[^"]+)"', tag)
            if m and ("<script" in tag or 'rel="stylesheet"' in tag or "preconnect" in tag):
                needs.add(m.group(1))
    assert not needs, f"pages load resources from other hosts: {sorted(needs)}"
