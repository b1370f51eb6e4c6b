"""Where the shipped files are: the toy policies and the example run, inside the package.

They live in ``gmts_analysis/data/`` (installed with the package, wheel or not; the
repository's ``data/policies`` and ``data/example_run`` are links to them).
``GMTS_DATA_DIR`` points elsewhere (a directory holding ``policies/`` and ``example_run/``).
The SmolLM2 study's run (``data/smollm2_study/run``) is the repository's, not the package's:
:func:`study_run_dir` finds it beside a checkout.
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


#: the SmolLM2-135M-Instruct study's probe run, relative to the repository root (docs/studies/smollm2.md)
STUDY_RUN = Path("data") / "smollm2_study" / "run"


def study_run_dir() -> Path | None:
    """The SmolLM2 study's run directory of the repository this package is checked out in (a real model: 384
    answers to 96 word problems), or None when the package is installed without the repository's data."""
    d = Path(__file__).resolve().parent.parent.parent / STUDY_RUN
    return d if (d / "stats.json").is_file() and (d / "tokens.parquet").is_file() else None
