"""Ctrl-C that always stops a command: a SIGINT latch for the command line.

Python turns SIGINT into a :class:`KeyboardInterrupt` raised wherever the main thread happens to be.
Where that is a ``__del__``, a weakref or garbage-collector callback, or a library's cleanup code, the
exception is printed as "Exception ignored" (or caught) and lost, and the command would go on to
finish with exit 0. :func:`sigint_latch` (installed by ``gmts``'s ``main``) records the signal before
raising, so that :func:`raise_if_interrupted` at the probe's safe points (each answer, each chunk,
before the finished run is put in place) and ``main`` itself still stop with exit 130; the work
recorded so far is kept for the resume. While the latch is on, such a lost KeyboardInterrupt is not printed
either (Python's "Exception ignored in ... Traceback" on stderr): the command's one line says it, once.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

_INTERRUPTED = threading.Event()


def _handler(signum: int, frame: Any) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def _quiet_lost_interrupt(previous: Any) -> Any:
    """A :data:`sys.unraisablehook` that drops the latch's own KeyboardInterrupt where Python cannot raise it
    (a ``__del__`` or a garbage-collector callback: the latch has recorded it) and passes everything else on."""

    def hook(unraisable: Any) -> None:
        if _INTERRUPTED.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    return hook


@contextlib.contextmanager
def sigint_latch() -> Iterator[None]:
    """Within the block, SIGINT is latched (see the module docstring) and raises KeyboardInterrupt;
    the previous handler comes back after it. Outside the main thread: nothing is installed."""
    _INTERRUPTED.clear()
    try:
        previous = signal.signal(signal.SIGINT, _handler)
    except ValueError:  # not the main thread of the main interpreter
        yield
        return
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_lost_interrupt(previous_hook)
    # (main reads interrupted() inside the block)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook
        _INTERRUPTED.clear()  # a later API call in this process is not stopped by an old Ctrl-C


def interrupted() -> bool:
    """Whether a SIGINT arrived within :func:`sigint_latch`."""
    return _INTERRUPTED.is_set()


def raise_if_interrupted() -> None:
    """Raise :class:`KeyboardInterrupt` when a SIGINT arrived whose exception was lost on the way."""
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt
