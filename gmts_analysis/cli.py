"""The ``gmts`` command line: a thin layer of argparse subcommands.

Each subcommand lives in ``gmts_analysis/commands/<module>.py`` with two functions:
``register(subparsers)`` (adds its parser and ``set_defaults(func=run)``) and
``run(args) -> int``. Command modules import heavy libraries inside ``run`` only,
so ``gmts --help`` is fast. Bad input raises :class:`GmtsError`, printed here as one
line on stderr (``gmts: error: ...``) with exit status 2 and no traceback. So is any
unexpected exception, with a hint to rerun with ``--debug`` (which shows the traceback),
and so is a usage error (an unknown flag or a bad flag value).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from gmts_analysis import __version__
from gmts_analysis.errors import GmtsError
from gmts_analysis.options import ALIAS_BY_NAME, ALIASES, GmtsParser, add_fields, install
from gmts_analysis.options.config import Debug
from gmts_analysis.options.fields import opt
from gmts_analysis.options.parser import parser_checks
from gmts_analysis.options.reference import alias_table, options_reference, render_blocks
from gmts_analysis.probing.validate import validate_namespace
from gmts_analysis.util.interrupt import interrupted, sigint_latch
from gmts_analysis.util.progress import bars_off
from gmts_analysis.util.threads import set_threads

# module names under gmts_analysis.commands, in the order `gmts --help` lists them
COMMANDS: list[str] = ["run", "sample", "probe", "merge", "stats", "compare", "series", "figures", "rl", "rl_report", "toy_train", "bench"]


class GmtsArgumentParser(GmtsParser):
    """argparse with one-line usage errors: ``gmts: error: <subcommand>: <message>`` and exit 2,
    and the ecosystem's spellings (underscores, TRL/verl names, ``--config``: :mod:`gmts_analysis.options`)."""

    def error(self, message: str):  # type: ignore[override]
        where = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"gmts: error: {where}{_one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but an unknown flag is refused by the subcommand's parser with the closest
        flags it has (``gmts run --prompts 2`` -> did you mean --num-prompts?)."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            sub = _subparser(self, getattr(ns, "command", None))
            (sub or self).error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(sub or self, extra)}")
        return ns


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) and command in a.choices:
            return a.choices[command]
    return None


def did_you_mean(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """``"; did you mean --num-prompts?"`` for the first unknown flag of ``extra`` that is close to a
    flag of ``parser`` (its shown flags: hidden aliases are not suggested); ``""`` when none is."""
    import difflib

    shown = sorted({s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings
                    if s.startswith("--")})
    for tok in extra:
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0].replace("_", "-")
        close = difflib.get_close_matches(name, shown, n=2, cutoff=0.7)
        close += [s for s in shown if name[2:] and s.endswith("-" + name[2:]) and s not in close][:1]
        if close:
            return f"; did you mean {' or '.join(close[:2])}?"
    return ""


@dataclass
class GmtsFlags:
    """The flags of ``gmts`` itself, before the subcommand."""

    version: str = opt(None, "", action="version")
    debug: bool = opt(False, "show the full traceback of an unexpected error (before the subcommand: gmts --debug "
                      "probe ...)", show_default=False)


def _one_line(text: str) -> str:
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    return " ".join(lines)[:500] if lines else ""


def build_parser() -> argparse.ArgumentParser:
    parser = GmtsArgumentParser(
        prog="gmts",
        description="Which tokens matter in RLVR: entropy vs exact per-token policy-gradient norms.",
    )
    add_fields(parser, GmtsFlags, defaults={"version": _version()}, grouped=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"gmts_analysis.commands.{name}").register(sub)
    for p in set(sub.choices.values()):  # --debug also after the subcommand (keeps the global value if absent)
        add_fields(p, Debug)
    install(parser)  # every flag also with underscores; TRL/verl names as hidden aliases
    return parser


_KNOWN_OS_ERRORS = {
    errno.ENOSPC: "no space left on the device; free some space and run the same command again (a probe "
                  "resumes where it stopped; nothing finished was replaced)",
    errno.EDQUOT: "disk quota exceeded; free some space and run the same command again (a probe resumes "
                  "where it stopped; nothing finished was replaced)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the file system is read-only",
}


def os_error_message(e: OSError) -> str | None:
    """A plain one-line message for a known condition of the system (disk full, quota, permission,
    read-only file system) naming the path at fault; None for any other OSError."""
    what = _KNOWN_OS_ERRORS.get(e.errno)
    if what is None:
        return None
    where = e.filename if e.filename is not None else None
    return f"{where}: {what}" if where else what


def keyword_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """``{keyword: flag}`` of subcommand ``command``: each option's field name (its dest) and the names
    the lower layers give the same setting (TRL/verl aliases, the toy API's ``domain``). A setting keeps one
    name from its flag down (``gmts rl``'s ``max_steps`` is ``--max-steps``), so no other mapping is needed."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {}
    for a in sub._actions:
        own = "--" + a.dest.replace("_", "-")
        if own in a.option_strings:
            flags[a.dest] = own
    for name, al in ALIAS_BY_NAME.items():
        if al.dest in flags:
            flags.setdefault(name, flags[al.dest])
    if "domains" in flags:
        flags.setdefault("domain", flags["domains"])
    return flags


def flag_spelling(message: str, flags: dict[str, str]) -> str:
    """``message`` of a lower layer, which names a setting by its keyword (``kl_beta=0.5: ...``, ``pass
    max_len=``, or ``loss_agg: ...`` at the start), with each keyword of ``flags`` written as its
    command-line flag (``--kl-beta 0.5: ...``, ``pass --max-len``, ``--loss-agg: ...``); the inverse of
    :func:`gmts_analysis.api.api_spelling`."""
    import re

    def keyword_value(m: "re.Match[str]") -> str:
        flag = flags.get(m.group(1))
        if flag is None:
            return m.group(0)
        value, tail = m.group(2), ""
        while value and value[-1] in ":;,)":
            value, tail = value[:-1], value[-1] + tail
        return f"{flag} {value}{tail}" if value else flag + tail

    message = re.sub(r"^([a-z][a-z0-9_]*)(?=:)", lambda m: flags.get(m.group(1), m.group(0)), message)
    return re.sub(r"(?<![\w.'/-])([a-z][a-z0-9_]*)=(\S*)", keyword_value, message)


def as_spelled(message: str, argv: Sequence[str]) -> str:
    """``message`` with each of our flags written as the caller spelled it on the command line
    (``--num-generations`` -> ``--group_size`` when that is what was typed)."""
    import re

    spelled: dict[str, str] = {}
    for tok in argv:
        if not tok.startswith("--") or tok == "--":
            continue
        name = tok.split("=", 1)[0]
        key = name[2:].replace("-", "_")
        al = ALIAS_BY_NAME.get(key)
        ours = "--" + (al.dest if al is not None else key).replace("_", "-")
        if ours != name:
            spelled.setdefault(ours, name)
    for ours, name in spelled.items():
        message = re.sub(re.escape(ours) + r"(?![\w-])", name, message)
    return message


def cli_doc_blocks() -> dict[str, str]:
    """The generated blocks of docs/cli.md (:mod:`gmts_analysis.options.reference`), from the parser."""
    return {"aliases": alias_table(ALIASES), "options": options_reference(build_parser(), ALIASES)}


def write_cli_doc(path: str | os.PathLike | None = None) -> bool:
    """Rewrite the generated blocks of docs/cli.md; True when the file changed."""
    from pathlib import Path

    p = Path(path) if path is not None else Path(__file__).resolve().parent.parent / "docs" / "cli.md"
    old = p.read_text(encoding="utf-8")
    new = render_blocks(old, cli_doc_blocks())
    if new != old:
        p.write_text(new, encoding="utf-8")
    return new != old


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _version() -> str:
    return f"gmts_analysis {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (tests call it in-process). Ctrl-C (SIGINT) at any point
    after the import ends the command with exit 130, even where Python lost its KeyboardInterrupt
    (:mod:`gmts_analysis.util.interrupt`)."""
    with sigint_latch():
        try:
            rc = _main(argv)
        except KeyboardInterrupt:
            rc = 130
        if interrupted() and rc != 130:  # the KeyboardInterrupt was swallowed on the way: still stop
            rc = 130
        if rc == 130:
            print("gmts: interrupted", file=sys.stderr)
    return rc


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    checks = parser_checks(_subparser(parser, args.command))
    quiet = args.quiet  # every subcommand has -q (RunControl or its own options)
    if quiet:  # also silences transformers' "Loading weights" bar (read when it first draws one)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="gmts: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    debug = bool(args.debug)  # gmts --debug (GmtsFlags), or after the subcommand (Debug)
    try:
        validate_namespace(args.command, args, checks)  # every option in its domain before any work
        if hasattr(args, "threads"):  # every subcommand: --threads, else a default that leaves busy cores alone
            args.threads = set_threads(args.threads)
        with bars_off(quiet):  # -q: transformers' loading and GGUF conversion bars too
            rc = args.func(args)
    except GmtsError as e:
        if debug:
            raise
        message = flag_spelling(str(e), keyword_flags(parser, args.command))
        print(f"gmts: error: {_one_line(as_spelled(message, sys.argv[1:] if argv is None else argv))}",
              file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        plain = os_error_message(e)
        if plain is None or debug:
            if debug:
                raise
            print(f"gmts: error: unexpected {type(e).__name__}: {_one_line(e) or '(no message)'} "
                  f"(rerun with gmts --debug {args.command} ... for the traceback)", file=sys.stderr)
            return 2
        print(f"gmts: error: {plain}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug or an input we do not check yet: one line, traceback with --debug
        if debug:
            raise
        print(f"gmts: error: unexpected {type(e).__name__}: {_one_line(e) or '(no message)'} "
              f"(rerun with gmts --debug {args.command} ... for the traceback)", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
