"""MkDocs hooks of the docs site (mkdocs.yml ``hooks``): figures that live beside their study's records.

A page shows a committed figure where it lies in the repository (``../data/smollm2_study/run/figures/x.png``
from a page of docs/), so the Markdown reads the same on a code host. The site has only docs/, so every image
link that leaves docs/ is copied into the site under ``repo/<path in the repository>`` and the link rewritten to
it; nothing is copied into docs/ and no record moves. An image that does not exist is left as it is, and the
strict build reports it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
#: where repository files land in the site
PREFIX = "repo"
IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s]+)(\))")


def _outside(page_uri: str, target: str) -> str | None:
    """The repository path of ``target`` (a link of the page ``page_uri``) when it leaves docs/, else None."""
    if "://" in target or target.startswith(("#", "/")):
        return None
    rel = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), target))
    if rel.startswith("docs/") or rel.startswith("../"):
        return None
    return rel if (REPO / rel).is_file() else None


def on_files(files, config):
    """Add every image that a page links outside docs/ to the site, as ``repo/<path>``."""
    for f in list(files.documentation_pages()):
        text = Path(f.abs_src_path).read_text(encoding="utf-8")
        for m in IMAGE.finditer(text):
            rel = _outside(f.src_uri, m.group(2))
            if rel is not None and files.get_file_from_path(f"{PREFIX}/{rel}") is None:
                files.append(File.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(REPO / rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    """Point the page's image links that leave docs/ at their copies under ``repo/``."""
    src = page.file.src_uri

    def sub(m: re.Match) -> str:
        rel = _outside(src, m.group(2))
        if rel is None:
            return m.group(0)
        return m.group(1) + posixpath.relpath(f"{PREFIX}/{rel}", posixpath.dirname(src) or ".") + m.group(3)

    return IMAGE.sub(sub, markdown)


ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc):(?=<code>)")


def on_page_content(html, page, config, files):
    """Docstrings use Sphinx roles (``:func:`x```), which mkdocstrings leaves as text before the code: drop them."""
    return ROLE.sub("", html)
