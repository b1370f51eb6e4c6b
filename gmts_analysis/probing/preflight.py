"""What a probe will need, checked before the model runs (no work is lost to a need knowable first).

- **Update fidelity** keeps one float32 gradient per selection: ``n_selections * n_params * 4``
  bytes (:func:`fidelity_need`), where the selections are ``all``, ``oracle`` (with gradient
  norms), one per estimator the probe's columns allow, and 5 random ones. ``--fidelity auto``
  turns it off (one log line says why) when that exceeds the budget
  (:data:`gmts_analysis.engine.fidelity.DEFAULT_BUDGET`) or the run has 100k tokens or more;
  ``--fidelity on`` that cannot fit is refused (:func:`fidelity_decision`).
- **The exact engine** batches tokens per VJP within a memory budget, but needs at least one
  token's batched backward at the longest prefix (:func:`engine_need`); refused when that
  exceeds the memory available on the device.
- **Disk**: the tables, chunk records and report (:func:`disk_need`) against the free space
  where ``--out`` is written.

:func:`check_before_probe` runs all three (the job and :func:`gmts_analysis.api.probe` call it
after loading the model and reading the rollouts, before the first answer).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from gmts_analysis.core.estimators import ESTIMATORS
from gmts_analysis.engine import fidelity as fidelity_mod  # DEFAULT_BUDGET through its module: tests replace it
from gmts_analysis.engine import (
    frozen_for_transforms,
    memory,  # free_device_memory through its module: tests replace it there
)
from gmts_analysis.engine.choice import choose_method
from gmts_analysis.engine.exact import ExactEngine, model_acc_dtype
from gmts_analysis.engine.memory import kept_bytes
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.errors import GmtsError
from gmts_analysis.probing.settings import EngineSettings

log = logging.getLogger("gmts_analysis.probing.preflight")

AUTO_FIDELITY_MAX_TOKENS = 100_000  # --fidelity auto: off from this many tokens on
N_RANDOM_SELECTIONS = 5  # random reference selections of update fidelity (fidelity_for_run's n_random)


@dataclass
class FidelityNeed:
    """Memory of update fidelity's accumulators: ``n_selections`` float32 gradients of ``n_params``."""

    n_selections: int
    n_params: int
    budget: int  # bytes

    @property
    def bytes(self) -> int:
        return self.n_selections * self.n_params * 4

    @property
    def fits(self) -> bool:
        return self.bytes <= self.budget

    def describe(self) -> str:
        return (f"update fidelity needs {self.bytes / 1e9:.2f} GB for {self.n_selections} gradients of "
                f"{self.n_params:,} parameters (budget {self.budget / 1e9:.2f} GB)")


def n_fidelity_selections(grad_norm: str, has_head: bool) -> int:
    """Selections update fidelity makes for a probe with ``--grad-norm grad_norm``: ``all``,
    ``oracle`` (unless ``none``), every estimator of :data:`gmts_analysis.core.estimators.ESTIMATORS`
    (the two head estimators only with an output head) and the random ones."""
    n_est = sum(1 for name, (needs, _) in ESTIMATORS.items() if has_head or "head_grad_norm" not in needs)
    return 1 + (grad_norm != "none") + n_est + N_RANDOM_SELECTIONS


def fidelity_need(model: torch.nn.Module, grad_norm: str, budget: int | None = None) -> FidelityNeed:
    """The accumulators' memory for ``model`` (it depends on nothing else: known before any work)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    has_head = isinstance(getattr(head, "weight", None), torch.Tensor)
    n_params = int(sum(p.numel() for _, p in trainable_parameters(model)))
    return FidelityNeed(n_fidelity_selections(grad_norm, has_head), n_params,
                        fidelity_mod.DEFAULT_BUDGET if budget is None else int(budget))


def fidelity_decision(engine: EngineSettings, model: torch.nn.Module, n_tokens: int) -> tuple[bool, str]:
    """``(on, why)`` for ``engine.fidelity`` on this model and ``n_tokens`` response tokens.
    Raises :class:`GmtsError` for ``on`` when the accumulators cannot fit."""
    if engine.fidelity == "off":
        return False, "--fidelity off"
    if engine.method == "none" and engine.fidelity != "on":
        return False, "--grad-norm none"
    need = fidelity_need(model, engine.method)
    if engine.fidelity == "on":
        if not need.fits:
            raise GmtsError(f"--fidelity on: {need.describe()}: use --fidelity off")
        return True, "--fidelity on"
    if n_tokens >= AUTO_FIDELITY_MAX_TOKENS:
        return False, f"{n_tokens:,} tokens (auto: on under {AUTO_FIDELITY_MAX_TOKENS:,})"
    if not need.fits:
        return False, need.describe()
    return True, f"auto: {need.describe()}, {n_tokens:,} tokens"


def engine_need(model: torch.nn.Module, longest: int, prompt_len: int, sample_ids: torch.Tensor) -> int:
    """Bytes of one token's batched backward at the longest prefix, with what the engine keeps
    there (the exact engine's minimum; its memory model
    :meth:`gmts_analysis.engine.exact.ExactEngine.bytes_per_token` and
    :func:`gmts_analysis.engine.memory.kept_bytes`, one token per block). Makes the model's plan
    (one short planning forward, cached for the probe)."""
    engine = ExactEngine(model, model_acc_dtype(model))
    with frozen_for_transforms(model):
        engine.install(sample_ids)
        engine.remove()
    L = max(longest - 1, prompt_len)
    return int(engine.bytes_per_token(L) + kept_bytes(engine, L, block=1))


def available_memory(device: torch.device) -> int | None:
    """Free bytes on ``device``: what torch can still allocate on CUDA
    (:func:`gmts_analysis.engine.memory.free_device_memory`), else the host's ``MemAvailable``
    (Linux); None when unknown."""
    if device.type == "cuda":
        return memory.free_device_memory(device)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def disk_need(n_answers: int, n_tokens: int, n_prompt_tokens: int, figures: bool) -> int:
    """Bytes the run directory needs at most (uncompressed estimate, twice: the chunk records
    and the final tables exist together until the directory is renamed): about 400 bytes per
    token row (30-odd float columns and the token text), 16 per prompt/response id in
    ``answers.parquet``, and 20 MB for figures and report."""
    tables = 400 * n_tokens + 16 * (n_tokens + n_prompt_tokens) + 2_000 * n_answers
    return 2 * tables + (20_000_000 if figures else 1_000_000)


def _existing_parent(path: Path) -> Path:
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_before_probe(engine: EngineSettings, model: torch.nn.Module, answers: Sequence[Any],
                       out: str | os.PathLike | None, figures: bool = True) -> None:
    """Every need knowable before the model runs (module docstring); raises :class:`GmtsError`
    naming the option to change, logs one line when ``--fidelity auto`` turns fidelity off.
    ``figures``: the job draws figures and a report (their disk space is counted)."""
    n_tokens = sum(a.length for a in answers)
    if engine.method == "sketch" and answers:
        method, reason = choose_method([a.length for a in answers], engine.probes)
        if method == "exact":  # the sketch is an estimate: say when it does not even save time
            log.warning("--grad-norm sketch: %s; --grad-norm exact is cheaper here, and exact", reason)
    on, why = fidelity_decision(engine, model, n_tokens)
    if engine.fidelity == "auto" and not on and engine.method != "none":
        log.warning("update fidelity off: %s (--fidelity auto)", why)
    elif on:
        log.info("update fidelity on: %s", why)
    long = max((a for a in answers if a.length), key=lambda a: len(a.prompt_ids) + a.length, default=None)
    device = next(model.parameters()).device
    if engine.method == "exact" and long is not None:
        ids = torch.tensor(list(long.prompt_ids[:8]) or [0], dtype=torch.long, device=device)
        try:
            need = engine_need(model, len(long.prompt_ids) + long.length, len(long.prompt_ids), ids)
        except NotImplementedError:
            need = None  # the engine refuses the model: the answers go to the loop (or --strict refuses)
        free = available_memory(device)
        if need is not None and free is not None and need > free:
            raise GmtsError(f"the exact engine needs about {need / 1e9:.2f} GB for one token of the longest answer "
                            f"({len(long.prompt_ids) + long.length} tokens, answer '{long.answer_id}') and "
                            f"{free / 1e9:.2f} GB are free on {device}: use --grad-norm sketch, or shorter answers")
        if need is not None and engine.max_memory_bytes is not None and need > engine.max_memory_bytes:
            log.warning("--max-memory %s MiB is below one token's batched backward at the longest prefix "
                        "(about %.0f MiB): the engine goes one token at a time there and exceeds it",
                        engine.max_memory, need / 2**20)
    if out is not None:
        where = _existing_parent(Path(out))
        free_disk = shutil.disk_usage(where).free
        need_disk = disk_need(len(answers), n_tokens, sum(len(a.prompt_ids) for a in answers),
                              figures)
        if need_disk > free_disk:
            raise GmtsError(f"{out}: the run needs about {need_disk / 1e6:.0f} MB of disk and {where} has "
                            f"{free_disk / 1e6:.0f} MB free: free some space or choose another --out")
