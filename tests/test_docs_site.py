"""The front page and the docs site (issue 48): the README is a short front page whose set-up commands are the
ones CI runs; the site (mkdocs.yml, built from docs/) builds strictly; every local link of the README, the
docs and the studies' READMEs resolves (files and anchors; no network); and the built home and API pages render
in headless Chromium with the headline figure and ``gmts_analysis.probe`` with its parameters.

Needs the ``docs`` extra (``pip install -e ".[docs]"``, as the README's test command and .ci/run install it);
the browser test needs chromium (.ci/run installs it) and skips without one.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from _browser import Browser, find_browser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIGURE = "data/smollm2_study/run/figures/within_vs_cross.png"
#: the Markdown whose local links must resolve: the front page, every docs page, the studies' data READMEs
LINKED = [README, *sorted((ROOT / "docs").rglob("*.md")),
          *sorted(p for d in ("data/smollm2_study", "data/trl_study", "data/rl", "data/trl_pilot_series")
                  for p in (ROOT / d).rglob("README.md"))]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```bash blocks of ``text``, in order."""
    return [m.group(1).strip() for m in re.finditer(r"```bash\n(.*?)```", text, re.S)]


# ------------------------------------------------------------------------------ the front page


def test_readme_is_a_front_page():
    """At most 200 lines; the two set-up commands first; the headline figure shown; no generated study block."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    first, second = bash_blocks(text)[:2]
    assert first == ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
                     "pip install -e . && gmts run")
    assert second.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && ")
    assert second.endswith("&& python -m pytest") and '".[dev,trl,math,real,docs]"' in second
    assert text.index(first) < text.index("![") < text.index("## A short tour")  # commands, then the figure
    assert f"]({FIGURE})" in text and (ROOT / FIGURE).is_file()
    assert "<!-- gmts-" not in text, "a generated block on the front page: it belongs on the study's page"
    for page in ("docs/getting_started.md", "docs/api.md", "docs/cli.md", "docs/studies/index.md"):
        assert f"]({page})" in text, page


def test_ci_installs_as_the_readme_says():
    """.ci/run runs the installs of the README's two set-up commands, each in its order (the first one quietly,
    ``pip install -q``; the second as written, the docs extra included)."""
    lines = [line.strip().replace("pip install -q ", "pip install ")
             for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    for command in bash_blocks(README.read_text(encoding="utf-8"))[:2]:
        installs = [s.strip() for s in command.split("&&") if s.strip().startswith("pip install")]
        assert installs, command
        at = 0
        for step in installs:
            assert step in lines[at:], f".ci/run lacks the README's `{step}` (after its line {at})"
            at = lines.index(step, at) + 1
    assert 'pip install -e ".[dev,trl,math,real,docs]"' in lines


# ------------------------------------------------------------------------------ links


def github_slug(heading: str) -> str:
    """The anchor a code host gives a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors_of(md: Path) -> set[str]:
    """The heading anchors of a Markdown file (code blocks skipped; repeated headings numbered)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            slug = github_slug(m.group(1))
            n = seen.get(slug, 0)
            out.add(slug if n == 0 else f"{slug}-{n}")
            seen[slug] = n + 1
    return out


def markdown_link_problems(md: Path) -> list[str]:
    """Every local link of ``md`` whose file or anchor does not exist, as ``path:line: link: why``."""
    out = []
    fenced = False
    for lineno, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            parts = urlsplit(target)
            if parts.scheme or target.startswith("//"):
                continue  # external: not checked (no network)
            path = (md.parent / unquote(parts.path)).resolve() if parts.path else md
            where = f"{md.relative_to(ROOT)}:{lineno}: {target}"
            if not path.exists():
                out.append(f"{where}: no such file")
            elif parts.fragment and path.suffix == ".md" and parts.fragment not in anchors_of(path):
                out.append(f"{where}: no heading #{parts.fragment} in {path.relative_to(ROOT)}")
    return out


@pytest.mark.parametrize("md", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_resolve(md):
    found = markdown_link_problems(md)
    assert not found, "\n".join(found)


def test_the_link_check_can_fail(tmp_path):
    doc = ROOT / "docs" / "_link_check_probe.md"  # inside the tree, so relative paths mean what they say
    try:
        doc.write_text("[ok](rl.md#3b-live-diagnostics-while-training-gmts-metrics) [gone](no_such_page.md)\n"
                       "[bad anchor](rl.md#no-such-heading) `[in code](nowhere.md)` [web](https://example.org/x)\n"
                       "![fig](../data/smollm2_study/run/figures/within_vs_cross.png)\n", encoding="utf-8")
        found = markdown_link_problems(doc)
    finally:
        doc.unlink()
    assert found == ["docs/_link_check_probe.md:1: no_such_page.md: no such file",
                     "docs/_link_check_probe.md:2: rl.md#no-such-heading: no heading #no-such-heading in docs/rl.md"]


# ------------------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built as CI builds it: ``mkdocs build --strict`` (a warning fails the build)."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    return out


def _env() -> dict:
    import os

    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    return env


def test_site_has_every_page(site):
    for page in ("index.html", "getting_started.html", "definitions.html", "cli.html", "api.html", "rl.html",
                 "training_real.html", "scaling.html", "studies/index.html", "studies/smollm2.html",
                 "studies/trl.html", "studies/referee.html", "studies/replication.html", "studies/toy_rl.html"):
        assert (site / page).is_file(), page
    assert (site / "repo" / FIGURE).read_bytes() == (ROOT / FIGURE).read_bytes()  # the record, copied as it is


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\sid="([^"]+)"', page.read_text(encoding="utf-8")))


def site_link_problems(site: Path) -> list[str]:
    """Every local href/src of the built site whose file or anchor is missing."""
    out = []
    for page in sorted(site.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        for attr, target in re.findall(r'\s(href|src)="([^"]*)"', text):
            target = html.unescape(target)
            parts = urlsplit(target)
            if parts.scheme or target.startswith("//") or not (parts.path or parts.fragment):
                continue
            base = site if parts.path.startswith("/") else page.parent  # 404.html links from the server's root
            path = (base / unquote(parts.path.lstrip("/"))).resolve() if parts.path else page
            if path.is_dir():
                path = path / "index.html"
            where = f"{page.relative_to(site)}: {attr}={target}"
            if not path.exists():
                out.append(f"{where}: no such file")
            elif parts.fragment and path.suffix == ".html" and parts.fragment not in _ids(path):
                out.append(f"{where}: no id {parts.fragment}")
    return out


def test_site_links_resolve(site):
    found = site_link_problems(site)
    assert not found, "\n".join(found[:40])


def test_api_reference_is_generated_from_the_docstrings(site):
    text = html.unescape(re.sub(r"<[^>]+>", " ", (site / "api.html").read_text(encoding="utf-8")))
    text = re.sub(r"\s+", " ", text)
    for name in ("gmts_analysis.probe", "gmts_analysis.sample", "gmts_analysis.load_run", "gmts_analysis.Run",
                 "SelectiveGRPOConfig", "SelectiveGRPOTrainer", "GmtsDiagnosticsCallback",
                 "gmts_analysis.core.scores.register", "FIGURE_ENTRIES", "register_format", "LOSS_TERMS"):
        assert name in text, name
    # the Args:/Returns: sections became parameter tables
    assert "Parameters:" in text and "Returns:" in text
    assert not re.search(r":(func|class|meth|data|mod):", text)  # Sphinx roles dropped by docs/hooks.py


needs_browser = pytest.mark.skipif(find_browser() is None, reason="no chromium binary (see .ci/run)")


@needs_browser
def test_site_renders_in_headless_chromium(site, tmp_path):
    with Browser() as b:
        home = b.open(site / "index.html")
        assert home.eval("document.querySelectorAll('img').length") >= 1
        assert home.eval("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        assert home.eval("Array.from(document.images).some(i => i.src.endsWith('within_vs_cross.png') "
                         "&& i.naturalWidth > 1000)")
        assert home.problems() == []
        api = b.open(site / "api.html")
        heads = api.eval("Array.from(document.querySelectorAll('h2, h3, h4')).map(e => e.textContent).join('\\n')")
        assert "gmts_analysis.probe" in heads
        sig = api.eval("Array.from(document.querySelectorAll('.doc-signature')).map(e => e.textContent)"
                       ".find(t => t.includes('probe(')) || ''")
        for param in ("model", "rollouts", "tokenizer", "progress", "threads", "options"):
            assert re.search(rf"\b{param}\b", sig), (param, sig)
        body = api.eval("document.body.innerText")
        assert "grad_norm" in body and "Returns:" in body
        assert api.screenshot(tmp_path / "api.png").stat().st_size > 10_000
        assert api.problems() == []



def test_docs_extra_installs_what_the_build_needs():
    """The ``docs`` extra names the build's packages: MkDocs, the Material theme, mkdocstrings and its Python
    handler (mkdocs.yml's theme and plugin)."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] for r in extras["docs"]}
    assert names == {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python"}, names
    conf = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "name: material" in conf and "- mkdocstrings:" in conf and "docs_dir: docs" in conf
