"""Progress bars that suit where they are drawn: a terminal, or a notebook with or without widgets.

``tqdm.auto`` in a Jupyter kernel without ipywidgets warns (``TqdmWarning: IProgress not
found``) and then writes every refresh into the cell's output (dozens of lines in a saved
notebook). :func:`tqdm` here uses the widget bar when ipywidgets is installed, the terminal bar
outside a kernel, and in a kernel without widgets one clean line, written when the bar closes.
Bars go to stderr.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import sys
from typing import Any, Iterator

#: True inside :func:`bars_off` (``-q``, ``quiet=True``): transformers' own bars are silenced too
_BARS_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("gmts_bars_off", default=False)


@contextlib.contextmanager
def bars_off(off: bool = True) -> Iterator[None]:
    """Within the block (when ``off``), :func:`quiet_transformers` also hides transformers' "Loading
    weights", "Writing model shards" and GGUF "Converting and de-quantizing" bars (``-q``, ``quiet=True``)."""
    token = _BARS_OFF.set(bool(off) or _BARS_OFF.get())
    try:
        yield
    finally:
        _BARS_OFF.reset(token)


def in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel."""
    ip = sys.modules.get("IPython")
    get = getattr(ip, "get_ipython", None) if ip is not None else None
    shell = get() if get is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def widgetless_kernel() -> bool:
    """True inside a Jupyter kernel where ipywidgets is not installed (``tqdm.auto`` would warn there)."""
    return in_kernel() and importlib.util.find_spec("ipywidgets") is None


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """A tqdm bar (same arguments as ``tqdm.tqdm``) for the place it is drawn (module docstring)."""
    if in_kernel():
        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm as bar

            return bar(*args, **kwargs)
        kwargs["leave"] = True
        kwargs.setdefault("file", sys.stderr)
        return _line_at_close()(*args, **kwargs)
    from tqdm import tqdm as bar

    kwargs.setdefault("file", sys.stderr)
    return bar(*args, **kwargs)


def _line_at_close() -> type:
    """A terminal tqdm that draws nothing until it closes, then its final line (for a kernel without widgets)."""
    from tqdm import tqdm as std

    class LineAtClose(std):  # type: ignore[misc, valid-type]
        _closing = False

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if not self._closing:
                return True
            return super().display(msg, pos)

        def close(self) -> None:
            self._closing = True
            super().close()

    return LineAtClose


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own loading report (we raise our own one-line error instead)."""
    import logging

    from transformers.utils import logging as hf_logging

    lg = logging.getLogger("transformers")
    old = lg.level
    lg.setLevel(logging.ERROR)
    # in a notebook without ipywidgets, transformers' "Loading weights" bar (tqdm.auto) would warn
    # "IProgress not found" and write every refresh into the cell: no bar there
    # and under -q / quiet=True no bar at all (the GGUF loader draws its own tqdm.auto bar: replaced here)
    quiet = _BARS_OFF.get()
    off = (quiet or widgetless_kernel()) and hf_logging.is_progress_bar_enabled()
    if off:
        hf_logging.disable_progress_bar()
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils") if quiet else None
    if quiet and gguf_utils is None:
        with contextlib.suppress(Exception):
            import transformers.modeling_gguf_pytorch_utils as gguf_utils  # type: ignore[no-redef]
    gguf_bar = getattr(gguf_utils, "tqdm", None)
    if gguf_bar is not None:
        gguf_utils.tqdm = _no_bar  # type: ignore[union-attr]
    try:
        yield
    finally:
        lg.setLevel(old)
        if off:
            hf_logging.enable_progress_bar()
        if gguf_bar is not None:
            gguf_utils.tqdm = gguf_bar  # type: ignore[union-attr]


def _no_bar(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
    """tqdm's call shape, drawing nothing."""
    return iterable
