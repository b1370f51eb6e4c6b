"""The argparse flags of every subcommand, built from the options' declarations.

:func:`add_fields` is the one place a flag is added (positional arguments aside): one
``--flag`` per field of the given option dataclasses (:mod:`gmts_analysis.options.fields`),
in its ``--help`` group, with its unit (metavar) and its default stated. The parser keeps the
fields it was built from (:func:`parser_fields`): ``gmts`` checks every parsed value with its
field's ``check`` before any work (:func:`gmts_analysis.probing.validate.validate_namespace`).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gmts_analysis.options.fields import DEFAULT_GROUP, GROUPS, fields_of, flag


class ExamplesHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that an epilog starting with ``examples:`` keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def help_group(parser: argparse.ArgumentParser, group: str | None) -> Any:
    """The ``--help`` argument group ``group`` of ``parser`` (all of :data:`GROUPS` are created, in
    that order, on first use; None: :data:`DEFAULT_GROUP`)."""
    groups = getattr(parser, "_gmts_groups", None)
    if groups is None:
        groups = {g: parser.add_argument_group(g) for g in GROUPS}
        parser._gmts_groups = groups
    return groups[group or DEFAULT_GROUP]


def parser_fields(parser: argparse.ArgumentParser) -> dict[str, dataclasses.Field]:
    """The option fields ``parser`` was built from (``{dest: field}``)."""
    return dict(getattr(parser, "_gmts_fields", {}))


def _shown(default: Any) -> str:
    if default is None:
        return "none"
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def add_fields(parser: argparse.ArgumentParser, *classes: type, skip: tuple[str, ...] = (),
               defaults: dict[str, Any] | None = None, grouped: bool = True) -> None:
    """One flag per field of the option dataclasses ``classes``, each name once (a field of a later
    class that an earlier one already declares is skipped). ``defaults``: this command's own default
    of a field. ``grouped=False``: in the parser's plain ``options`` list (the top-level ``gmts``)."""
    known = getattr(parser, "_gmts_fields", None)
    if known is None:
        known = parser._gmts_fields = {}
    for f in fields_of(*classes, skip=skip).values():
        if f.metadata.get("cli") is False or f.name in known:
            continue
        md = f.metadata
        default = (defaults or {}).get(f.name, f.default_factory() if f.default is dataclasses.MISSING
                                       else f.default)
        where = help_group(parser, md.get("group")) if grouped else parser
        _add(where, f, md, default)
        known[f.name] = f


def _add(where: Any, f: dataclasses.Field, md: Any, default: Any) -> None:
    """``add_argument`` for one field: a switch, a version flag or a value."""
    help_ = md.get("help", "")
    names = [md["short"], flag(f.name)] if md.get("short") else [flag(f.name)]
    show = md.get("show_default", True)
    if md.get("action") == "version":
        where.add_argument(*names, action="version", version=default, **({"help": help_} if help_ else {}))
        return
    if f.type in (bool, "bool"):
        if md.get("flag_off"):
            where.add_argument(md["flag_off"], action="store_false", dest=f.name, default=default,
                               help=md.get("help_off") or f"skip: {help_} (default: done)")
            return
        if show and "(default" not in help_:
            help_ += " (default: off)"
        kw = {"default": argparse.SUPPRESS} if md.get("suppress_default") else {}
        where.add_argument(*names, action="store_true", help=help_, dest=f.name, **kw)
        return
    kw: dict[str, Any] = {"dest": f.name,
                          "type": md.get("type") or {"int": int, "float": float, int: int, float: float}.get(f.type, str)}
    if "metavar" in md:
        kw["metavar"] = md["metavar"]
    for key in ("choices", "nargs"):
        if key in md:
            kw[key] = md[key]
    if md.get("required"):
        kw["required"] = True
    else:
        kw["default"] = default
        if show and "(default" not in help_:
            help_ += f" (default: {_shown(default)})"
    where.add_argument(*names, help=help_, **kw)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build a dataclass from parsed args (fields absent from ``args`` keep defaults)."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    kw.update(overrides)
    return cls(**kw)


def parser_checks(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``{dest: check}`` of every option of ``parser``: its fields' declared checks."""
    out = {dest: f.metadata.get("check") for dest, f in parser_fields(parser).items()}
    return {k: v for k, v in out.items() if v is not None}
