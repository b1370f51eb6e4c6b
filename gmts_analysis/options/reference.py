"""The generated parts of ``docs/cli.md``: the alias table and every subcommand's options.

Both are rendered from the declarations (:mod:`gmts_analysis.options.fields`) through the built
parser, so the document cannot drift from ``--help``; ``tests/test_cli_doc.py`` fails when
``docs/cli.md`` is not current. Regenerate with
``python -c "from gmts_analysis.cli import write_cli_doc; write_cli_doc()"``.
"""

from __future__ import annotations

import argparse
import re

from gmts_analysis.options.fields import GROUPS, Alias, flag

#: the markers around each generated block of docs/cli.md
BLOCKS = ("aliases", "options")


def _marker(name: str, end: bool = False) -> str:
    return f"<!-- gmts-cli-{name}:{'end' if end else 'begin'} (generated: do not edit) -->"


def alias_table(aliases: tuple[Alias, ...]) -> str:
    """The markdown table of TRL's and verl's names (``ALIASES``)."""
    rows = ["| name | our option | from |", "|---|---|---|"]
    for a in aliases:
        values = "" if a.values is None else " (" + ", ".join(f"{k} -> {v}" for k, v in a.values.items()) + ")"
        rows.append(f"| `--{a.name}` | `{flag(a.dest)}`{values} | {a.origin} |")
    return "\n".join(rows)


def _cell(text: str | None) -> str:
    return re.sub(r"\s+", " ", (text or "").replace("|", "\\|")).strip()


def _usage(a: argparse.Action) -> str:
    names = ", ".join(a.option_strings)
    if a.nargs == 0:
        return names
    metavar = a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper())
    return f"{names} {metavar}{' ...' if a.nargs in ('+', '*') else ''}"


def options_table(parser: argparse.ArgumentParser, aliases: tuple[Alias, ...]) -> str:
    """One markdown table of a subcommand's options, group by group (as ``--help`` lists them), with
    the other names each takes."""
    by_dest: dict[str, list[str]] = {}
    for a in aliases:
        by_dest.setdefault(a.dest, []).append(f"`--{a.name}`")
    rows = ["| group | flag | what (default) | also |", "|---|---|---|---|"]
    groups = {g.title: g._group_actions for g in parser._action_groups}
    for title in ("positional arguments", *GROUPS):
        for a in groups.get(title, []):
            if a.help == argparse.SUPPRESS or a.dest in ("help", "debug"):
                continue
            also = ", ".join(by_dest.get(a.dest, [])) if a.option_strings else ""
            rows.append(f"| {title} | `{_usage(a)}` | {_cell(a.help)} | {also} |")
    return "\n".join(rows)


def options_reference(root: argparse.ArgumentParser, aliases: tuple[Alias, ...]) -> str:
    """Every subcommand's options table, in the order ``gmts --help`` lists them."""
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    parts = []
    for name, p in sub.choices.items():
        parts.append(f"### `gmts {name}`\n\n{options_table(p, aliases)}")
    return "\n\n".join(parts)


def render_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each generated block (between its markers) replaced by ``blocks[name]``."""
    for name, body in blocks.items():
        begin, end = _marker(name), _marker(name, end=True)
        if begin not in text or end not in text:
            raise ValueError(f"docs/cli.md has no {begin} ... {end} block")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    return text
