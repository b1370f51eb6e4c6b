"""Option dataclasses shared by the CLI and the Python API.

Each field's ``metadata['help']`` is its ``--help`` text; :func:`add_dataclass_args`
turns a dataclass into argparse flags (``loss_agg`` -> ``--loss-agg``).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gmts_analysis.core.vocabulary import (
    ADVANTAGE_MODES,
    DEFAULT_RHO,
    IS_LEVELS,
    LOSS_AGGS,
    LOSS_TYPES,
    REFUSED_LOSS_TYPES,
    RHOS,
    VLLM_IS_MODES,
)
from gmts_analysis.errors import GmtsError


def opt(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


THREADS_HELP = ("torch CPU threads (default: the cores not already busy, from the load average, at least 1; "
                "or $GMTS_THREADS): a shared machine's default of every core can run 10x slower")


@dataclass
class ProbeOptions:
    """The probe's mathematics and execution options: what the numbers depend on (no files).

    This is what the Python API takes as ``**options`` (``gmts.probe(model, rollouts,
    temperature=0.7)``) and what :mod:`gmts_analysis.probing.kernel` reads. Every field is also a
    ``gmts probe`` flag (``loss_agg`` -> ``--loss-agg``). Add a field here for a new option.
    """

    format: str = opt("auto", "rollouts format", choices=("auto", "gmts", "verl", "trl"))
    device: str = opt("auto", "auto | cpu | cuda | cuda:N; auto = cuda if available, else cpu")
    dtype: str = opt("float32", "model dtype (statistics are always float32 or better)",
                     choices=("float32", "float64", "bfloat16", "float16"))
    temperature: float = opt(1.0, "sampling temperature tau: p = softmax(z / tau)")
    advantage: str = opt("group", "advantage estimator (docs/definitions.md section 3)",
                         choices=ADVANTAGE_MODES)
    loss_agg: str = opt("token-mean", "per-token loss weight w (docs/definitions.md section 3): token-mean "
                        "1/sum_j L_j, seq-mean-token-mean 1/(N L_i), seq-mean-token-sum-norm 1/(N L_max), and "
                        "verl's seq-mean-token-sum 1/N, token-sum 1",
                        choices=LOSS_AGGS)
    max_len: int = opt(None, "generation budget L_max in tokens for seq-mean-token-sum-norm (default: "
                       "--max-completion-length, else the longest answer)")
    loss_type: str = opt(None, f"TRL loss_type that was trained: {' | '.join(LOSS_TYPES)} (sets --loss-agg; "
                         f"TRL's bias-corrected KL); {', '.join(REFUSED_LOSS_TYPES)} are refused")
    clip_low: float = opt(0.2, "PPO clip epsilon below 1 (off-policy omega; TRL epsilon, verl clip_ratio_low)")
    clip_high: float = opt(0.2, "PPO clip epsilon above 1 (TRL epsilon_high, default epsilon; DAPO uses 0.28)")
    clip_ratio_c: float = opt(None, "verl's dual clip c > 1: no gradient where A < 0 and ratio > c (default off)")
    kl_beta: float = opt(0.0, "k3 KL penalty weight against ref_logprobs")
    kl_bias_correction: str = opt("auto", "TRL's use_bias_correction_kl (KL term times the ratio): auto = on "
                                  "with --loss-type", choices=("auto", "on", "off"))
    importance_sampling_level: str = opt("token", "importance ratio per token, or one per answer (GSPO)",
                                         choices=IS_LEVELS)
    vllm_is_mode: str = opt(None, "TRL's vLLM importance-sampling correction (needs sampling_logprobs)",
                            choices=VLLM_IS_MODES)
    vllm_is_min: float = opt(None, "vLLM importance-sampling lower bound C_min (default none)")
    vllm_is_max: float = opt(3.0, "vLLM importance-sampling upper bound C_max")
    grad_norm: str = opt("exact", "per-token gradient norm: exact | sketch (Gaussian JVP) | none",
                         choices=("exact", "sketch", "none"))
    probes: int = opt(32, "number of random sketch directions for --grad-norm sketch")
    chunk_size: str = opt("auto", "tokens per batched VJP (an integer, or auto from --max-memory)")
    max_memory: int = opt(None, "memory budget in MiB for --chunk-size auto")
    grad_groups: str = opt(None, "also write grad_groups.parquet per layer or module", choices=("layer", "module"))
    fidelity: str = opt("auto", "update fidelity of selections (needs the model): auto = on under 100k tokens when its "
                        "gradients fit in memory (n_estimators+7 copies of the parameters in 2 GiB)",
                        choices=("auto", "on", "off"))
    verifier: str = opt(None, "score answers without a reward: a toy domain name, or 'domain' to use each row's domain")
    truncate: bool = opt(False, "cut responses that do not fit the model's context instead of failing")
    steps: str = opt(None, "read only these training steps of a rollouts directory: '10,20' or ranges '10-30'")
    reward_columns: str = opt(None, "TRL tables: the reward-function columns NAME[,NAME...] whose weighted sum "
                              "(NaN skipped, as TRL) is the reward; required when several columns are numeric")
    reward_weights: str = opt(None, "TRL reward_weights for --reward-columns, W[,W...] (default: 1 each)")
    num_generations: int = opt(None, "answers per prompt G: consecutive blocks of G rows are one group when the "
                               "rows have no group id (as TRL logs them)")
    chat_template: str = opt("auto", "message-list prompts through the tokenizer's chat template with the "
                             "generation prompt; auto: message lists (and verl prompts it matches), on: also text "
                             "prompts, off: never", choices=("auto", "on", "off"))
    max_completion_length: int = opt(None, "the trainer's completion length limit: TRL/verl text responses "
                                     "shorter than it get their stop token (EOS) back, those reaching it do not")
    mask_truncated_completions: bool = opt(False, "TRL's mask_truncated_completions: answers that do not end "
                                           "with a stop token (EOS or pad) get loss weight 0 and leave the "
                                           "token-mean denominator; their rewards still enter the baselines")
    rho: float = opt(DEFAULT_RHO, "keep fraction of the token selections (TRL's top_entropy_quantile) used by the "
                     "report, "
                     "update fidelity and the headline top-k overlap; the statistics also report their grid "
                     f"{', '.join(map(str, RHOS))}")
    uncertain_below: float = opt(0.9, "the statistics' uncertain-token view keeps the tokens whose probability "
                                 "under the policy is below this (stats.json 'uncertain', meta.uncertain_below)")
    seed: int = opt(0, "seed for sketches, bootstrap and random selections")

    def options(self) -> "ProbeOptions":
        """The options alone (drops job settings when called on a :class:`ProbeConfig`)."""
        return ProbeOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ProbeOptions)})


@dataclass
class JobSettings:
    """Where a probe job reads and writes, and how it runs; never changes a number."""

    model: str = opt("small", "model directory, hub id, or a shipped policy: tiny | small", required=True)
    rollouts: str = opt(None, "rollouts file (.jsonl or .parquet; docs/definitions.md section 7), or a TRL "
                        "output_dir (its completions/ is read)", required=True)
    out: str = opt(None, "output run directory (TRL's output_dir) (default: runs/<command>-YYYYmmdd-HHMMSS)")
    figures: bool = opt(True, "render figures/ and report.html", flag_off="--no-figures",
                        help_off="skip figures/ and report.html (default: both are written)")
    overwrite: bool = opt(False, "replace an existing output directory (default: resume a run of the same "
                          "model, rollouts and configuration; refuse anything else)")
    strict: bool = opt(False, "stop at the first answer that fails, and count an answer the exact engine refuses "
                       "as failed (default: record a failed answer in errors.jsonl and go on; send a refused "
                       "one to the per-token loop, exact but slower, with a warning)")
    answers_per_chunk: int = opt(16, "answers per record (a resumable unit of work): a killed run redoes "
                                 "at most one record per rank")
    quiet: bool = opt(False, "no progress bars; only warnings and errors on stderr", short="-q")
    threads: int = opt(None, THREADS_HELP)
    offline: bool = opt(False, "never download: a hub --model must already be in the local Hugging Face cache "
                        "(HF_HUB_OFFLINE=1 does the same); without it a hub id is downloaded as transformers does")
    config_file: str = opt(None, "the --config YAML file the options were read from", cli=False)
    aliases: dict = opt(None, "TRL/verl option names used, mapped to ours ({name: our option})", cli=False)


@dataclass
class SamplingOptions:
    """What ``gmts sample`` and the sampling half of ``gmts run`` take; the keywords of :func:`gmts.sample`.

    One set of defaults for the CLI and the API. TRL's names are the primary ones
    (``num_generations``, ``max_completion_length``); the older ``group_size`` and
    ``max_new_tokens`` are aliases (:data:`gmts_analysis.options.ALIASES`).
    """

    model: str = opt("small", "model directory, a .gguf file (or a folder holding one), hub id, a shipped policy "
                     "(tiny | small), or smollm2 (SmolLM2-135M-Instruct, the real extra)")
    domains: str = opt(None, "one or more of the toy domains (arithmetic, program, logic) and word (grade-school "
                       "word problems through the chat template, math verifier: for real models), space- or "
                       "comma-separated (default: the three toy domains for a toy policy; gmts run: word for any "
                       "other model; gmts sample: unless --prompts)", nargs="+")
    prompts: str = opt(None, "instead of --domains: a JSONL/parquet prompts file for any checkpoint ('prompt': "
                       "text or chat messages, plus the verifier's columns such as 'solution')")
    verifier: str = opt(None, "with --prompts: reward function (math, math_boxed, a toy domain, or module:function / "
                        "file.py:function, called as TRL calls reward functions); without it no reward is written. "
                        "On the word problems: math_boxed (the default: the last \\boxed{} only) or math (adds "
                        "its fallback to an expression anywhere in the text; counted in stats.json's reward_audit)")
    chat_template: str = opt("auto", "with --prompts: auto = message prompts through the chat template, text as "
                             "is; on = text prompts as one user message too; off = no template",
                             choices=("auto", "on", "off"))
    num_prompts: int = opt(None, "prompts (groups) per toy domain (default: 8); with --prompts: the first N "
                           "(default: all)")
    num_generations: int = opt(8, "answers per prompt G (a group; at least 2: a group needs a baseline)")
    temperature: float = opt(1.0, "sampling temperature tau (0: greedy)")
    max_completion_length: int = opt(None, "generation budget per answer in tokens (default: the policy "
                                     "card's, else 96)")
    difficulty: int = opt(None, "toy difficulty level 1-3 (default: uniform mix)")
    seed: int = opt(0, "seed of the prompts and the sampling (the same seed gives the same rows on one device)")
    batch_size: int = opt(64, "sequences generated together")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N; auto = cuda if available, else cpu")
    dtype: str = opt("float32", "model dtype", choices=("float32", "float64", "bfloat16", "float16"))


@dataclass
class OutputOptions:
    """Where a writer puts its result (``gmts sample``, ``compare``, ``stats``): ``out`` is TRL's ``output_dir``."""

    out: str = opt(None, "output directory (TRL's output_dir) (default: runs/<command>-YYYYmmdd-HHMMSS)")
    overwrite: bool = opt(False, "replace an existing output")


@dataclass
class RunControl:
    """How a command runs, never what it computes: threads, progress, downloads."""

    threads: int = opt(None, THREADS_HELP)
    quiet: bool = opt(False, "no progress bars; only warnings and errors on stderr", short="-q")
    offline: bool = opt(False, "never download: a hub --model must already be in the local Hugging Face cache "
                        "(HF_HUB_OFFLINE=1 does the same)")


class ExamplesHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that an epilog starting with ``examples:`` keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def default_out(command: str) -> str:
    """The default output folder of a writer: ``runs/<command>-YYYYmmdd-HHMMSS`` (UTC)."""
    import time

    return time.strftime(f"runs/{command}-%Y%m%d-%H%M%S", time.gmtime())


def add_options(parser: argparse.ArgumentParser, *classes: type, skip: tuple[str, ...] = (),
                defaults: dict[str, Any] | None = None) -> None:
    """The flags of several option dataclasses (:func:`add_dataclass_args`), each name once: a field
    of a later class that an earlier one already has is skipped (its first definition holds).
    ``defaults`` overrides a field's default for this command."""
    seen = set(skip)
    for cls in classes:
        add_dataclass_args(parser, cls, skip=tuple(seen), defaults=defaults)
        seen |= {f.name for f in dataclasses.fields(cls)}


def add_run_control(parser: argparse.ArgumentParser) -> None:
    """``--threads`` and ``-q/--quiet`` of :class:`RunControl`, for the subcommands that load no model."""
    add_dataclass_args(parser, RunControl, skip=("offline",))


def add_offline_flag(parser: argparse.ArgumentParser) -> None:
    """``--offline`` as ``gmts probe`` has it (:attr:`JobSettings.offline`), for the other subcommands
    that load a ``--model`` (sample, run, rl)."""
    help_ = next(f.metadata["help"] for f in dataclasses.fields(JobSettings) if f.name == "offline")
    parser.add_argument("--offline", action="store_true", help=help_)


@dataclass
class ProbeConfig(ProbeOptions, JobSettings):
    """One probe job (``gmts probe``, ``gmts run``): job settings + probe options.

    Fields: those of :class:`JobSettings` then those of :class:`ProbeOptions`; recorded in
    manifest.json. Build it from parts with :meth:`from_parts`.
    """

    @classmethod
    def from_parts(cls, job: JobSettings, options: ProbeOptions) -> "ProbeConfig":
        kw = {f.name: getattr(job, f.name) for f in dataclasses.fields(JobSettings)}
        kw.update({f.name: getattr(options, f.name) for f in dataclasses.fields(ProbeOptions)})
        return cls(**kw)

    def job(self) -> JobSettings:
        """The job settings alone."""
        return JobSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(JobSettings)})


def option_names() -> tuple[str, ...]:
    """Names accepted as ``**options`` by the Python API (the probe flags in snake_case)."""
    return tuple(f.name for f in dataclasses.fields(ProbeOptions))


def check_options(opts: ProbeOptions) -> None:
    """Refuse a value of the wrong type or outside its choices (what argparse checks for the CLI)."""
    check_values(opts)


def check_values(opts: Any, skip: tuple[str, ...] = ()) -> None:
    """Refuse a field of the dataclass ``opts`` of the wrong type or outside its choices, naming it
    as the API keyword (``option max_completion_length='x': expected int``)."""
    for f in dataclasses.fields(opts):
        if f.name in skip:
            continue
        v = getattr(opts, f.name)
        if v is None:
            continue
        choices = f.metadata.get("choices")
        if choices and v not in choices:
            raise GmtsError(f"option {f.name}={v!r}: choose from {', '.join(map(str, choices))}")
        ok = {"int": lambda x: isinstance(x, int) and not isinstance(x, bool),
              "float": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
              "bool": lambda x: isinstance(x, bool)}.get(str(f.type), lambda x: True)
        if not ok(v):
            raise GmtsError(f"option {f.name}={v!r}: expected {f.type}, got {type(v).__name__}")


def options_from_kwargs(kwargs: dict[str, Any], where: str = "gmts.probe") -> ProbeOptions:
    """:class:`ProbeOptions` from keyword arguments named like the probe flags in snake_case.

    An unknown name is refused with a :class:`GmtsError` naming it (and the closest option);
    so is a job setting (``out``, ``overwrite``, ...), which has no meaning for an in-memory probe.
    """
    import difflib

    from gmts_analysis.options import resolve_aliases

    names = option_names()
    kwargs = resolve_aliases(kwargs, names)
    jobs = {f.name for f in dataclasses.fields(JobSettings)}
    for k in kwargs:
        if k in names:
            continue
        if k in jobs:
            raise GmtsError(f"{where}: '{k}' is a job setting of `gmts probe`, not a probe option "
                            "(save with run.save(path); options: " + ", ".join(names) + ")")
        close = difflib.get_close_matches(k, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise GmtsError(f"{where}: unknown option '{k}'{hint}; options: " + ", ".join(names))
    opts = ProbeOptions(**kwargs)
    check_options(opts)
    return opts


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                       defaults: dict[str, Any] | None = None) -> None:
    """Add one ``--flag`` per dataclass field (bools become switches), each in its ``--help``
    group (:func:`gmts_analysis.options.help_group`) with its default stated (``defaults``:
    this command's own default of a field)."""
    from gmts_analysis.options import METAVARS, help_group

    for f in dataclasses.fields(cls):
        if f.name in skip or f.metadata.get("cli") is False:
            continue
        flag = "--" + f.name.replace("_", "-")
        md = f.metadata
        default = (defaults or {}).get(f.name, f.default)
        where = help_group(parser, f.name)
        kw: dict[str, Any] = {"help": md.get("help", ""), "dest": f.name}
        if f.type in (bool, "bool"):
            if md.get("flag_off"):
                where.add_argument(md["flag_off"], action="store_false", dest=f.name,
                                   help=md.get("help_off") or f"skip: {kw['help']} (default: done)")
                continue
            flags = [md["short"], flag] if md.get("short") else [flag]
            h = kw["help"] if "(default" in kw["help"] else f"{kw['help']} (default: off)"
            where.add_argument(*flags, action="store_true", help=h, dest=f.name)
            continue
        typ = {"int": int, "float": float, int: int, float: float}.get(f.type, str)
        kw["type"] = typ
        if f.name in METAVARS and "choices" not in md:
            kw["metavar"] = METAVARS[f.name]
        if "choices" in md:
            kw["choices"] = md["choices"]
        if "nargs" in md:
            kw["nargs"] = md["nargs"]
        if md.get("required"):
            kw["required"] = True
        else:
            kw["default"] = default
            if "(default" not in kw["help"]:
                kw["help"] += f" (default: {'none' if default is None else default})"
        where.add_argument(flag, **kw)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build a dataclass from parsed args (fields absent from ``args`` keep defaults)."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    kw.update(overrides)
    return cls(**kw)
