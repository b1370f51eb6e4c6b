"""How one option is declared: a dataclass field whose metadata says everything about it.

An option is a field of an option dataclass, written once with :func:`opt`::

    temperature: float = opt(1.0, "sampling temperature tau", group="RL objective", metavar="TAU",
                             check=checks.positive_finite, aliases=(trl("beta", "..."),))

The metadata keys (all optional but ``help``):

- ``help``: the ``--help`` text (the default is appended unless it says ``(default`` itself);
- ``group``: its ``--help`` group (:data:`GROUPS`); ``metavar``: the unit of its value;
- ``choices``, ``nargs``, ``short`` (``-q``), ``required``, ``flag_off`` / ``help_off`` (a switch
  that is on by default and is turned off by ``--no-...``), ``cli=False`` (API and manifest only),
  ``show_default=False`` (no ``(default: ...)`` in the help);
- ``check``: ``check(flag, value)`` raising :class:`~gmts_analysis.errors.GmtsError`, run before any
  work on the CLI and in the API (:mod:`gmts_analysis.options.checks`);
- ``aliases``: other tools' names for it (:class:`Alias`, TRL's and verl's), accepted on the command
  line, in ``--config`` files and as API keywords; ``trl_name=True``: the field's own name is TRL's.

From that one declaration come the flag (:func:`gmts_analysis.options.parser.add_fields`), the API
keyword (:func:`gmts_analysis.options.config.options_from_kwargs`), the ``--config`` key, the
validation, the manifest record (``dataclasses.asdict`` of the job's config) and ``docs/cli.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from gmts_analysis.errors import GmtsError

#: the ``--help`` groups, in the order every subcommand lists them
GROUPS: tuple[str, ...] = ("inputs", "RL objective", "gradient engine", "output", "run control")
#: the group of a field that names none
DEFAULT_GROUP = "run control"


@dataclass(frozen=True)
class Alias:
    """Another tool's name for one of our options.

    name: the alias in underscore form, without dashes (``epsilon``). dest: our option
    (``clip_low``; filled from the field it is declared on). origin: where the name comes from.
    values: how its values map onto ours (lower-cased string keys); None = the same values.
    fill: options also set to this value unless given explicitly (TRL's ``epsilon_high``
    defaults to ``epsilon``).
    """

    name: str
    dest: str
    origin: str
    values: dict[str, str] | None = None
    fill: tuple[str, ...] = field(default=())


def alias(name: str, origin: str, values: dict[str, str] | None = None, fill: tuple[str, ...] = ()) -> Alias:
    """An :class:`Alias` declared on a field (its ``dest`` is the field's name)."""
    return Alias(name, "", origin, values, fill)


def opt(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field declaring one option (see the module docstring for the metadata keys).
    A list default becomes a ``default_factory`` (and a list on the command line)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def default_of(cls: type, name: str) -> Any:
    """The declared default of field ``name`` of the option dataclass ``cls``."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def fields_of(*classes: type, skip: Iterable[str] = ()) -> dict[str, dataclasses.Field]:
    """``{name: field}`` of several option dataclasses, each name once (its first declaration holds)."""
    out: dict[str, dataclasses.Field] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name not in skip:
                out.setdefault(f.name, f)
    return out


def aliases_of(*classes: type) -> tuple[Alias, ...]:
    """The :class:`Alias` entries declared on the fields of ``classes``, with their ``dest``, each name once."""
    out: dict[str, Alias] = {}
    for f in (f for cls in classes for f in dataclasses.fields(cls)):
        for a in f.metadata.get("aliases", ()):
            out.setdefault(a.name, dataclasses.replace(a, dest=f.name))
    return tuple(out.values())


def flag(name: str) -> str:
    """The flag of option ``name``: ``loss_agg`` -> ``--loss-agg``."""
    return "--" + name.replace("_", "-")


Check = Callable[[str, Any], None]


def resolve_aliases(kwargs: dict[str, Any], names: Sequence[str], aliases: Sequence[Alias]) -> dict[str, Any]:
    """Keyword options with TRL/verl names (``aliases``, each with its ``dest``) renamed to ours, values mapped, and
    ``fill`` applied (``epsilon=0.3`` also sets ``clip_high`` unless given), for the Python API.
    An alias and its option given together are refused (:class:`GmtsError`)."""
    by_name = {a.name: a for a in aliases}
    out = {k: v for k, v in kwargs.items() if k not in by_name or k in names}
    for k, v in kwargs.items():
        al = by_name.get(k)
        if al is None or k in names or al.dest not in names:
            continue
        if al.dest in kwargs:
            raise GmtsError(f"options {k} and {al.dest} name the same setting: give one")
        if al.values is not None:
            key = str(v).strip().lower()
            if key not in al.values:
                raise GmtsError(f"option {k}={v!r}: choose from {', '.join(al.values)}")
            v = al.values[key]
        out[al.dest] = v
        for dest in al.fill:
            if dest in names and dest not in kwargs and not any(
                    a.dest == dest and a.name in kwargs for a in aliases):
                out[dest] = v
    return out
