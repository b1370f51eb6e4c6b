"""Where the shipped files are: the toy policies and the example run, inside the package.

They live in ``gmts_analysis/data/`` (installed with the package, wheel or not; the
repository's ``data/policies`` and ``data/example_run`` are links to them).
``GMTS_DATA_DIR`` points elsewhere (a directory holding ``policies/`` and ``example_run/``).
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The shipped data directory: ``$GMTS_DATA_DIR``, else ``gmts_analysis/data`` of this installation."""
    env = os.environ.get("GMTS_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "data"


def policy_dir(name: str) -> Path:
    """Directory of the shipped policy ``name`` (``tiny`` or ``small``); may not exist."""
    return data_dir() / "policies" / name


def example_run_dir() -> Path:
    """The shipped example run (``gmts run`` on the small policy, default settings)."""
    return data_dir() / "example_run"
