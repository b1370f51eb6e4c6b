"""Finish a probe: from a probe result to the in-memory run, then to a run directory.

1. :func:`result_tables`: statistics and update fidelity (:func:`run_stats`) and the manifest
   (:func:`build_manifest`) of a :class:`~gmts_analysis.probing.kernel.ProbeResult`, as
   :class:`~gmts_analysis.analysis.runs.RunTables` (nothing written);
2. :func:`write_run_dir`: those tables as a run directory with figures and report
   (docs/definitions.md section 8), written atomically: it appears complete or not at all.

The Python API calls them one at a time (:func:`gmts_analysis.api.probe`, then ``Run.save``);
the job calls :func:`write_result`, the two in a row, from
:func:`gmts_analysis.run.sharding.merge.write_merged_run` (after
:func:`gmts_analysis.run.sharding.run.finish_job`).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

import torch

from gmts_analysis import __version__
from gmts_analysis.analysis.runs import RunTables, json_normalise, write_tables
from gmts_analysis.analysis.stats import compute_stats, run_rho_key
from gmts_analysis.analysis.token_strings import write_token_strings
from gmts_analysis.engine.fidelity import fidelity_for_run
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.options.config import ProbeConfig, ProbeOptions
from gmts_analysis.probing.kernel import ProbeResult
from gmts_analysis.probing.preflight import fidelity_decision
from gmts_analysis.probing.settings import EngineSettings, ProbeSettings
from gmts_analysis.readers.rollouts import Answer
from gmts_analysis.util import io
from gmts_analysis.views.report import write_report


def package_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("gmts_analysis", "torch", "transformers", "numpy", "pandas", "scipy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            if name == "gmts_analysis":
                out[name] = __version__
    return out


def build_manifest(record: ProbeOptions, settings: ProbeSettings, model: torch.nn.Module, model_path: str,
                   result: ProbeResult, extra: dict | None = None, aliases: Mapping[str, str] | None = None,
                   config_file: str | None = None) -> dict:
    """The run's metadata (docs/definitions.md section 8); ``config`` holds every field of ``record``, the
    options as given (plus the job settings when it is a :class:`ProbeConfig`), of which ``settings`` are
    the parts. ``aliases`` (the TRL/verl names the command used, mapped to ours) and ``config_file`` (its
    --config file): the job's, when it has them."""

    dev = next(model.parameters()).device
    engine = settings.kernel.engine
    method, counts = run_grad_norm_method(engine.method, result)
    m = {
        "config": asdict(record),
        "model_path": model_path,
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "n_parameters": int(sum(p.numel() for _, p in trainable_parameters(model))),
        "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "versions": package_versions(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "dtype": settings.dtype,
        "grad_norm_method": method,  # "mixed" when some answers went to the per-token loop
        "grad_norm_methods": counts,  # answers per method
        "n_loop_answers": int(counts.get("loop", 0)),
        "seed": engine.seed,
        "n_answers": int(len(result.answers)),
        "n_tokens": int(len(result.tokens)),
        "n_groups": int(result.answers["group_id"].nunique()) if len(result.answers) else 0,
        "timings": result.timings,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if method == "sketch":
        m["probes"] = engine.probes
    if counts.get("sketch"):  # the directions' random stream depends on the device type (engine/sketch.py)
        m["sketch_stream_device"] = dev.type
    # the objective omega was computed under, after TRL's loss_type and the aliases are resolved
    # (loss_type dr_grpo is recorded as loss_agg seq-mean-token-sum-norm with its L_max)
    m["objective"] = asdict(settings.kernel.loss)
    # TRL/verl names the command used, mapped to ours, and the --config file (gmts_analysis.options)
    m["aliases"] = dict(aliases or {})
    if config_file:
        m["config_file"] = config_file
    if extra:
        m.update(extra)
    return m


def answer_methods(method: str, result: ProbeResult) -> list[str]:
    """The gradient-norm method of each answer of ``result`` (its tokens' ``grad_norm_method``;
    ``method``, the option, for an answer without tokens or a table without the column)."""
    tok = result.tokens
    per = {}
    if "grad_norm_method" in tok.columns and len(tok):
        per = dict(zip(tok["answer_id"], tok["grad_norm_method"]))
    def of(a) -> str:  # a chunk record written before the column existed has NaN there
        v = per.get(a)
        return v if isinstance(v, str) else method

    return [of(a) for a in result.answers["answer_id"]] if len(result.answers) else []


def run_grad_norm_method(method: str, result: ProbeResult) -> tuple[str, dict[str, int]]:
    """``(method, answers per method)``: the method when every answer used it, else ``mixed``
    (some answers refused by the exact engine went to the per-token loop); ``method``, the option,
    when there is no answer."""
    counts: dict[str, int] = {}
    for m in answer_methods(method, result):
        counts[m] = counts.get(m, 0) + 1
    used = next(iter(counts)) if len(counts) == 1 else ("mixed" if counts else method)
    return used, counts


def add_answer_methods(method: str, result: ProbeResult) -> None:
    """The ``grad_norm_method`` column of ``result.answers`` (from the tokens table; ``method``, the
    option, where it says nothing)."""
    if len(result.answers):
        result.answers["grad_norm_method"] = answer_methods(method, result)


def fidelity_enabled(engine: EngineSettings, n_tokens: int, model: torch.nn.Module | None = None) -> bool:
    """Whether update fidelity runs: :func:`gmts_analysis.probing.preflight.fidelity_decision` (auto: on under
    100k tokens when its accumulators fit the budget; the model gives their size)."""
    if model is not None:
        return fidelity_decision(engine, model, n_tokens)[0]
    if engine.fidelity == "on":
        return True
    if engine.fidelity == "off" or engine.method == "none":
        return False
    return n_tokens < 100_000


def run_stats(settings: ProbeSettings, model: torch.nn.Module, answers: Sequence[Answer], result: ProbeResult,
              progress: bool = False) -> dict:
    """The stats.json dict of a probe result: statistics, and update fidelity when enabled
    (:func:`fidelity_enabled`; needs the model; ``progress``: its bar). Adds ``stats_s``/``fidelity_s`` to ``result.timings``."""

    st = settings.statistics
    fidelity: dict = {}
    if fidelity_enabled(settings.kernel.engine, len(result.tokens), model):
        t0 = time.perf_counter()
        fidelity = fidelity_for_run(model, answers, result.tokens, temperature=settings.kernel.temperature,
                                    seed=st.seed, progress=progress, rho=st.rho)
        result.timings["fidelity_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats = compute_stats(result.tokens, result.answers, seed=st.seed, rho=st.rho,
                          uncertain_below=st.uncertain_below, **fidelity)
    result.timings["stats_s"] = time.perf_counter() - t0
    return stats


def result_tables(record: ProbeOptions, settings: ProbeSettings, model: torch.nn.Module, model_path: str,
                  answers: Sequence[Answer], result: ProbeResult, extra: dict | None = None, *,
                  progress: bool = False, aliases: Mapping[str, str] | None = None,
                  config_file: str | None = None) -> RunTables:
    """Statistics, fidelity and manifest of a probe result, as the in-memory run (nothing written);
    ``record``: the options as the manifest records them, ``settings``: their parts; ``progress``,
    ``aliases``, ``config_file``: the job's (:func:`run_stats`, :func:`build_manifest`)."""
    add_answer_methods(settings.kernel.engine.method, result)
    stats = run_stats(settings, model, answers, result, progress=progress)
    manifest = build_manifest(record, settings, model, model_path, result, extra, aliases=aliases,
                              config_file=config_file)
    return RunTables(tokens=result.tokens, answers=result.answers, stats=json_normalise(stats),
                     manifest=json_normalise(manifest), grad_groups=result.grad_groups)


def write_run_dir(run: RunTables, out: str | Path, figures: bool = True, overwrite: bool = False,
                  extra_files: dict[str, str | Path] | None = None) -> Path:
    """Write ``run`` as a complete run directory ``out``: contract files, ``extra_files``
    (name -> text), and with ``figures`` the figures/ and report.html. The directory appears
    complete or not at all; an existing non-empty ``out`` is refused unless ``overwrite``.
    ``run.manifest["timings"]["figures_s"]`` is set when figures are drawn."""
    with io.staged_directory(out, overwrite=overwrite) as tmp:
        write_tables(tmp, run)
        write_token_strings(tmp, run.tokens, rho=float(run_rho_key(run.stats)))  # token_strings.csv
        for name, text in (extra_files or {}).items():  # a text, or a file to copy
            io.atomic_write_text(tmp / name, text.read_text(encoding="utf-8") if isinstance(text, Path) else text)
        if figures:
            from gmts_analysis.views.figures import render_all  # deferred: matplotlib

            t0 = time.perf_counter()
            render_all(tmp)
            write_report(tmp)
            run.manifest.setdefault("timings", {})["figures_s"] = time.perf_counter() - t0
            io.atomic_write_json(tmp / "manifest.json", run.manifest)
    return Path(out)


def write_result(cfg: ProbeConfig, settings: ProbeSettings, model: torch.nn.Module, model_path: str,
                 answers: Sequence[Answer], result: ProbeResult, extra: dict | None = None,
                 extra_files: dict[str, str] | None = None) -> Path:
    """:func:`result_tables` then :func:`write_run_dir` into ``cfg.out`` (with ``cfg.figures``,
    ``cfg.overwrite``): statistics, fidelity, manifest, figures and report; the directory
    appears complete or not at all. ``cfg``: the job's record and its job settings, ``settings``: the
    probe's parts.

    ``extra_files`` maps file names to text written into the run directory too (e.g. the
    sampled ``rollouts.jsonl`` of ``gmts run``).
    """
    run = result_tables(cfg, settings, model, model_path, answers, result, extra, progress=not cfg.quiet,
                        aliases=cfg.aliases, config_file=cfg.config_file)
    return write_run_dir(run, cfg.out, figures=cfg.figures, overwrite=cfg.overwrite, extra_files=extra_files)
