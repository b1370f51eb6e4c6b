"""A ``gmts`` subcommand, declared: its name, its help, its positional arguments and its settings dataclasses.

A command module declares one :class:`Command`::

    COMMAND = Command("compare", help="...", description=__doc__, epilog=EXAMPLES,
                      positionals=(Positional("runs", "RUN", "run directories ...", nargs="+"),),
                      settings=(CompareOptions, RunControl), skip=("offline",),
                      job="gmts_analysis.commands.compare_job:compare")
    register = COMMAND.register

:meth:`Command.register` adds its parser (the positionals, then one flag per field of ``settings``:
:func:`gmts_analysis.options.parser.add_fields`); :meth:`Command.build` is the one generic builder that turns
the parsed arguments into typed values (each positional, then one instance of each settings dataclass:
:func:`gmts_analysis.options.parser.from_args`); :meth:`Command.run` calls ``job`` with them. No command reads
``args.x`` by hand. The job is named by its path (``"module:function"``, a module of its own with its imports at
its top) and imported by :meth:`Command.function` when the command runs, so a command's declaration imports no
job: ``gmts --help`` builds every command's parser and stays fast. This module imports nothing heavy.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from gmts_analysis.options.parser import ExamplesHelpFormatter, add_fields, from_args


@dataclass(frozen=True)
class Positional:
    """A positional argument: ``dest`` (the job's parameter), its ``metavar``, ``help`` and ``nargs``."""

    dest: str
    metavar: str
    help: str
    nargs: str | None = None


@dataclass(frozen=True)
class Command:
    """One subcommand: ``gmts <name>``.

    help: the one line of ``gmts --help``; description, epilog: its ``--help`` text (an epilog starting with
    ``examples:`` keeps its lines; a description that names registered things, such as the score arms, may be a
    function, called each time the parser is built). positionals: its positional arguments, in order. settings: the option
    dataclasses whose fields are its flags, each name once (``skip``: fields not offered; ``defaults``: this
    command's own default of a field). job: called as ``job(*positionals, *settings)`` with the typed values
    (:meth:`build`); its return value is the exit status. It is a function, or its path ``"module:function"``
    (imported when the command runs: :meth:`function`).
    """

    name: str
    help: str
    description: str | Callable[[], str]
    job: Callable[..., int] | str
    settings: tuple[type, ...] = ()
    positionals: tuple[Positional, ...] = ()
    epilog: str | None = None
    skip: tuple[str, ...] = ()
    defaults: dict[str, Any] | None = None
    parser_kw: dict[str, Any] = field(default_factory=dict)

    def register(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add this command's parser to ``subparsers`` (``gmts``'s); ``func`` is :meth:`run`."""
        description = self.description() if callable(self.description) else self.description
        kw: dict[str, Any] = {"help": self.help, "description": description, **self.parser_kw}
        if self.epilog is not None:
            kw.update(epilog=self.epilog, formatter_class=ExamplesHelpFormatter)
        p = subparsers.add_parser(self.name, **kw)
        for a in self.positionals:
            p.add_argument(a.dest, metavar=a.metavar, help=a.help, **({"nargs": a.nargs} if a.nargs else {}))
        add_fields(p, *self.settings, skip=self.skip, defaults=self.defaults)
        p.set_defaults(func=self.run)
        return p

    def build(self, args: argparse.Namespace) -> tuple[Any, ...]:
        """The typed values of parsed ``args``: each positional, then one instance of each settings dataclass
        (a field the command does not offer keeps its default)."""
        return (*(getattr(args, a.dest) for a in self.positionals), *(from_args(cls, args) for cls in self.settings))

    def function(self) -> Callable[..., int]:
        """The job: ``job`` itself, or the function its path ``"module:function"`` names, imported now (the one
        place a command's job is imported; docs/architecture.md, "Deferred imports")."""
        if callable(self.job):
            return self.job
        module, _, name = self.job.partition(":")
        return getattr(importlib.import_module(module), name)

    def run(self, args: argparse.Namespace) -> int:
        """``job`` on the typed values of ``args`` (:meth:`build`)."""
        values = self.build(args)
        return self.function()(*values)
