"""Finish a run directory: statistics, update fidelity, manifest, figures and report
(SPEC section 8), written atomically: the directory appears complete or not at all."""

from __future__ import annotations

import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from gmts_analysis.config import ProbeConfig
from gmts_analysis.kernel import ProbeResult
from gmts_analysis.rollouts import Answer


def package_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("gmts_analysis", "torch", "transformers", "numpy", "pandas", "scipy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            if name == "gmts_analysis":
                from gmts_analysis import __version__

                out[name] = __version__
    return out


def build_manifest(cfg: ProbeConfig, model: torch.nn.Module, model_path: str, result: ProbeResult,
                   extra: dict | None = None) -> dict:
    """The run's metadata (SPEC section 8)."""
    from gmts_analysis.models import trainable_parameters

    dev = next(model.parameters()).device
    method = cfg.grad_norm
    m = {
        "config": asdict(cfg),
        "model_path": model_path,
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "n_parameters": int(sum(p.numel() for _, p in trainable_parameters(model))),
        "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "versions": package_versions(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "dtype": cfg.dtype,
        "grad_norm_method": method,
        "seed": cfg.seed,
        "n_answers": int(len(result.answers)),
        "n_tokens": int(len(result.tokens)),
        "n_groups": int(result.answers["group_id"].nunique()) if len(result.answers) else 0,
        "timings": result.timings,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if method == "sketch":
        m["probes"] = cfg.probes
    if extra:
        m.update(extra)
    return m


def fidelity_enabled(cfg: ProbeConfig, n_tokens: int) -> bool:
    if cfg.fidelity == "on":
        return True
    if cfg.fidelity == "off" or cfg.grad_norm == "none":
        return False
    return n_tokens < 100_000


def write_run(cfg: ProbeConfig, model: torch.nn.Module, model_path: str, answers: Sequence[Answer],
              result: ProbeResult, extra: dict | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """Statistics, fidelity, manifest, figures and report; the directory appears complete or not at all.

    ``extra_files`` maps file names to text written into the run directory too (e.g. the
    sampled ``rollouts.jsonl`` of ``gmts run``).
    """
    from gmts_analysis import io
    from gmts_analysis.stats import compute_stats

    t0 = time.perf_counter()
    stats = compute_stats(result.tokens, result.answers, seed=cfg.seed)
    result.timings["stats_s"] = time.perf_counter() - t0
    if fidelity_enabled(cfg, len(result.tokens)):
        from gmts_analysis.fidelity import fidelity_for_run

        t0 = time.perf_counter()
        stats.update(fidelity_for_run(model, answers, result.tokens, cfg, stats=stats))
        result.timings["fidelity_s"] = time.perf_counter() - t0
    manifest = build_manifest(cfg, model, model_path, result, extra)
    with io.staged_directory(cfg.out, overwrite=cfg.overwrite) as tmp:
        io.atomic_write_parquet(tmp / "tokens.parquet", result.tokens)
        io.atomic_write_parquet(tmp / "answers.parquet", result.answers)
        if result.grad_groups is not None:
            io.atomic_write_parquet(tmp / "grad_groups.parquet", result.grad_groups)
        io.atomic_write_json(tmp / "stats.json", stats)
        io.atomic_write_json(tmp / "manifest.json", manifest)
        for name, text in (extra_files or {}).items():
            io.atomic_write_text(tmp / name, text)
        if cfg.figures:
            from gmts_analysis.plots import render_all
            from gmts_analysis.report import write_report

            t0 = time.perf_counter()
            render_all(tmp)
            write_report(tmp)
            manifest["timings"]["figures_s"] = time.perf_counter() - t0
            io.atomic_write_json(tmp / "manifest.json", manifest)
    return Path(cfg.out)

