"""Command-line conventions shared by every ``gmts`` subcommand: the ecosystem's spellings.

Users arrive with TRL and verl command lines and config files. This module makes the
``gmts`` parser accept them, without a second name for anything in ``--help``:

- every long flag in either spelling: ``--loss-agg`` and ``--loss_agg`` (TRL's
  ``HfArgumentParser`` accepts both); a switch spelled with underscores also takes an
  optional value as TRL's do (``--mask_truncated_completions true``);
- TRL ``GRPOConfig`` and verl config names as aliases of ours (table :data:`ALIASES`,
  values mapped where the two tools spell them differently, e.g. TRL's
  ``scale_rewards=True`` is ``--advantage group``);
- ``--config FILE.yaml`` (where a subcommand offers it), like TRL's parser: the keys are
  option names in any of the spellings above, a command-line flag overrides the file, and an
  unknown key is refused with its name.

Every alias used (on the command line or in the file) is recorded in the parsed namespace
as ``aliases`` = ``{"--epsilon": "clip_low", "run.yaml: beta": "kl_beta"}``; ``gmts probe``
writes it into the run's manifest. :class:`~gmts_analysis.options.gmts_parser.GmtsParser` is the parser class of the whole
``gmts`` command (subparsers inherit it); :func:`install` adds the spellings once every
subcommand is registered.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from gmts_analysis.options.config import DECLARED
from gmts_analysis.options.fields import Alias, aliases_of, fields_of
from gmts_analysis.options.fields import resolve_aliases as resolve_with

CONFIG_FLAG = "--config"


#: TRL GRPOConfig and verl config names accepted for our options, as declared on the option fields
#: (``aliases=`` of :func:`~gmts_analysis.options.fields.opt`). An alias applies wherever a subcommand
#: has an option of its ``dest``.
ALIASES: tuple[Alias, ...] = aliases_of(*DECLARED)
ALIAS_BY_NAME = {a.name: a for a in ALIASES}
#: our options whose name is also TRL's (GRPOConfig; declared ``trl_name=True``): spelled TRL's way
#: (``--loss_type``, or the API keyword) they are recorded in ``aliases`` too, mapped to themselves, so
#: the manifest lists every TRL name used
TRL_NAMES: tuple[str, ...] = tuple(name for name, f in fields_of(*DECLARED).items() if f.metadata.get("trl_name"))


_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}


def _bool(s: str) -> bool:
    v = str(s).strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{s}'")


class _Spelling(argparse.Action):
    """Another spelling of ``target``: maps its values, records the alias, then acts as ``target``."""

    def __init__(self, option_strings: list[str], target: argparse.Action, alias: Alias | None):
        self.target = target
        self.alias = alias
        switch = isinstance(target, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        nargs = "?" if switch else target.nargs
        super().__init__(option_strings, dest=target.dest, nargs=nargs, const=None if not switch else True,
                         help=argparse.SUPPRESS, metavar=target.metavar)

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: D102
        t = self.target
        if isinstance(t, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            on = True if values in (None, True) else _bool(values)
            setattr(namespace, t.dest, t.const if on else (not t.const))
        else:
            if self.alias is not None and self.alias.values is not None:
                vs = values if isinstance(values, list) else [values]
                mapped = []
                for v in vs:
                    key = str(v).strip().lower()
                    if key not in self.alias.values:
                        raise argparse.ArgumentError(
                            self, f"invalid value '{v}' (choose from {', '.join(self.alias.values)})")
                    mapped.append(self.alias.values[key])
                values = mapped if isinstance(values, list) else mapped[0]
            strings = values if isinstance(values, list) else [values]
            converted = parser._get_values(t, [str(s) for s in strings]) if strings != [None] else t.const
            t(parser, namespace, converted, option_string)
        if self.alias is not None:
            _record(namespace, option_string or self.option_strings[0], t.dest)


def _record(namespace: argparse.Namespace, name: str, dest: str) -> None:
    d = getattr(namespace, "aliases", None)
    if not isinstance(d, dict):
        d = {}
        namespace.aliases = d
    d[name] = dest


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            out += list(dict.fromkeys(a.choices.values()))
    return out


def install(parser: argparse.ArgumentParser) -> None:
    """Add underscore spellings of every long flag and the :data:`ALIASES` whose option exists,
    to ``parser`` and (recursively) its subcommands. Hidden from ``--help``."""
    table = parser._option_string_actions
    by_dest: dict[str, argparse.Action] = {}
    for a in list(parser._actions):
        if not a.option_strings or isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if not isinstance(a, (argparse._StoreFalseAction,)) or a.dest not in by_dest:
            by_dest.setdefault(a.dest, a)
        for s in a.option_strings:
            if s.startswith("--") and "-" in s[2:]:
                u = "--" + s[2:].replace("-", "_")
                if u not in table:
                    trl = a.dest in TRL_NAMES and u == "--" + a.dest
                    table[u] = (_Spelling([u], a, Alias(a.dest, a.dest, f"TRL GRPOConfig.{a.dest}")) if trl
                                else _Spelling([u], a, None) if _is_switch(a) else a)
    for al in ALIASES:
        target = by_dest.get(al.dest)
        if target is None or _is_switch(target):
            continue
        for spelling in {"--" + al.name, "--" + al.name.replace("_", "-")}:
            if spelling not in table:
                table[spelling] = _Spelling([spelling], target, al)
    for sp in _subparsers(parser):
        install(sp)


def _is_switch(a: argparse.Action) -> bool:
    return isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))


def _dests_given(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """Destinations of the options that appear in ``argv`` (any spelling)."""
    out = set()
    for tok in argv:
        if not tok.startswith("--"):
            continue
        a = parser._option_string_actions.get(tok.split("=", 1)[0])
        if a is not None:
            out.add(a.target.dest if isinstance(a, _Spelling) else a.dest)
    return out


def resolve_aliases(kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """:func:`gmts_analysis.options.fields.resolve_aliases` over :data:`ALIASES` (TRL/verl names of every
    declared option) for the Python API."""
    return resolve_with(kwargs, names, ALIASES)
