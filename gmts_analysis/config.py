"""Option dataclasses shared by the CLI and the Python API.

Each field's ``metadata['help']`` is its ``--help`` text; :func:`add_dataclass_args`
turns a dataclass into argparse flags (``loss_agg`` -> ``--loss-agg``).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any


def opt(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ProbeOptions:
    """The probe's mathematics and execution options: what the numbers depend on (no files).

    This is what the Python API takes as ``**options`` (``gmts.probe(model, rollouts,
    temperature=0.7)``) and what :mod:`gmts_analysis.kernel` reads. Every field is also a
    ``gmts probe`` flag (``loss_agg`` -> ``--loss-agg``). Add a field here for a new option.
    """

    format: str = opt("auto", "rollouts format", choices=("auto", "gmts", "verl", "trl"))
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    dtype: str = opt("float32", "model dtype (statistics are always float32 or better)",
                     choices=("float32", "float64", "bfloat16", "float16"))
    temperature: float = opt(1.0, "sampling temperature tau: p = softmax(z / tau)")
    advantage: str = opt("group", "advantage estimator (docs/definitions.md section 3)",
                         choices=("group", "batch", "none", "logged"))
    loss_agg: str = opt("token-mean", "loss aggregation weights (docs/definitions.md section 3)",
                        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    max_len: int = opt(None, "generation budget L_max for seq-mean-token-sum-norm (default: longest answer)")
    loss_type: str = opt(None, "TRL loss_type that was trained: grpo | bnpo | dapo | dr_grpo (sets --loss-agg; "
                         "TRL's bias-corrected KL); cispo, sapo, vespo, luspo are refused")
    clip_low: float = opt(0.2, "PPO clip epsilon below 1 (off-policy omega; TRL epsilon, verl clip_ratio_low)")
    clip_high: float = opt(0.2, "PPO clip epsilon above 1 (TRL epsilon_high, default epsilon; DAPO uses 0.28)")
    clip_ratio_c: float = opt(None, "verl's dual clip c > 1: no gradient where A < 0 and ratio > c (default off)")
    kl_beta: float = opt(0.0, "k3 KL penalty weight against ref_logprobs")
    kl_bias_correction: str = opt("auto", "TRL's use_bias_correction_kl (KL term times the ratio): auto = on "
                                  "with --loss-type", choices=("auto", "on", "off"))
    importance_sampling_level: str = opt("token", "importance ratio per token, or one per answer (GSPO)",
                                         choices=("token", "sequence"))
    vllm_is_mode: str = opt(None, "TRL's vLLM importance-sampling correction (needs sampling_logprobs)",
                            choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"))
    vllm_is_min: float = opt(None, "vLLM importance-sampling lower bound C_min (default none)")
    vllm_is_max: float = opt(3.0, "vLLM importance-sampling upper bound C_max")
    grad_norm: str = opt("exact", "per-token gradient norm: exact | sketch (Gaussian JVP) | none",
                         choices=("exact", "sketch", "none"))
    probes: int = opt(32, "number of random sketch directions for --grad-norm sketch")
    chunk_size: str = opt("auto", "tokens per batched VJP (an integer, or auto from --max-memory)")
    max_memory: int = opt(None, "memory budget in MiB for --chunk-size auto")
    grad_groups: str = opt(None, "also write grad_groups.parquet per layer or module", choices=("layer", "module"))
    fidelity: str = opt("auto", "update fidelity of selections (needs the model): auto = on under 100k tokens",
                        choices=("auto", "on", "off"))
    verifier: str = opt(None, "score answers without a reward: a toy domain name, or 'domain' to use each row's domain")
    truncate: bool = opt(False, "cut responses that do not fit the model's context instead of failing")
    seed: int = opt(0, "seed for sketches, bootstrap and random selections")

    def options(self) -> "ProbeOptions":
        """The options alone (drops job settings when called on a :class:`ProbeConfig`)."""
        return ProbeOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ProbeOptions)})


@dataclass
class JobSettings:
    """Where a probe job reads and writes, and how it runs; never changes a number."""

    model: str = opt("small", "model directory, hub id, or a shipped policy: tiny | small", required=True)
    rollouts: str = opt(None, "rollouts file (.jsonl or .parquet; docs/definitions.md section 7)", required=True)
    out: str = opt(None, "output run directory", required=True)
    figures: bool = opt(True, "render figures/ and report.html", flag_off="--no-figures")
    overwrite: bool = opt(False, "replace an existing output directory (default: resume a run of the same "
                          "model, rollouts and configuration; refuse anything else)")
    strict: bool = opt(False, "stop at the first answer that fails (default: record it in errors.jsonl and go on)")
    answers_per_chunk: int = opt(16, "answers per record (a resumable unit of work): a killed run redoes "
                                 "at most one record per rank")
    quiet: bool = opt(False, "no progress bars")


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


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--flag`` per dataclass field (bools become switches)."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        md = f.metadata
        kw: dict[str, Any] = {"help": md.get("help", ""), "dest": f.name}
        if f.type in (bool, "bool"):
            if md.get("flag_off"):
                parser.add_argument(md["flag_off"], action="store_false", dest=f.name, help=f"do not: {kw['help']}")
                continue
            parser.add_argument(flag, action="store_true", **kw)
            continue
        typ = {"int": int, "float": float, int: int, float: float}.get(f.type, str)
        kw["type"] = typ
        if "choices" in md:
            kw["choices"] = md["choices"]
        if md.get("required"):
            kw["required"] = True
        else:
            kw["default"] = f.default
            if f.default is not None:
                kw["help"] += f" (default: {f.default})"
        parser.add_argument(flag, **kw)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build a dataclass from parsed args (fields absent from ``args`` keep defaults)."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    kw.update(overrides)
    return cls(**kw)
