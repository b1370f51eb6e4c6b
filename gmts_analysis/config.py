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
class ProbeConfig:
    """Everything a probe run depends on (recorded in manifest.json)."""

    model: str = opt("small", "model directory, hub id, or a shipped policy: tiny | small", required=True)
    rollouts: str = opt(None, "rollouts file (.jsonl or .parquet; SPEC section 7)", required=True)
    out: str = opt(None, "output run directory", required=True)
    format: str = opt("auto", "rollouts format", choices=("auto", "gmts", "verl", "trl"))
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    dtype: str = opt("float32", "model dtype (statistics are always float32 or better)",
                     choices=("float32", "float64", "bfloat16", "float16"))
    temperature: float = opt(1.0, "sampling temperature tau: p = softmax(z / tau)")
    advantage: str = opt("group", "advantage estimator (SPEC section 3)", choices=("group", "batch", "none"))
    loss_agg: str = opt("token-mean", "loss aggregation weights (SPEC section 3)",
                        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
    max_len: int = opt(None, "generation budget L_max for seq-mean-token-sum-norm (default: longest answer)")
    clip_low: float = opt(0.2, "PPO clip epsilon below 1 (off-policy omega)")
    clip_high: float = opt(0.28, "PPO clip epsilon above 1 (off-policy omega)")
    kl_beta: float = opt(0.0, "k3 KL penalty weight against ref_logprobs")
    grad_norm: str = opt("exact", "per-token gradient norm: exact | sketch (Gaussian JVP) | none",
                         choices=("exact", "sketch", "none"))
    probes: int = opt(32, "number of random directions for --grad-norm sketch")
    chunk_size: str = opt("auto", "tokens per batched VJP (an integer, or auto from --max-memory)")
    max_memory: int = opt(None, "memory budget in MiB for --chunk-size auto")
    grad_groups: str = opt(None, "also write grad_groups.parquet per layer or module", choices=("layer", "module"))
    fidelity: str = opt("auto", "update fidelity of selections (needs the model): auto = on under 100k tokens",
                        choices=("auto", "on", "off"))
    verifier: str = opt(None, "score answers without a reward: a toy domain name, or 'domain' to use each row's domain")
    truncate: bool = opt(False, "cut responses that do not fit the model's context instead of failing")
    figures: bool = opt(True, "render figures/ and report.html", flag_off="--no-figures")
    seed: int = opt(0, "seed for sketches, bootstrap and random selections")
    overwrite: bool = opt(False, "replace an existing output directory (default: resume a run of the same "
                          "model, rollouts and configuration; refuse anything else)")
    strict: bool = opt(False, "stop at the first answer that fails (default: record it in errors.jsonl and go on)")
    answers_per_chunk: int = opt(16, "answers per recorded chunk: a killed run redoes at most one chunk per rank")
    quiet: bool = opt(False, "no progress bars")


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
