"""The fields of a run record that ``gmts rl-report`` reads, type-checked before any number is taken from it.

A run record (``<setting>.runs/<arm>-s<seed>.json``, written by ``gmts rl``) is read by
:mod:`gmts_analysis.rl.arms_plan` (config, final pass@1, the training trajectory) and
:mod:`gmts_analysis.rl.arms_stats` (the mechanism: each step's shares, group counts, skipped flag, the
last diagnostic step's fidelity and mass capture; the learning phase: each step's training reward and the
``evals``' step and per-domain pass@1). :func:`check_record_fields` refuses, in one line naming
the file and the field (``.../gmts-s0.json: steps[3].frac_groups_zero_std: expected a finite number, got
'abc'``), every value of those fields that is of the wrong type or not finite. ``null`` is accepted where
``gmts rl`` writes it (a quantity not logged at that step; NaN is written as ``null``), a field may be
absent where older records lack it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError

#: per-step shares, each a count over a count: in [0, 1]
STEP_SHARES = ("frac_groups_zero_std", "frac_tokens_zero_adv", "frac_selected_zero_adv")
#: per-step counts: whole numbers >= 0
STEP_COUNTS = ("n_groups", "n_groups_kept", "n_selected")
#: per-step numbers (the step index, and the trajectory that tells a repeated run): finite
STEP_NUMBERS = ("step", "loss", "reward_mean", "grad_norm")
#: the diagnostics' update fidelity of one arm at a step
FIDELITY_FIELDS = ("cosine", "norm_ratio")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_number(v: Any, where: str, share: bool = False, count: bool = False) -> None:
    """Refuse ``v`` (None passes: not logged) unless it is a finite number; ``share``: in [0, 1];
    ``count``: a whole number >= 0. The error is one line ``{where}: expected ..., got {v!r}``."""
    if v is None:
        return
    if not _is_number(v) or not math.isfinite(v):
        raise GmtsError(f"{where}: expected a finite number, got {v!r}")
    if share and not 0.0 <= v <= 1.0:
        raise GmtsError(f"{where}: expected a share in [0, 1], got {v!r}")
    if count and (v < 0 or v != int(v)):
        raise GmtsError(f"{where}: expected a whole number >= 0, got {v!r}")


def _check_object(v: Any, where: str) -> dict | None:
    """``v`` when it is a JSON object or None; else one line naming ``where``."""
    if v is not None and not isinstance(v, dict):
        raise GmtsError(f"{where}: expected an object, got {v!r}"[:300])
    return v


def check_step(st: Any, where: str) -> None:
    """One entry of a record's ``steps`` (``where``: ``"{path}: steps[i]"``): an object whose shares,
    counts, numbers, ``skipped`` flag, ``fidelity`` (arm -> {cosine, norm_ratio}) and ``mass_capture``
    (arm -> share) have the types :func:`gmts_analysis.rl.arms_stats.run_mechanism` reads."""
    if not isinstance(st, dict):
        raise GmtsError(f"{where}: expected an object, got {st!r}"[:300])
    for k in STEP_SHARES:
        check_number(st.get(k), f"{where}.{k}", share=True)
    for k in STEP_COUNTS:
        check_number(st.get(k), f"{where}.{k}", count=True)
    for k in STEP_NUMBERS:
        check_number(st.get(k), f"{where}.{k}")
    skipped = st.get("skipped")
    if skipped is not None and not isinstance(skipped, bool):
        raise GmtsError(f"{where}.skipped: expected true or false, got {skipped!r}")
    for arm, fid in (_check_object(st.get("fidelity"), f"{where}.fidelity") or {}).items():
        for k, v in (_check_object(fid, f"{where}.fidelity.{arm}") or {}).items():
            if k in FIDELITY_FIELDS:
                check_number(v, f"{where}.fidelity.{arm}.{k}")
    for arm, v in (_check_object(st.get("mass_capture"), f"{where}.mass_capture") or {}).items():
        check_number(v, f"{where}.mass_capture.{arm}")


def check_evals(evals: Any, domains: list[str], path: Path) -> None:
    """A record's ``evals`` (absent: none): a list of objects, each with a ``step`` (a whole number >= 0,
    no step twice) and a ``pass1`` object holding a pass rate in [0, 1] for every domain of ``domains``."""
    if evals is None:
        return
    if not isinstance(evals, list):
        raise GmtsError(f"{path}: evals: expected a list, got {type(evals).__name__}")
    seen: set = set()
    for i, e in enumerate(evals):
        where = f"{path}: evals[{i}]"
        if not isinstance(e, dict):
            raise GmtsError(f"{where}: expected an object, got {e!r}"[:300])
        step = e.get("step")
        if step is None:
            raise GmtsError(f"{where}.step: missing")
        check_number(step, f"{where}.step", count=True)
        if step in seen:
            raise GmtsError(f"{where}.step: step {step!r} is evaluated twice")
        seen.add(step)
        pass1 = _check_object(e.get("pass1"), f"{where}.pass1")
        if pass1 is None:
            raise GmtsError(f"{where}.pass1: missing")
        for d in domains:
            v = pass1.get(d)
            if v is None:
                raise GmtsError(f"{where}.pass1.{d}: missing")
            check_number(v, f"{where}.pass1.{d}", share=True)


def _check_config(cfg: dict, path: Path) -> None:
    """The config fields the report reads beyond those compared with the plan: the domains (a list of
    names), the evaluation's prompt counts (whole numbers; the final evaluation's at least 1) and seed."""
    doms = cfg.get("domains")
    if not isinstance(doms, list) or not doms or not all(isinstance(d, str) and d for d in doms) \
            or len(set(doms)) != len(doms):
        raise GmtsError(f"{path}: config.domains: expected a list of distinct domain names, got {doms!r}"[:300])
    for k in ("final_eval_prompts", "eval_prompts"):
        check_number(cfg.get(k), f"{path}: config.{k}", count=True)
    if not (cfg.get("final_eval_prompts") or cfg.get("eval_prompts")):
        raise GmtsError(f"{path}: config.final_eval_prompts: the final evaluation has no prompts "
                        f"(final_eval_prompts {cfg.get('final_eval_prompts')!r}, eval_prompts {cfg.get('eval_prompts')!r})")
    seed = cfg.get("eval_seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise GmtsError(f"{path}: config.eval_seed: expected a whole number, got {seed!r}")


def check_record_fields(rec: dict, path: Path) -> None:
    """Every field of run record ``rec`` (read from ``path``; its config already a dict) that the report
    reads, beyond what :func:`gmts_analysis.rl.arms_plan.check_run` compares with the plan: the config's
    domains and evaluation counts, each of ``steps`` (:func:`check_step`) and the ``evals``
    (:func:`check_evals`)."""
    _check_config(rec["config"], path)
    steps = rec.get("steps", [])
    if not isinstance(steps, list):
        raise GmtsError(f"{path}: steps: expected a list, got {type(steps).__name__}")
    for i, st in enumerate(steps):
        check_step(st, f"{path}: steps[{i}]")
    check_evals(rec.get("evals"), rec["config"]["domains"], path)
