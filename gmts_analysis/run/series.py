"""Probing a checkpoint series (``gmts probe --model A,B,...`` or a directory of checkpoints): one
probe per checkpoint, then their comparison (:mod:`gmts_analysis.views.compare` draws it)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.views.compare import base_at_step_0, compare_runs, last_step, run_step, write_comparison

log = logging.getLogger(__name__)


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
    from gmts_analysis.readers.trl_output import is_trl_output, read_trl_output

    if is_trl_output(p):  # TRL's output_dir: checkpoint-N by step (the final model at its top is not one of
        # them), the base model first when the example script recorded it
        return [path for _, path in read_trl_output(p).checkpoints]
    if p.is_dir() and not (p / "config.json").exists():
        from gmts_analysis.readers.gguf import find_gguf

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


def probe_series(cfg: Any, models: Sequence[str], figures: bool = True) -> Path:
    """``gmts probe --model A,B,...``: one probe of the same rollouts per checkpoint, written to
    ``cfg.out/<checkpoint name>`` (resumable each, as any probe), the step of each recorded in
    its manifest when the name carries one (``checkpoint-100``), then the comparison of all of
    them in ``cfg.out/compare``. Returns ``cfg.out/compare``."""
    import dataclasses

    from gmts_analysis.run.job import run_probe

    out = Path(cfg.out)
    bases = [Path(m.rstrip("/")).name for m in models]
    steps = base_at_step_0([run_step({"model_path": m, "config": {}})[0] for m in models])
    dirs = []
    for i, m in enumerate(models):
        sub = out / _checkpoint_name(m, i, bases)
        step = steps[i]
        extra = {"checkpoint": m, **({"step": step} if step is not None else {})}
        log.info("checkpoint %d/%d: %s -> %s", i + 1, len(models), m, sub)
        run_probe(dataclasses.replace(cfg, model=m, out=str(sub)), extra=extra)
        dirs.append(sub)
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank probes; rank 0 compares
        write_comparison(compare_runs(dirs), out / "compare", figures=figures)
    return out / "compare"
