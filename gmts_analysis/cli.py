"""The ``gmts`` command line: a thin layer of argparse subcommands.

Each subcommand lives in ``gmts_analysis/commands/<module>.py`` with two functions:
``register(subparsers)`` (adds its parser and ``set_defaults(func=run)``) and
``run(args) -> int``. Command modules import heavy libraries inside ``run`` only,
so ``gmts --help`` is fast. Bad input raises :class:`GmtsError`, printed here as one
line on stderr with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from gmts_analysis.errors import GmtsError

# module names under gmts_analysis.commands, in the order `gmts --help` lists them
COMMANDS: list[str] = ["run", "sample", "probe", "merge", "stats", "figures", "rl", "toy_train", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gmts",
        description="Which tokens matter in RLVR: entropy vs exact per-token policy-gradient norms.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"gmts_analysis.commands.{name}").register(sub)
    return parser


def _version() -> str:
    from gmts_analysis import __version__

    return f"gmts_analysis {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (tests call it in-process)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet = getattr(args, "quiet", False)
    if quiet:  # also silences transformers' "Loading weights" bar (read when it first draws one)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="gmts: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    try:
        rc = args.func(args)
    except GmtsError as e:
        print(f"gmts: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gmts: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
