"""Figures that show themselves in a notebook, without ``%matplotlib inline``.

Our figures are ``matplotlib.figure.Figure`` objects made without pyplot, so IPython has
no formatter for them until a matplotlib backend is activated: a fresh kernel prints
``<Figure size 740x460 with 1 Axes>``. :func:`register_figure_formatter` gives IPython a PNG
formatter for ``Figure`` (by name, so matplotlib is not imported for it), unless one is
registered already (``%matplotlib inline`` registers its own). ``import gmts_analysis`` calls
it when IPython is running, and :func:`quiet_widgetless_tqdm`; it changes nothing else.
"""

from __future__ import annotations

import io
import sys
from typing import Any

from gmts_analysis.util.progress import widgetless_kernel


def figure_png(fig: Any) -> bytes:
    """The PNG bytes of a matplotlib figure, as the inline backend draws it (tight box)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=getattr(fig, "dpi", 100))
    return buf.getvalue()


def register_figure_formatter() -> bool:
    """Register :func:`figure_png` for ``matplotlib.figure.Figure`` in the running IPython shell;
    returns True when it did (False: no shell, or a formatter for figures exists)."""
    ip = sys.modules.get("IPython")
    get = getattr(ip, "get_ipython", None) if ip is not None else None
    shell = get() if get is not None else None
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    png = shell.display_formatter.formatters.get("image/png")
    if png is None:
        return False
    key = ("matplotlib.figure", "Figure")
    if key in png.deferred_printers or any(getattr(t, "__name__", "") == "Figure" and
                                           getattr(t, "__module__", "") == "matplotlib.figure"
                                           for t in png.type_printers):
        return False
    png.for_type_by_name(*key, figure_png)
    return True


def quiet_widgetless_tqdm() -> None:
    """In a kernel without ipywidgets, ignore tqdm's ``IProgress not found`` warning, which
    ``import transformers`` (through ``tqdm.auto``) prints into the cell; our own bars are one
    line there (:mod:`gmts_analysis.util.progress`), transformers' loading bars are off."""
    import warnings

    if widgetless_kernel():
        warnings.filterwarnings("ignore", message="IProgress not found")
