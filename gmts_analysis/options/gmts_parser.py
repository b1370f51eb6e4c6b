"""The parser class of the whole ``gmts`` command line: argparse with the conventions of
:mod:`gmts_analysis.options.spellings` (TRL/verl names, underscores) and ``--config FILE``
(:mod:`gmts_analysis.options.config_file`) expanded before parsing."""

from __future__ import annotations

import argparse
import os

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config_file import _expand_config
from gmts_analysis.options.spellings import ALIAS_BY_NAME, CONFIG_FLAG, _dests_given, _Spelling


class GmtsParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the conventions of this module (see the module docstring).

    Subparsers created with ``add_subparsers().add_parser`` are of this class too.
    """

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        try:
            expanded, path, file_tokens = _expand_config(self, argv)
        except GmtsError as e:
            self.error(str(e))
        except (RecursionError, MemoryError, ValueError, TypeError) as e:  # a config value we cannot turn into flags
            self.error(f"{CONFIG_FLAG}: cannot be read as options ({type(e).__name__}: {str(e)[:200]})")
        expanded, renamed = _rename_required(self, expanded)
        ns, rest = super().parse_known_args(expanded, namespace)
        if renamed:
            rec = getattr(ns, "aliases", None) or {}
            rec.update(renamed)
            ns.aliases = rec
        if path is not None:
            rec = getattr(ns, "aliases", None) or {}
            cli_flags = {t.split("=", 1)[0] for t in argv if t.startswith("--")}
            for tok in file_tokens:
                tok = tok.split("=", 1)[0]
                a = self._option_string_actions.get(tok) if tok.startswith("--") else None
                if isinstance(a, _Spelling) and a.alias is not None:
                    if tok not in cli_flags:
                        rec.pop(tok, None)
                    rec[f"{os.path.basename(path)}: {tok[2:]}"] = a.target.dest
            ns.aliases = rec
            ns.config = str(path)
        self._fill(ns, expanded)
        return ns, rest

    def _fill(self, ns: argparse.Namespace, argv: list[str]) -> None:
        """Options an alias also sets (``fill``) when they were not given themselves."""
        rec = getattr(ns, "aliases", None)
        if not rec:
            return
        mine = {a.dest for a in self._actions}
        given = _dests_given(self, [t for t in argv if not _is_alias_token(self, t)])
        for name in list(rec):
            al = ALIAS_BY_NAME.get(name.rsplit(" ", 1)[-1].lstrip("-").replace("-", "_"))
            if al is None or al.dest not in mine:
                continue
            for dest in al.fill:
                if dest in mine and dest not in given and not _alias_sets(self, argv, dest):
                    setattr(ns, dest, getattr(ns, al.dest))
                    rec[name] = f"{rec[name]}, {dest}"


def _rename_required(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Aliases of a required option become its own flag before parsing (argparse counts a required
    option as given only under its own action); returns the new argv and ``{alias: dest}``."""
    out, renamed = [], {}
    for tok in argv:
        if tok == "--":
            out.append(tok)
            continue
        name, eq, val = tok.partition("=")
        a = parser._option_string_actions.get(name) if tok.startswith("--") else None
        if isinstance(a, _Spelling) and a.alias is not None and a.target.required and a.alias.values is None:
            out.append(a.target.option_strings[-1] + (eq + val if eq else ""))
            renamed[name] = a.target.dest
            continue
        out.append(tok)
    return out, renamed


def _is_alias_token(parser: argparse.ArgumentParser, tok: str) -> bool:
    a = parser._option_string_actions.get(tok.split("=", 1)[0]) if tok.startswith("--") else None
    return isinstance(a, _Spelling) and a.alias is not None


def _alias_sets(parser: argparse.ArgumentParser, argv: list[str], dest: str) -> bool:
    """Some alias in ``argv`` sets ``dest`` directly (``--epsilon_high`` sets clip_high)."""
    for tok in argv:
        a = parser._option_string_actions.get(tok.split("=", 1)[0]) if tok.startswith("--") else None
        if isinstance(a, _Spelling) and a.alias is not None and a.alias.dest == dest:
            return True
    return False
