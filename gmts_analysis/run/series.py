"""The checkpoint-series service: one probe per checkpoint of a series, each into its own folder, then their
comparison (:mod:`gmts_analysis.views.compare` draws it). ``gmts probe --model A,B,...`` (:func:`probe_series`)
and ``gmts series`` (:mod:`gmts_analysis.run.trl_series`, which adds the held-out sampling, pass@1 and the token
view around each checkpoint's probe) both go through :func:`run_series`.

- :class:`SeriesStep`: one checkpoint of a series: its step, its path, the name of its run folder;
- :func:`probe_checkpoint`: the probe of one checkpoint into one folder (a probe of the same model, rollouts and
  configuration that exists there is resumed or reused, as any probe; :func:`gmts_analysis.run.job.run_probe`),
  its checkpoint and step recorded in the run's manifest;
- :func:`run_series`: every step in order (the caller's work for each, recorded after each so that a killed
  series keeps what it finished), then ``OUT/compare`` of the steps' runs.

The layout of a TRL output directory (checkpoints by step, the base model) has its one home in
:mod:`gmts_analysis.readers.trl_output`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.readers.gguf import find_gguf
from gmts_analysis.readers.trl_output import is_trl_output, read_trl_output
from gmts_analysis.run.job import run_probe
from gmts_analysis.views.compare import base_at_step_0, compare_runs, last_step, run_step, write_comparison

log = logging.getLogger(__name__)

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class SeriesStep:
    """One checkpoint of a series: ``step`` (None: unknown; the comparison orders such runs as listed),
    ``checkpoint`` (the model's path or name) and ``run``, the name of its run folder under the series' output."""

    step: int | None
    checkpoint: str
    run: str


def checkpoint_series(model: str) -> list[str] | None:
    """The checkpoints named by ``--model``: a comma-separated list, or a directory holding
    checkpoint directories (each with a config.json) that is not itself a model (sorted by the
    step in their names, then by name), or a TRL output directory (its ``checkpoint-N`` folders by step, the
    base model first when recorded: :func:`gmts_analysis.readers.trl_output.read_trl_output`); ``None`` for a
    single model. An existing path is never
    split at its commas (a checkpoint directory may be named ``lr=1e-6,bs=64``)."""
    if "," in model and not os.path.lexists(model):
        items = [m.strip() for m in model.split(",") if m.strip()]
        if len(items) < 2:
            raise GmtsError(f"--model {model!r}: a checkpoint list needs at least two names separated by commas")
        return items
    p = Path(model)
    if is_trl_output(p):  # TRL's output_dir: checkpoint-N by step (the final model at its top is not one of
        # them), the base model first when the example script recorded it
        return [path for _, path in read_trl_output(p).checkpoints]
    if p.is_dir() and not (p / "config.json").exists():
        if find_gguf(p) is not None:  # a folder holding a GGUF file is one model
            return None
        subs = [d for d in p.iterdir() if d.is_dir() and (d / "config.json").exists()]
        if not subs:
            raise GmtsError(f"--model {model}: neither a model (no config.json) nor a directory of checkpoints")

        def key(d: Path) -> tuple:
            step = last_step(d.name)
            return (0, step, d.name) if step is not None else (1, 0, d.name)

        return [str(d) for d in sorted(subs, key=key)]
    return None


def _checkpoint_name(path: str, i: int, names: Sequence[str]) -> str:
    base = Path(path.rstrip("/")).name or f"model{i}"
    return base if names.count(base) == 1 else f"{i:03d}_{base}"


def model_steps(models: Sequence[str]) -> list[SeriesStep]:
    """The :class:`SeriesStep` of each checkpoint of ``gmts probe --model A,B,...``: the step in its name
    (``checkpoint-100``; the one model without a step among checkpoints that all have one is the base, step 0),
    its run folder named after it (``NNN_`` before a name that two checkpoints share)."""
    bases = [Path(m.rstrip("/")).name for m in models]
    steps = base_at_step_0([run_step({"model_path": m, "config": {}})[0] for m in models])
    return [SeriesStep(steps[i], m, _checkpoint_name(m, i, bases)) for i, m in enumerate(models)]


def probe_checkpoint(cfg: ProbeConfig, checkpoint: str, run_dir: Path, extra: dict) -> Path:
    """Probe ``checkpoint`` with ``cfg`` (its model and output folder replaced by ``checkpoint`` and ``run_dir``)
    into ``run_dir``, ``extra`` (the checkpoint, its step, ...) recorded in the run's manifest. A probe of the same
    model, rollouts and configuration there is resumed or reused; any other is refused unless ``cfg.overwrite``.
    Returns the run directory."""
    return run_probe(dataclasses.replace(cfg, model=checkpoint, out=str(run_dir)), extra=extra)


def run_series(steps: Sequence[SeriesStep], out: Path, audit_step: Callable[[int, SeriesStep], R], *,
               record: Callable[[list[R]], None] | None = None, figures: bool = True,
               compare_from: int = 1) -> list[R]:
    """The series ``steps`` in order: ``audit_step(i, step)`` for each (it probes the checkpoint into
    ``out / step.run``, at least), ``record(results so far)`` after each (a killed series keeps what it finished),
    then the comparison of the steps' runs in ``out/compare`` (``figures``: with its figures) when there are
    ``compare_from`` steps or more. Under torchrun every rank audits and rank 0 compares. Returns the results of
    ``audit_step`` in order."""
    results: list[R] = []
    for i, step in enumerate(steps):
        results.append(audit_step(i, step))
        if record is not None:
            record(results)
    if len(steps) >= compare_from and os.environ.get("RANK", "0") == "0":
        write_comparison(compare_runs([out / st.run for st in steps]), out / "compare", figures=figures)
    return results


def probe_series(cfg: ProbeConfig, models: Sequence[str], figures: bool = True) -> Path:
    """``gmts probe --model A,B,...``: one probe of the same rollouts per checkpoint, written to
    ``cfg.out/<checkpoint name>`` (resumable each, as any probe), the step of each recorded in
    its manifest when the name carries one (``checkpoint-100``), then the comparison of all of
    them in ``cfg.out/compare``. Returns ``cfg.out/compare``."""
    out = Path(cfg.out)
    steps = model_steps(models)

    def probe(i: int, st: SeriesStep) -> Path:
        sub = out / st.run
        log.info("checkpoint %d/%d: %s -> %s", i + 1, len(steps), st.checkpoint, sub)
        return probe_checkpoint(cfg, st.checkpoint, sub,
                                {"checkpoint": st.checkpoint, **({"step": st.step} if st.step is not None else {})})

    run_series(steps, out, probe, figures=figures)
    return out / "compare"
