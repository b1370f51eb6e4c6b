"""The option dataclasses of the probe, the job, sampling and the shared flags.

Each field declares one option once (:func:`~gmts_analysis.options.fields.opt`: help, group, unit,
choices, check, TRL/verl aliases); :func:`~gmts_analysis.options.parser.add_fields` turns a dataclass
into argparse flags (``loss_agg`` -> ``--loss-agg``), :func:`options_from_kwargs` into API keywords.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import gmts_analysis.options.checks as checks
from gmts_analysis.core.vocabulary import (
    ADVANTAGE_MODES,
    DEFAULT_CLIP,
    DEFAULT_RHO,
    DEFAULT_UNCERTAIN_BELOW,
    DEFAULT_VLLM_IS_MAX,
    GRAD_NORM_METHODS,
    IS_LEVELS,
    LOSS_AGGS,
    LOSS_TYPES,
    REFUSED_LOSS_TYPES,
    RHOS,
    VLLM_IS_MODES,
)
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.fields import alias, aliases_of, opt, resolve_aliases
from gmts_analysis.options.parser import ExamplesHelpFormatter, add_fields, from_args  # noqa: F401 - re-exported
from gmts_analysis.readers.formats import FORMATS
from gmts_analysis.readers.models import DTYPE_NAMES

THREADS_HELP = ("torch CPU threads (default: the cores idle now, from a 0.15 s sample of /proc/stat, at least 1; "
                "or $GMTS_THREADS): a shared machine's default of every core can run 10x slower")
DEVICE_HELP = "auto | cpu | cuda | cuda:N; auto = cuda if available, else cpu"
DTYPES = DTYPE_NAMES  # the model dtypes the readers load (one list: readers.models)
OFFLINE_HELP = ("never download: a hub --model must already be in the local Hugging Face cache "
                "(HF_HUB_OFFLINE=1 does the same)")
QUIET_HELP = "no progress bars; only warnings and errors on stderr"
#: the names of the older gmts 0.1 flags
OLD_NAMES = "gmts 0.1 (sample / run / rl)"


@dataclass
class ProbeOptions:
    """The probe's mathematics and execution options: what the numbers depend on (no files).

    This is what the Python API takes as ``**options`` (``gmts.probe(model, rollouts,
    temperature=0.7)``) and what :mod:`gmts_analysis.probing.kernel` reads. Every field is also a
    ``gmts probe`` flag (``loss_agg`` -> ``--loss-agg``). Add a field here for a new option.
    """

    format: str = opt("auto", "rollouts format", choices=FORMATS, group="inputs")
    device: str = opt("auto", DEVICE_HELP, group="gradient engine", metavar="DEVICE", check=checks.device)
    dtype: str = opt("float32", "model dtype (statistics are always float32 or better)",
                     choices=DTYPES, group="gradient engine")
    temperature: float = opt(1.0, "sampling temperature tau: p = softmax(z / tau)", group="RL objective",
                             metavar="TAU", check=checks.positive_finite)
    advantage: str = opt("group", "advantage estimator (docs/definitions.md section 3)",
                         choices=ADVANTAGE_MODES, group="RL objective", aliases=(
                             alias("scale_rewards", "TRL GRPOConfig.scale_rewards",
                                   values={"group": "group", "batch": "batch", "none": "none", "true": "group",
                                           "false": "none"}),
                             alias("norm_adv_by_std_in_grpo", "verl algorithm.norm_adv_by_std_in_grpo",
                                   values={"true": "group", "false": "none"})))
    loss_agg: str = opt("token-mean", "per-token loss weight w (docs/definitions.md section 3): token-mean "
                        "1/sum_j L_j, seq-mean-token-mean 1/(N L_i), seq-mean-token-sum-norm 1/(N L_max), and "
                        "verl's seq-mean-token-sum 1/N, token-sum 1",
                        choices=LOSS_AGGS, group="RL objective",
                        aliases=(alias("loss_agg_mode", "verl actor.loss_agg_mode"),))
    max_len: int = opt(None, "generation budget L_max in tokens for seq-mean-token-sum-norm (default: "
                       "--max-completion-length, else the longest answer)", group="RL objective", metavar="TOKENS",
                       check=checks.int_at_least(1), aliases=(
                           alias("loss_scale_factor", "verl actor.loss_scale_factor (L_max of "
                                 "seq-mean-token-sum-norm)"),))
    loss_type: str = opt(None, f"TRL loss_type that was trained: {' | '.join(LOSS_TYPES)} (sets --loss-agg; "
                         f"TRL's bias-corrected KL); {', '.join(REFUSED_LOSS_TYPES)} are refused",
                         group="RL objective", metavar="TYPE", trl_name=True)
    clip_low: float = opt(DEFAULT_CLIP, "PPO clip epsilon below 1 (off-policy omega; TRL epsilon, verl clip_ratio_low)",
                          group="RL objective", metavar="EPS", check=checks.number_in(0, 1, domain="in [0, 1)"),
                          aliases=(alias("epsilon", "TRL GRPOConfig.epsilon (also epsilon_high unless given)",
                                         fill=("clip_high",)),
                                   alias("clip_ratio", "verl actor.clip_ratio (both sides unless given)",
                                         fill=("clip_high",)),
                                   alias("clip_ratio_low", "verl actor.clip_ratio_low")))
    clip_high: float = opt(DEFAULT_CLIP, "PPO clip epsilon above 1 (TRL epsilon_high, default epsilon; DAPO uses 0.28)",
                           group="RL objective", metavar="EPS", check=checks.number_in(0, 1, domain="in [0, 1)"),
                           aliases=(alias("epsilon_high", "TRL GRPOConfig.epsilon_high"),
                                    alias("clip_ratio_high", "verl actor.clip_ratio_high")))
    clip_ratio_c: float = opt(None, "verl's dual clip c > 1: no gradient where A < 0 and ratio > c (default off)",
                              group="RL objective", metavar="C",
                              check=checks.number_in(1, low_open=True, domain="a finite number > 1"))
    kl_beta: float = opt(0.0, "k3 KL penalty weight against ref_logprobs", group="RL objective", metavar="BETA",
                         check=checks.nonneg_finite, aliases=(
                             alias("beta", "TRL GRPOConfig.beta"),
                             alias("kl_loss_coef", "verl actor.kl_loss_coef (with use_kl_loss, kl_loss_type "
                                   "low_var_kl = k3)")))
    kl_bias_correction: str = opt("auto", "TRL's use_bias_correction_kl (KL term times the ratio): auto = on "
                                  "with --loss-type", choices=("auto", "on", "off"), group="RL objective",
                                  aliases=(alias("use_bias_correction_kl", "TRL GRPOConfig.use_bias_correction_kl",
                                                 values={"true": "on", "false": "off", "auto": "auto", "on": "on",
                                                         "off": "off"}),))
    importance_sampling_level: str = opt("token", "importance ratio per token, or one per answer (GSPO)",
                                         choices=IS_LEVELS, group="RL objective", trl_name=True)
    vllm_is_mode: str = opt(None, "TRL's vLLM importance-sampling correction (needs sampling_logprobs)",
                            choices=VLLM_IS_MODES, group="RL objective", aliases=(
                                alias("vllm_importance_sampling_mode", "TRL GRPOConfig.vllm_importance_sampling_mode "
                                      "(applied only when given: TRL's correction is on by default, but only for "
                                      "vLLM generation)"),))
    vllm_is_min: float = opt(None, "vLLM importance-sampling lower bound C_min (default none)", group="RL objective",
                             metavar="C_MIN", check=checks.nonneg_finite, aliases=(
                                 alias("vllm_importance_sampling_clip_min",
                                       "TRL GRPOConfig.vllm_importance_sampling_clip_min"),))
    vllm_is_max: float = opt(DEFAULT_VLLM_IS_MAX, "vLLM importance-sampling upper bound C_max", group="RL objective",
                             metavar="C_MAX", check=checks.positive_finite, aliases=(
                                 alias("vllm_importance_sampling_clip_max",
                                       "TRL GRPOConfig.vllm_importance_sampling_clip_max"),))
    grad_norm: str = opt("exact", "per-token gradient norm: " + " | ".join(
                         f"{k} ({v})" if v else k for k, v in GRAD_NORM_METHODS.items()),
                         choices=tuple(GRAD_NORM_METHODS), group="gradient engine")
    probes: int = opt(32, "number of random sketch directions for --grad-norm sketch", group="gradient engine",
                      metavar="K", check=checks.probes)
    chunk_size: str = opt("auto", "tokens per batched VJP (an integer, or auto from --max-memory)",
                          group="gradient engine", metavar="TOKENS|auto", check=checks.chunk_size)
    max_memory: int = opt(None, "memory budget in MiB for --chunk-size auto", group="gradient engine",
                          metavar="MiB", check=checks.int_at_least(1))
    grad_groups: str = opt(None, "also write grad_groups.parquet per layer or module", choices=("layer", "module"),
                           group="gradient engine")
    fidelity: str = opt("auto", "update fidelity of selections (needs the model): auto = on under 100k tokens when its "
                        "gradients fit in memory (n_estimators+7 copies of the parameters in 2 GiB)",
                        choices=("auto", "on", "off"), group="output")
    verifier: str = opt(None, "score answers without a reward: a toy domain name, or 'domain' to use each row's domain",
                        group="inputs", metavar="NAME", check=checks.verifier)
    truncate: bool = opt(False, "cut responses that do not fit the model's context instead of failing", group="inputs")
    steps: str = opt(None, "read only these training steps of a rollouts directory: '10,20' or ranges '10-30'",
                     group="inputs", metavar="STEPS")
    reward_columns: str = opt(None, "TRL tables: the reward-function columns NAME[,NAME...] whose weighted sum "
                              "(NaN skipped, as TRL) is the reward; required when several columns are numeric",
                              group="inputs", metavar="NAME[,NAME...]")
    reward_weights: str = opt(None, "TRL reward_weights for --reward-columns, W[,W...] (default: 1 each)",
                              group="inputs", metavar="W[,W...]")
    num_generations: int = opt(None, "answers per prompt G: consecutive blocks of G rows are one group when the "
                               "rows have no group id (as TRL logs them)", group="inputs", metavar="G",
                               check=checks.int_at_least(1), trl_name=True)
    chat_template: str = opt("auto", "message-list prompts through the tokenizer's chat template with the "
                             "generation prompt; auto: message lists (and verl prompts it matches), on: also text "
                             "prompts, off: never", choices=("auto", "on", "off"), group="inputs")
    max_completion_length: int = opt(None, "the trainer's completion length limit: TRL/verl text responses "
                                     "shorter than it get their stop token (EOS) back, those reaching it do not",
                                     group="inputs", metavar="TOKENS", check=checks.int_at_least(1), trl_name=True,
                                     aliases=(alias("max_response_length", "verl data.max_response_length"),))
    mask_truncated_completions: bool = opt(False, "TRL's mask_truncated_completions: answers that do not end "
                                           "with a stop token (EOS or pad) get loss weight 0 and leave the "
                                           "token-mean denominator; their rewards still enter the baselines",
                                           group="RL objective", trl_name=True)
    rho: float = opt(DEFAULT_RHO, "keep fraction of the token selections (TRL's top_entropy_quantile) used by the "
                     "report, "
                     "update fidelity and the headline top-k overlap; the statistics also report their grid "
                     f"{', '.join(map(str, RHOS))}", group="RL objective", metavar="FRACTION", check=checks.rho,
                     aliases=(alias("top_entropy_quantile", "TRL GRPOConfig.top_entropy_quantile"),))
    uncertain_below: float = opt(DEFAULT_UNCERTAIN_BELOW, "the statistics' uncertain-token view keeps the tokens "
                                 "whose probability under the policy is below this (stats.json 'uncertain', "
                                 "meta.uncertain_below)", group="RL objective", metavar="PROB",
                                 check=checks.probability)
    seed: int = opt(0, "seed for sketches, bootstrap and random selections", group="run control", metavar="INT",
                    check=checks.seed)

    def options(self) -> "ProbeOptions":
        """The options alone (drops job settings when called on a :class:`ProbeConfig`)."""
        return ProbeOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ProbeOptions)})


@dataclass
class JobSettings:
    """Where a probe job reads and writes, and how it runs; never changes a number."""

    model: str = opt("small", "model directory, hub id, or a shipped policy: tiny | small", required=True,
                     group="inputs", metavar="PATH|FILE.gguf|HUB_ID|tiny|small|smollm2", check=checks.model,
                     aliases=(alias("model_name_or_path", "TRL ModelConfig.model_name_or_path"),))
    rollouts: str = opt(None, "rollouts file (.jsonl or .parquet; docs/definitions.md section 7), or a TRL "
                        "output_dir (its completions/ is read)", required=True, group="inputs", metavar="PATH",
                        check=checks.input_path)
    out: str = opt(None, "output run directory (TRL's output_dir) (default: runs/<command>-YYYYmmdd-HHMMSS)",
                   group="output", metavar="DIR", check=checks.output_path,
                   aliases=(alias("output_dir", "TRL TrainingArguments.output_dir"),))
    figures: bool = opt(True, "render figures/ and report.html", flag_off="--no-figures",
                        help_off="skip figures/ and report.html (default: both are written)", group="output")
    overwrite: bool = opt(False, "replace an existing output directory (default: resume a run of the same "
                          "model, rollouts and configuration; refuse anything else)", group="output")
    strict: bool = opt(False, "stop at the first answer that fails, and count an answer the exact engine refuses "
                       "as failed (default: record a failed answer in errors.jsonl and go on; send a refused "
                       "one to the per-token loop, exact but slower, with a warning)")
    answers_per_chunk: int = opt(None, "answers per record (a resumable unit of work): a killed run redoes "
                                 "at most one record per rank (default: auto, a rank's answers / 8 rounded up, "
                                 "between 1 and 16: a run of 16 answers is cut into 8 records; the manifest "
                                 "records the value used)", metavar="ANSWERS", check=checks.int_at_least(1))
    quiet: bool = opt(False, QUIET_HELP, short="-q")
    threads: int = opt(None, THREADS_HELP, metavar="THREADS", check=checks.int_at_least(1))
    offline: bool = opt(False, OFFLINE_HELP + "; without it a hub id is downloaded as transformers does",
                        group="inputs")
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
                     "(tiny | small), or smollm2 (SmolLM2-135M-Instruct, the real extra)", group="inputs",
                     metavar="PATH|FILE.gguf|HUB_ID|tiny|small|smollm2", check=checks.model)
    domains: str = opt(None, "one or more of the toy domains (arithmetic, program, logic) and word (grade-school "
                       "word problems through the chat template, math verifier: for real models), space- or "
                       "comma-separated (default: the three toy domains for a toy policy; gmts run: word for any "
                       "other model; gmts sample: unless --prompts)", nargs="+", group="inputs", metavar="DOMAIN",
                       check=checks.domains)
    prompts: str = opt(None, "instead of --domains: a JSONL/parquet prompts file for any checkpoint ('prompt': "
                       "text or chat messages, plus the verifier's columns such as 'solution')", group="inputs",
                       metavar="FILE", check=checks.input_file)
    verifier: str = opt(None, "with --prompts: reward function (math, math_boxed, a toy domain, or module:function / "
                        "file.py:function, called as TRL calls reward functions); without it no reward is written. "
                        "On the word problems: math_boxed (the default: the last \\boxed{} only) or math (adds "
                        "its fallback to an expression anywhere in the text; counted in stats.json's reward_audit)",
                        group="inputs", metavar="NAME", check=checks.verifier)
    chat_template: str = opt("auto", "with --prompts: auto = message prompts through the chat template, text as "
                             "is; on = text prompts as one user message too; off = no template",
                             choices=("auto", "on", "off"), group="inputs")
    num_prompts: int = opt(None, "prompts (groups) per toy domain (default: 8); with --prompts: the first N "
                           "(default: all)", group="inputs", metavar="PROMPTS", check=checks.int_at_least(1))
    num_generations: int = opt(8, "answers per prompt G (a group; at least 2: a group needs a baseline)",
                               group="inputs", metavar="G", check=checks.int_at_least(2, "a group needs a baseline"),
                               trl_name=True, aliases=(alias("group_size", OLD_NAMES + "; TRL's num_generations "
                                                             "is the name"),))
    temperature: float = opt(1.0, "sampling temperature tau (0: greedy)", group="RL objective", metavar="TAU",
                             check=checks.nonneg_finite)  # gmts run: > 0, the probe's (ProbeOptions) too
    max_completion_length: int = opt(None, "generation budget per answer in tokens (default: the policy "
                                     "card's, else 96)", group="inputs", metavar="TOKENS",
                                     check=checks.int_at_least(1), trl_name=True, aliases=(
                                         alias("max_new_tokens", "gmts 0.1 and transformers generate() (sample / "
                                               "run / rl); TRL's max_completion_length is the name"),))
    difficulty: int = opt(None, "toy difficulty level 1-3 (default: uniform mix)", group="inputs", metavar="LEVEL",
                          check=checks.difficulty)
    seed: int = opt(0, "seed of the prompts and the sampling (the same seed gives the same rows on one device)",
                    group="run control", metavar="INT", check=checks.seed)
    batch_size: int = opt(64, "sequences generated together", metavar="SEQUENCES", check=checks.int_at_least(1))
    device: str = opt("auto", DEVICE_HELP, group="gradient engine", metavar="DEVICE", check=checks.device)
    dtype: str = opt("float32", "model dtype", choices=DTYPES, group="gradient engine")


@dataclass
class OutputOptions:
    """Where a writer puts its result (``gmts sample``, ``compare``, ``stats``): ``out`` is TRL's ``output_dir``."""

    out: str = opt(None, "output directory (TRL's output_dir) (default: runs/<command>-YYYYmmdd-HHMMSS)",
                   group="output", metavar="DIR", check=checks.output_path)
    overwrite: bool = opt(False, "replace an existing output", group="output")


@dataclass
class RunControl:
    """How a command runs, never what it computes: threads, progress, downloads."""

    threads: int = opt(None, THREADS_HELP, metavar="THREADS", check=checks.int_at_least(1))
    quiet: bool = opt(False, QUIET_HELP, short="-q")
    offline: bool = opt(False, OFFLINE_HELP, group="inputs")


@dataclass
class ConfigFile:
    """``--config FILE.yaml`` (``gmts probe``): options read from a file (:mod:`gmts_analysis.options.config_file`)."""

    config: str = opt(None, "read options from a YAML file (keys: option names, ours or TRL's/verl's, either "
                      "spelling); flags on the command line override it; unknown keys are refused (default: none)",
                      group="inputs", metavar="FILE.yaml")


@dataclass
class Debug:
    """``--debug``: the traceback of an unexpected error (every subcommand, and ``gmts`` itself)."""

    debug: bool = opt(False, "show the full traceback of an unexpected error", show_default=False,
                      suppress_default=True)


def default_out(command: str) -> str:
    """The default output folder of a writer: ``runs/<command>-YYYYmmdd-HHMMSS`` (UTC)."""
    import time

    return time.strftime(f"runs/{command}-%Y%m%d-%H%M%S", time.gmtime())


def add_options(parser: argparse.ArgumentParser, *classes: type, skip: tuple[str, ...] = (),
                defaults: dict[str, Any] | None = None) -> None:
    """The flags of several option dataclasses, each name once (:func:`~gmts_analysis.options.parser.add_fields`)."""
    add_fields(parser, *classes, skip=skip, defaults=defaults)


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


class DataclassInstance(Protocol):
    """Any instance of a dataclass (the type of :func:`dataclasses.fields`'s argument)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


def check_values(opts: DataclassInstance, skip: tuple[str, ...] = ()) -> None:
    """Refuse a field of the dataclass ``opts`` (an option dataclass of this module) of the wrong type or
    outside its choices, naming it as the API keyword (``option max_completion_length='x': expected int``)."""
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

    names = option_names()
    kwargs = resolve_aliases(kwargs, names, aliases_of(*DECLARED))
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


#: the option dataclasses whose fields declare TRL/verl aliases (``gmts probe``/``run``/``sample`` and the API)
DECLARED: tuple[type, ...] = (ProbeOptions, JobSettings, SamplingOptions, OutputOptions, RunControl)
