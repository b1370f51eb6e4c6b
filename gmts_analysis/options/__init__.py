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
writes it into the run's manifest. :class:`GmtsParser` is the parser class of the whole
``gmts`` command (subparsers inherit it); :func:`install` adds the spellings once every
subcommand is registered.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gmts_analysis.errors import GmtsError

CONFIG_FLAG = "--config"


@dataclass(frozen=True)
class Alias:
    """Another tool's name for one of our options.

    name: the alias in underscore form, without dashes (``epsilon``). dest: our option
    (``clip_low``). origin: where the name comes from. values: how its values map onto ours
    (lower-cased string keys); None = the same values. fill: options also set to this value
    unless given explicitly (TRL's ``epsilon_high`` defaults to ``epsilon``).
    """

    name: str
    dest: str
    origin: str
    values: dict[str, str] | None = None
    fill: tuple[str, ...] = field(default=())


# TRL names are fields of trl.GRPOConfig (TRL 1.16); verl names are keys of its PPO trainer
# config (actor_rollout_ref.actor.* unless noted). Our own canonical flags need no entry.
ALIASES: tuple[Alias, ...] = (
    Alias("scale_rewards", "advantage", "TRL GRPOConfig.scale_rewards",
          values={"group": "group", "batch": "batch", "none": "none", "true": "group", "false": "none"}),
    Alias("loss_agg_mode", "loss_agg", "verl actor.loss_agg_mode"),
    Alias("epsilon", "clip_low", "TRL GRPOConfig.epsilon (also epsilon_high unless given)", fill=("clip_high",)),
    Alias("epsilon_high", "clip_high", "TRL GRPOConfig.epsilon_high"),
    Alias("clip_ratio", "clip_low", "verl actor.clip_ratio (both sides unless given)", fill=("clip_high",)),
    Alias("clip_ratio_low", "clip_low", "verl actor.clip_ratio_low"),
    Alias("clip_ratio_high", "clip_high", "verl actor.clip_ratio_high"),
    Alias("beta", "kl_beta", "TRL GRPOConfig.beta"),
    Alias("kl_loss_coef", "kl_beta", "verl actor.kl_loss_coef (with use_kl_loss, kl_loss_type low_var_kl = k3)"),
    Alias("max_response_length", "max_completion_length", "verl data.max_response_length"),
    Alias("top_entropy_quantile", "rho", "TRL GRPOConfig.top_entropy_quantile"),
    Alias("use_bias_correction_kl", "kl_bias_correction", "TRL GRPOConfig.use_bias_correction_kl",
          values={"true": "on", "false": "off", "auto": "auto", "on": "on", "off": "off"}),
    Alias("vllm_importance_sampling_mode", "vllm_is_mode", "TRL GRPOConfig.vllm_importance_sampling_mode "
          "(applied only when given: TRL's correction is on by default, but only for vLLM generation)"),
    Alias("vllm_importance_sampling_clip_min", "vllm_is_min", "TRL GRPOConfig.vllm_importance_sampling_clip_min"),
    Alias("vllm_importance_sampling_clip_max", "vllm_is_max", "TRL GRPOConfig.vllm_importance_sampling_clip_max"),
    Alias("norm_adv_by_std_in_grpo", "advantage", "verl algorithm.norm_adv_by_std_in_grpo",
          values={"true": "group", "false": "none"}),
    Alias("loss_scale_factor", "max_len", "verl actor.loss_scale_factor (L_max of seq-mean-token-sum-norm)"),
    Alias("model_name_or_path", "model", "TRL ModelConfig.model_name_or_path"),
    Alias("output_dir", "out", "TRL TrainingArguments.output_dir"),
    Alias("group_size", "num_generations", "gmts 0.1 (sample / run / rl); TRL's num_generations is the name"),
    Alias("max_new_tokens", "max_completion_length",
          "gmts 0.1 and transformers generate() (sample / run / rl); TRL's max_completion_length is the name"),
)
ALIAS_BY_NAME = {a.name: a for a in ALIASES}
#: our options whose name is also TRL's (GRPOConfig): spelled TRL's way (``--loss_type``, or the API
#: keyword) they are recorded in ``aliases`` too, mapped to themselves, so the manifest lists every TRL name used
TRL_NAMES: tuple[str, ...] = ("num_generations", "max_completion_length", "loss_type",
                              "mask_truncated_completions", "importance_sampling_level")

# --help groups, in this order, and the options each holds (one table for every subcommand)
HELP_GROUPS: dict[str, tuple[str, ...]] = {
    "inputs": ("model", "rollouts", "format", "steps", "reward_columns", "reward_weights", "num_generations",
               "chat_template", "max_completion_length", "verifier", "truncate", "offline", "config",
               "domains", "num_prompts", "group_size", "max_new_tokens", "difficulty", "run_dir"),
    "RL objective": ("temperature", "advantage", "loss_type", "loss_agg", "max_len", "mask_truncated_completions",
                     "clip_low", "clip_high", "clip_ratio_c", "kl_beta", "kl_bias_correction",
                     "importance_sampling_level", "vllm_is_mode", "vllm_is_min", "vllm_is_max", "rho",
                     "uncertain_below"),
    "gradient engine": ("grad_norm", "probes", "chunk_size", "max_memory", "grad_groups", "device", "dtype"),
    "output": ("out", "figures", "fidelity", "overwrite"),
    "run control": ("seed", "strict", "answers_per_chunk", "quiet", "threads", "batch_size", "max_steps"),
}
_GROUP_OF = {name: g for g, names in HELP_GROUPS.items() for name in names}


# where a subcommand's option means something else than the table above says (command: {dest: group})
GROUP_OVERRIDES: dict[str, dict[str, str]] = {
    "rl": {"max_steps": "RL objective", "out": "output", "figures": "output"},
    "toy-train": {"out": "output"},
    "figures": {"figures": "output"},
}
# options of the other subcommands, by group (added to HELP_GROUPS below)
_MORE_GROUPS: dict[str, tuple[str, ...]] = {
    "inputs": ("prompts", "size", "models", "eval_prompts", "final_eval_prompts", "prompts_per_domain", "plan"),
    "RL objective": ("selection", "scope", "normalizer", "lr", "dynamic_sampling"),
    "gradient engine": ("lengths", "layers", "prompt_len", "naive_tokens", "naive_full_max", "quick"),
    "output": ("to", "report", "max_answers", "n_boot", "no_figures", "update"),
    "run control": ("eval_every", "eval_seed", "diag_every", "diag_answers", "debug"),
}
for _g, _names in _MORE_GROUPS.items():
    HELP_GROUPS[_g] = HELP_GROUPS[_g] + _names
_GROUP_OF = {name: g for g, names in HELP_GROUPS.items() for name in names}


# metavars that state the unit of a value
METAVARS: dict[str, str] = {
    "model": "PATH|FILE.gguf|HUB_ID|tiny|small|smollm2", "rollouts": "PATH", "out": "DIR", "max_len": "TOKENS",
    "max_completion_length": "TOKENS", "max_memory": "MiB", "chunk_size": "TOKENS|auto", "probes": "K",
    "temperature": "TAU", "clip_low": "EPS", "clip_high": "EPS", "clip_ratio_c": "C", "kl_beta": "BETA",
    "rho": "FRACTION", "uncertain_below": "PROB", "seed": "INT", "answers_per_chunk": "ANSWERS", "num_generations": "G",
    "reward_columns": "NAME[,NAME...]", "reward_weights": "W[,W...]", "steps": "STEPS", "device": "DEVICE",
    "verifier": "NAME", "loss_type": "TYPE", "vllm_is_min": "C_MIN", "vllm_is_max": "C_MAX",
    "num_prompts": "PROMPTS", "group_size": "ANSWERS", "max_new_tokens": "TOKENS", "batch_size": "SEQUENCES",
    "n_boot": "RESAMPLES", "max_answers": "ANSWERS", "lr": "LR", "prompts_per_domain": "PROMPTS",
    "eval_every": "STEPS", "eval_seed": "INT", "eval_prompts": "PROMPTS", "final_eval_prompts": "PROMPTS", "diag_every": "STEPS", "diag_answers": "ANSWERS",
    "threads": "THREADS", "difficulty": "LEVEL", "layers": "LAYERS", "prompt_len": "TOKENS",
    "naive_tokens": "TOKENS", "naive_full_max": "TOKENS", "lengths": "T[,T...]", "probes_list": "K[,K...]",
    "to": "DIR", "prompts": "FILE", "plan": "FILE", "update": "FILE", "domains": "DOMAIN", "max_steps": "STEPS",
}


def help_group(parser: argparse.ArgumentParser, name: str) -> Any:
    """The ``--help`` argument group of option ``name`` in ``parser`` (created in
    :data:`HELP_GROUPS` order on first use; options not in the table go to "run control")."""
    groups = getattr(parser, "_gmts_groups", None)
    if groups is None:
        groups = {g: parser.add_argument_group(g) for g in HELP_GROUPS}
        parser._gmts_groups = groups
    command = parser.prog.split()[-1]
    return groups[GROUP_OVERRIDES.get(command, {}).get(name) or _GROUP_OF.get(name, "run control")]


def regroup_help(parser: argparse.ArgumentParser) -> None:
    """Put the options of a subcommand built with plain ``add_argument`` into the :data:`HELP_GROUPS`
    groups, give a value its unit (:data:`METAVARS`) and state every default in its help line.
    Parsing is unchanged (only the ``--help`` layout, metavars and help texts)."""
    optionals = parser._optionals
    for a in list(optionals._group_actions):
        if isinstance(a, argparse._HelpAction) or not a.option_strings:
            continue
        if a.help not in (None, argparse.SUPPRESS):
            takes_value = a.nargs != 0
            if takes_value and a.metavar is None and a.choices is None and a.dest in METAVARS:
                a.metavar = METAVARS[a.dest]
            if "(default" not in a.help and "default:" not in a.help:
                if _is_switch(a) or isinstance(a, argparse._StoreConstAction):
                    if not (isinstance(a, argparse._StoreFalseAction) or a.dest == "debug"):
                        a.help += " (default: off)"
                elif a.default is not argparse.SUPPRESS and not a.required:
                    d = a.default
                    shown = "none" if d is None else ",".join(map(str, d)) if isinstance(d, (list, tuple)) else d
                    a.help += f" (default: {shown})"
        optionals._group_actions.remove(a)
        help_group(parser, a.dest)._group_actions.append(a)


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
        regroup_help(sp)  # hand-written flags (dataclass ones are in their groups already)
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


# ------------------------------------------------------------------------ --config FILE.yaml


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

    from gmts_analysis.util.io import require_regular

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


def resolve_aliases(kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Keyword options with TRL/verl names (:data:`ALIASES`) renamed to ours, values mapped, and
    ``fill`` applied (``epsilon=0.3`` also sets ``clip_high`` unless given), for the Python API.
    An alias and its option given together are refused (:class:`GmtsError`)."""
    out = {k: v for k, v in kwargs.items() if k not in ALIAS_BY_NAME or k in names}
    for k, v in kwargs.items():
        al = ALIAS_BY_NAME.get(k)
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
                    a.dest == dest and a.name in kwargs for a in ALIASES):
                out[dest] = v
    return out
