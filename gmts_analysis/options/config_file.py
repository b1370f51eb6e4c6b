"""``--config FILE.yaml``, as TRL's parser reads one: the keys are option names in any spelling
(ours, TRL's, verl's; hyphens or underscores), a command-line flag overrides the file, and an
unknown key is refused with its name. The file is read within limits (size, depth, no YAML aliases).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.spellings import CONFIG_FLAG, _bool, _is_switch, _Spelling
from gmts_analysis.util.io import require_regular

#: limits of a --config file: a flat mapping of options needs none of these to be large
CONFIG_MAX_BYTES = 1 << 20
CONFIG_MAX_DEPTH = 16


def _limited_loader(path: str) -> type:
    """A ``yaml.SafeLoader`` that refuses anchors and aliases (a few hundred bytes of nested aliases
    expand to billions of nodes) and nesting deeper than :data:`CONFIG_MAX_DEPTH`."""
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):  # noqa: D102
            if self.check_event(yaml.AliasEvent):
                ev = self.peek_event()
                raise GmtsError(f"{CONFIG_FLAG} {path}: line {ev.start_mark.line + 1}: YAML aliases (*{ev.anchor}) "
                                "are not accepted in a config file; write the values out")
            ev = self.peek_event()
            if getattr(ev, "anchor", None):
                raise GmtsError(f"{CONFIG_FLAG} {path}: line {ev.start_mark.line + 1}: YAML anchors (&{ev.anchor}) "
                                "are not accepted in a config file; write the values out")
            self.depth += 1
            if self.depth > CONFIG_MAX_DEPTH:
                raise GmtsError(f"{CONFIG_FLAG} {path}: line {ev.start_mark.line + 1}: nested deeper than "
                                f"{CONFIG_MAX_DEPTH} levels (a config file is a flat mapping of options)")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Loader


def read_config_file(path: str) -> Any:
    """The YAML (or JSON) value of a ``--config`` file, read within limits: at most
    :data:`CONFIG_MAX_BYTES`, UTF-8, no anchors or aliases, nesting at most :data:`CONFIG_MAX_DEPTH`.
    Every failure is a :class:`GmtsError` naming the file (and the line where YAML gives one)."""
    import yaml

    p = Path(path)
    require_regular(p, f"{CONFIG_FLAG} {path}")
    try:
        with open(p, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise GmtsError(f"{CONFIG_FLAG} {path}: cannot read ({e.strerror or e})") from None
    if len(raw) > CONFIG_MAX_BYTES:
        raise GmtsError(f"{CONFIG_FLAG} {path}: larger than {CONFIG_MAX_BYTES // 1024} KiB; a config file is a "
                        "short mapping of options")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bom = " (it starts with a UTF-16 byte order mark: save it as UTF-8)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise GmtsError(f"{CONFIG_FLAG} {path}: not valid UTF-8 (byte {e.start + 1}){bom}") from None
    try:
        return yaml.load(text, Loader=_limited_loader(str(path)))  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise GmtsError(f"{CONFIG_FLAG} {path}:{where} not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except (RecursionError, ValueError, OverflowError) as e:
        why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise GmtsError(f"{CONFIG_FLAG} {path}: cannot be read as options ({why})") from None


def config_file_args(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The command-line tokens equivalent to a YAML (or JSON) config file, for ``parser``.

    Keys are option names (``loss_type``, ``loss-type``, ``epsilon`` ...); values are scalars,
    or lists for options taking several values. ``null`` leaves an option at its default. An
    ``env`` mapping sets environment variables, as TRL's ``TrlParser`` does (``env: {HF_HUB_OFFLINE: 1}``).
    Raises :class:`GmtsError` for an unreadable file, a nested mapping or unknown keys (all named).
    """
    data = read_config_file(path)
    if data is None:
        return []
    if not isinstance(data, dict):
        raise GmtsError(f"{CONFIG_FLAG} {path}: expected a mapping of option names to values, got {type(data).__name__}")
    table = parser._option_string_actions
    unknown, nested, tokens = [], [], []
    env = data.pop("env", None) if "--env" not in table else None
    if env is not None:  # TRL's TrlParser: an `env` mapping sets environment variables before parsing
        if not isinstance(env, dict):
            raise GmtsError(f"{CONFIG_FLAG} {path}: env: expected a mapping of variable names to values, "
                            f"got {type(env).__name__}")
        for k, v in env.items():
            os.environ[str(k)] = str(v)
    for key, value in data.items():
        k = str(key).strip().lstrip("-")
        flag = "--" + k if "--" + k in table else "--" + k.replace("_", "-")
        action = table.get(flag)
        if isinstance(value, dict):
            nested.append(k)
            continue
        if action is None or action.dest in ("help", "config") or action.dest is argparse.SUPPRESS:
            # a switch's value may also be given under the name of its off form's dest (figures: false)
            off = _off_switch_for(parser, k.replace("-", "_"))
            if off is None:
                unknown.append(k)
                continue
            action, flag = off, off.option_strings[0]
        if value is None:
            continue
        target = action.target if isinstance(action, _Spelling) else action
        if _is_switch(target):
            if not isinstance(value, bool):
                try:
                    value = _bool(str(value))
                except argparse.ArgumentTypeError:
                    raise GmtsError(f"{CONFIG_FLAG} {path}: {k}: expected true or false, got {value!r}") from None
            if value == target.const:
                tokens.append(target.option_strings[0])
            else:  # the file turns the switch the other way: its opposite flag if there is one
                opp = _opposite(parser, target)
                if opp is not None:
                    tokens.append(opp.option_strings[0])
            continue
        vals = value if isinstance(value, list) else [value]
        if isinstance(value, list) and target.nargs in (None, "?"):
            vals = [",".join(str(v) for v in value)]  # comma-separated options (--domains a,b)
        strs = [str(v).lower() if isinstance(v, bool) else str(v) for v in vals]
        tokens += [f"{flag}={strs[0]}"] if len(strs) == 1 else [flag, *strs]
    if nested:
        raise GmtsError(f"{CONFIG_FLAG} {path}: nested section(s) {', '.join(nested)}: write the options flat "
                        "(e.g. clip_ratio_low: 0.2, not actor: {clip_ratio_low: 0.2})")
    if unknown:
        raise GmtsError(f"{CONFIG_FLAG} {path}: unknown option(s) {', '.join(unknown)} "
                        f"(see gmts {parser.prog.split()[-1]} --help; docs/cli.md lists the TRL and verl names)")
    return tokens


def _off_switch_for(parser: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    for a in parser._actions:
        if a.dest == dest and _is_switch(a) and a.option_strings:
            return a
    return None


def _opposite(parser: argparse.ArgumentParser, action: argparse.Action) -> argparse.Action | None:
    for a in parser._actions:
        if a is not action and a.dest == action.dest and _is_switch(a) and a.const != action.const:
            return a
    return None


def _expand_config(parser: argparse.ArgumentParser, args: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Replace ``--config FILE`` (or ``--config=FILE``) in ``args`` by the file's options, put
    first so that the command line overrides them. Returns ``(args, path, file_tokens)``."""
    if CONFIG_FLAG not in parser._option_string_actions:
        return args, None, []
    out, path = [], None
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            out += args[i:]
            break
        if tok == CONFIG_FLAG or tok.startswith(CONFIG_FLAG + "="):
            if tok == CONFIG_FLAG:
                if i + 1 >= len(args):
                    parser.error(f"argument {CONFIG_FLAG}: expected one argument")
                path = args[i + 1]
                i += 2
            else:
                path = tok.split("=", 1)[1]
                i += 1
            continue
        out.append(tok)
        i += 1
    if path is None:
        return args, None, []
    file_tokens = config_file_args(parser, path)
    return file_tokens + out, path, file_tokens
