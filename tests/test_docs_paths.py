"""Every module the documentation names exists: ``gmts_analysis/...`` paths and ``gmts_analysis.x.y``
dotted names in README.md and docs/*.md (so the docs cannot point at a module that moved; #20).

A dotted name resolves to the longest prefix that is a module or package of the source tree; the
rest must be a name that module defines at top level (a function, class, assignment, import or
``__all__`` entry), then, inside a class, a name of its body. Nothing is imported.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gmts_analysis"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# a repository path starts the name (``~/.cache/gmts_analysis/gguf/`` is no module)
PATH_RE = re.compile(r"(?<![\w/.~-])gmts_analysis/[\w./-]*")
DOTTED_RE = re.compile(r"(?<![\w/.])gmts_analysis(?:\.[A-Za-z_]\w*)+")


def _module_file(parts: list[str]) -> Path | None:
    """The source file of module ``gmts_analysis.<parts>`` (a package's ``__init__.py``), or None."""
    base = PKG.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if parts and base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


@lru_cache(maxsize=None)
def _defined(path: Path) -> dict[str, ast.AST | None]:
    """Top-level names of a module: defs and classes (with their node), assignments, imports, ``__all__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, ast.AST | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.setdefault(n.id, None)
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                for elt in getattr(node.value, "elts", []):
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        names.setdefault(elt.value, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.setdefault((a.asname or a.name).split(".")[0], None)
    return names


def dotted_problem(name: str) -> str | None:
    """Why ``gmts_analysis.a.b.c`` names nothing in the source tree, or None when it does."""
    parts = name.split(".")[1:]
    for i in range(len(parts), -1, -1):
        f = _module_file(parts[:i])
        if f is not None:
            break
    rest = parts[i:]
    if not rest:
        return None
    node = _defined(f).get(rest[0], "missing")
    if node == "missing":
        return f"{'.'.join(['gmts_analysis', *parts[:i]])} defines no '{rest[0]}'"
    if len(rest) > 1 and isinstance(node, ast.ClassDef):
        body = {getattr(n, "name", None) for n in node.body}
        body |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 for t in ast.walk(n.targets[0] if isinstance(n, ast.Assign) else n.target) if isinstance(t, ast.Name)}
        if rest[1] not in body:
            return f"class {rest[0]} has no '{rest[1]}'"
    return None


def path_problem(path: str) -> str | None:
    """Why a ``gmts_analysis/...`` path names nothing in the repository, or None when it exists."""
    path = path.rstrip(".")
    return None if (ROOT / path).exists() else f"no such file or folder: {path}"


def problems(text: str, where: str) -> list[str]:
    """Every module path and dotted name of ``text`` that does not exist, as ``where:line: why``."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in PATH_RE.finditer(line):
            why = path_problem(m.group(0))
            if why:
                out.append(f"{where}:{lineno}: {why}")
        for m in DOTTED_RE.finditer(line):
            why = dotted_problem(m.group(0))
            if why:
                out.append(f"{where}:{lineno}: {m.group(0)}: {why}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_modules_exist(doc):
    found = problems(doc.read_text(encoding="utf-8"), str(doc.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_docs_name_modules_at_all():
    """The scan finds the names it checks (a broken pattern would pass every document); the package tour the
    README held until issue 48 is on docs/getting_started.md, and the scan covers docs/ at every depth."""
    assert ROOT / "docs" / "studies" / "index.md" in DOCS
    text = (ROOT / "docs" / "getting_started.md").read_text(encoding="utf-8")
    assert PATH_RE.search(text) and DOTTED_RE.search(text)


def test_the_check_can_fail():
    """Moved modules, missing names and missing files are all reported; existing ones are not."""
    text = ("see gmts_analysis/finalize.py and gmts_analysis/run/finalize.py (cache: ~/.cache/gmts_analysis/gguf/).\n"
            "`gmts_analysis.stats.compute_stats`, gmts_analysis.analysis.stats.compute_stats, "
            "gmts_analysis.analysis.stats.no_such_function, gmts_analysis.probe, gmts_analysis.api.Run.save, "
            "gmts_analysis.api.Run.no_such_method.")
    found = problems(text, "x.md")
    assert found == [
        "x.md:1: no such file or folder: gmts_analysis/finalize.py",
        "x.md:2: gmts_analysis.stats.compute_stats: gmts_analysis defines no 'stats'",
        "x.md:2: gmts_analysis.analysis.stats.no_such_function: gmts_analysis.analysis.stats defines no "
        "'no_such_function'",
        "x.md:2: gmts_analysis.api.Run.no_such_method: class Run has no 'no_such_method'",
    ], found


# --- repository paths: the docs, the notebooks and the study READMEs name files that exist (issue 48: the
# studies moved to docs/studies/, and a notebook or a record's README still naming docs/rl.md's old sections
# or docs/smollm2_study.md would point nowhere) ----------------------------------------------------------

REPO_PATH_RE = re.compile(r"(?<![\w/.~-])((?:docs|data|notebooks|benchmarks|examples|figures)/[\w./-]*[\w/])")
#: paths the docs name as outputs a command will write (examples), not as files of the repository
NOT_YET_WRITTEN = {"data/rl/full.json", "data/rl/rl.json"}
PATH_DOCS = [*DOCS, ROOT / "figures" / "README.md", *sorted((ROOT / "notebooks").glob("*.ipynb")),
             *sorted(p for d in ("data/smollm2_study", "data/trl_study", "data/rl", "data/trl_pilot_series")
                     for p in (ROOT / d).rglob("README.md"))]


def _prose(path: Path) -> str:
    """A Markdown file's text, or a notebook's markdown cells (its code reads data; the tests run it)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return text
    import json

    cells = json.loads(text)["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def repo_path_problems(text: str, where: str) -> list[str]:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in REPO_PATH_RE.finditer(line):
            p = m.group(1).rstrip(".")
            if line[m.end():].lstrip(".-_")[:1] in ("{", "<", "*"):  # a pattern (rl_report.{json,md}, rl_<stem>): not one file
                continue
            if p not in NOT_YET_WRITTEN and not (ROOT / p).exists():
                out.append(f"{where}:{lineno}: no such file or folder: {p}")
    return out


@pytest.mark.parametrize("doc", PATH_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(doc):
    found = repo_path_problems(_prose(doc), str(doc.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_path_check_can_fail():
    text = ("see docs/smollm2_study.md and docs/studies/smollm2.md, `data/rl/referee/plan.json`, data/rl/nope/, "
            "data/rl/referee/rl_report.{json,md}")
    assert repo_path_problems(text, "x.md") == ["x.md:1: no such file or folder: docs/smollm2_study.md",
                                                "x.md:1: no such file or folder: data/rl/nope/"]
