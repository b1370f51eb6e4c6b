"""gmts_analysis: which tokens matter in RLVR.

Per-token entropy, log-probs, exact per-token policy-gradient norms, GMTS scores,
statistics, figures and reports. Definitions: docs/definitions.md.

    import gmts_analysis as gmts
    run = gmts.probe("tiny", "rollouts.jsonl")      # or a loaded model (tokenizer=...), a DataFrame, rows
    run.tokens, run.answers, run.stats, run.manifest
    run.save("runs/mine"); gmts.load_run("runs/mine")

Nothing heavy is imported here: ``import gmts_analysis`` does no work; the names below
are loaded from :mod:`gmts_analysis.api` on first use.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers and the API reference (mkdocs) see the names; nothing is imported at run time
    from gmts_analysis.api import Run, figure_names, load_run, probe, sample
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.options.config import ProbeOptions

__version__ = "0.1.0"

__all__ = ["GmtsError", "ProbeOptions", "Run", "__version__", "figure_names", "load_run", "probe", "sample"]

_LAZY = {
    "probe": "gmts_analysis.api",
    "load_run": "gmts_analysis.api",
    "sample": "gmts_analysis.api",
    "Run": "gmts_analysis.api",
    "figure_names": "gmts_analysis.api",
    "ProbeOptions": "gmts_analysis.options.config",
    "GmtsError": "gmts_analysis.errors",
}


def _notebook_figures() -> None:
    """In IPython, figures display without ``%matplotlib inline`` (:mod:`gmts_analysis.views.ipython`)."""
    import sys

    if "IPython" in sys.modules:
        from gmts_analysis.views.ipython import quiet_widgetless_tqdm, register_figure_formatter  # deferred: optional

        register_figure_formatter()
        quiet_widgetless_tqdm()


_notebook_figures()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gmts_analysis' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
