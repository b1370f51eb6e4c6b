"""The package is a house in layers (docs/architecture.md): a module imports only from its own layer or
the layers below it, counting imports inside functions, and only a few modules sit directly in the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gmts_analysis

PKG = Path(gmts_analysis.__file__).parent

#: bottom to top; a module may import its own layer and the layers below (never one above)
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("util",),
    ("core",),
    ("engine", "toy"),
    ("readers",),
    ("sampling", "options"),
    ("probing",),
    ("analysis",),
    ("views",),
    ("integrations", "rl"),
    ("run",),
    ("api",),
    ("commands", "cli", "__main__", "__init__"),
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
#: a function named by its path, ``"gmts_analysis.commands.compare_job:compare"`` (a command's job,
#: imported when the command runs: options/command.py ``Command.function``)
FUNCTION_PATH = re.compile(r"(gmts_analysis(?:\.\w+)+):\w+")


def _top(dotted: str) -> str:
    """The layer name of ``gmts_analysis.<top>...`` (``__init__`` for the package itself)."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_top(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    return rel.parts[0]


def _package_of(path: Path) -> list[str]:
    """The dotted package ``path`` sits in (``["gmts_analysis", "engine"]``); a file outside the package
    counts as sitting in ``gmts_analysis`` itself."""
    try:
        rel = path.relative_to(PKG)
    except ValueError:
        return ["gmts_analysis"]
    return ["gmts_analysis", *rel.parts[:-1]]


def _imports(path: Path, package: list[str] | None = None) -> list[tuple[int, str]]:
    """Every import of the package in ``path``: at the top, inside functions, relative ones (resolved) and
    ``importlib.import_module`` with a literal name (or an f-string: its literal start), and a function named by
    its path (``"gmts_analysis.x.y:name"``, :data:`FUNCTION_PATH`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package or _package_of(path)
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] != "gmts_analysis":
                continue
            if module == "gmts_analysis":
                out += [(node.lineno, f"gmts_analysis.{a.name}") for a in node.names if a.name != "__version__"]
            else:
                out.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "gmts_analysis"]
        elif (isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module"):
            arg = node.args[0]
            name = arg.value if isinstance(arg, ast.Constant) else (
                arg.values[0].value if isinstance(arg, ast.JoinedStr) and arg.values
                and isinstance(arg.values[0], ast.Constant) else None)
            if isinstance(name, str) and name.startswith("gmts_analysis."):
                out.append((node.lineno, name.rstrip(".")))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = FUNCTION_PATH.fullmatch(node.value)
            if m:
                out.append((node.lineno, m.group(1)))
    return out


def _sources() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if "data" not in p.relative_to(PKG).parts[:1]]


def test_every_module_has_a_layer():
    tops = {_module_top(p) for p in _sources()}
    assert tops <= set(LEVEL), f"modules with no layer in LAYERS: {sorted(tops - set(LEVEL))}"


def test_no_import_points_up():
    upward = []
    for p in _sources():
        own = LEVEL[_module_top(p)]
        for line, mod in _imports(p):
            target = _top(mod)
            if target in LEVEL and LEVEL[target] > own:
                upward.append(f"{p.relative_to(PKG.parent)}:{line} imports {mod} (layer {target} is above {_module_top(p)})")
    assert not upward, "\n".join(upward)


def test_few_modules_sit_directly_in_the_package():
    flat = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= 8, flat


def test_the_layer_check_can_fail(tmp_path):
    """The scan sees an upward import inside a function (the kind a lazy import hides)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from gmts_analysis.run.job import run_job\n")
    assert [(2, "gmts_analysis.run.job")] == _imports(f)
    assert LEVEL[_top("gmts_analysis.run.job")] > LEVEL["core"]


def test_the_layer_check_reads_relative_and_dynamic_imports(tmp_path):
    """A relative import resolves against the module's package; ``importlib.import_module`` with a literal
    name (or an f-string's literal start) counts too, and so does a function named by its path (a command's job)."""
    f = tmp_path / "m.py"
    f.write_text("from ..run import job\n"
                 "from . import ranks\n"
                 "import importlib\n"
                 "def f(name):\n"
                 "    importlib.import_module('gmts_analysis.views.report')\n"
                 "    return importlib.import_module(f'gmts_analysis.commands.{name}')\n"
                 "JOB = Command('x', job='gmts_analysis.run.job:run_probe')\n")
    assert _imports(f, package=["gmts_analysis", "core"]) == [
        (1, "gmts_analysis.run"), (2, "gmts_analysis.core"),
        (5, "gmts_analysis.views.report"), (6, "gmts_analysis.commands"), (7, "gmts_analysis.run.job")]
    assert _package_of(PKG / "engine" / "exact.py") == ["gmts_analysis", "engine"]
