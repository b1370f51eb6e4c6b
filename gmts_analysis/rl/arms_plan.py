"""The plan and run records of an arms comparison (docs/studies/referee.md sections 7 and 7.1): what :mod:`gmts_analysis.rl.arms_report` reads.

- :func:`load_plan`: the plan, checked (one-line :class:`GmtsError` naming the file and field).
- :func:`check_run`: a run record refused (one line naming the file and field) when its configuration
  disagrees with the plan.
- :func:`run_final_pass1` / :func:`run_eval_se`: a run's final pass@1 (mean over domains) and the
  binomial evaluation SE of that mean, ``sqrt(sum_d p_d (1 - p_d) / n_d) / D``.
- :func:`run_trajectory` / :func:`repeats_of`: provenance, whether a run repeats an earlier one.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from gmts_analysis.core.scores import SELECTION_ARMS
from gmts_analysis.errors import GmtsError
from gmts_analysis.rl.arms_records import check_record_fields
from gmts_analysis.rl.config import RLConfig, record_config
from gmts_analysis.util.io import read_json, read_json_object

#: the ``generator`` field of rl_report.json (what makes the file ours)
GENERATOR = "gmts rl-report"
#: the block ``gmts rl-report --update`` rewrites: ``<!-- gmts-rl-referee:begin -->`` ... ``<!-- gmts-rl-referee:end -->``
BLOCK_TAG = "gmts-rl-referee"
#: per-setting fields of the plan that every run's ``config`` must repeat
SETTING_FIELDS = ("rho", "scope", "group_size", "dynamic_sampling")
FAMILIES = ("primary", "exploratory")


# ----------------------------------------------------------------------------- the plan


def _need(obj: dict, key: str, kind: type | tuple, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise GmtsError(f"{where}: missing field '{key}'")
    v = obj[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
        raise GmtsError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {v!r}")
    return v


def load_plan(path: str | Path) -> dict:
    """The plan of ``path`` (plan.json), checked: seeds (distinct integers), alpha in (0, 1), ``common``
    (config fields every run shares), settings (name, file, role, arms, the fields of
    :data:`SETTING_FIELDS`, optional ``all_from`` naming an earlier setting that runs ``all``) and
    contrasts (setting, a, b: names or ``"*"``; family ``primary`` | ``exploratory``)."""
    path = Path(path)
    plan = read_json_object(path)
    w = str(path)
    seeds = _need(plan, "seeds", list, w)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise GmtsError(f"{w}.seeds: expected distinct integers >= 0, got {seeds!r}")
    alpha = _need(plan, "alpha", (int, float), w)
    if not 0 < alpha < 1:
        raise GmtsError(f"{w}.alpha: must be in (0, 1), got {alpha!r}")
    _need(plan, "common", dict, w)
    names = _check_settings(plan, w)
    _check_extras(plan, names, w)
    _check_contrasts(plan, names, w)
    return plan


def _check_settings(plan: dict, w: str) -> dict[str, dict]:
    """The plan's settings, checked, by name (see :func:`load_plan`)."""
    settings = _need(plan, "settings", list, w)
    names: dict[str, dict] = {}
    for i, s in enumerate(settings):
        ws = f"{w}: settings[{i}]"
        name = _need(s, "name", str, ws)
        if name in names or name == "*":
            raise GmtsError(f"{ws}.name: '{name}' is used twice or reserved")
        f = _need(s, "file", str, ws)
        if not f.endswith(".json") or "/" in f or "\\" in f:
            raise GmtsError(f"{ws}.file: expected a file name <stem>.json, got {f!r}")
        _need(s, "role", str, ws)
        arms = _need(s, "arms", list, ws)
        if not arms or not all(isinstance(a, str) and a for a in arms) or len(set(arms)) != len(arms):
            raise GmtsError(f"{ws}.arms: expected distinct arm names, got {arms!r}")
        unknown = [a for a in arms if a not in SELECTION_ARMS]
        if unknown:  # a run of it cannot exist: the setting would be reported cut for a typo in the plan
            raise GmtsError(f"{ws}.arms: '{unknown[0]}' is not a selection gmts rl runs "
                            f"({' | '.join(SELECTION_ARMS)})")
        for k in SETTING_FIELDS:
            _need(s, k, (int, float, str, bool), ws)
        src = s.get("all_from")
        if src is not None:
            if src not in names or "all" not in names[src]["arms"]:
                raise GmtsError(f"{ws}.all_from: '{src}' is not an earlier setting that runs the arm 'all'")
            if "all" in arms:
                raise GmtsError(f"{ws}.all_from: the setting runs 'all' itself")
        names[name] = s
    return names


def _check_extras(plan: dict, names: dict[str, dict], w: str) -> None:
    """The plan's optional ``prior_runs``, ``pool_with`` and ``block_tag``, checked (see :func:`load_plan`)."""
    prior = plan.get("prior_runs", [])
    if not isinstance(prior, list) or not all(isinstance(x, str) and x for x in prior):
        raise GmtsError(f"{w}.prior_runs: expected a list of run folders (paths relative to the plan's data directory), "
                        f"got {prior!r}")
    pool = plan.get("pool_with")
    if pool is not None:
        if not isinstance(pool, dict):
            raise GmtsError(f"{w}.pool_with: expected an object {{data_dir, settings}}, got {pool!r}")
        _need(pool, "data_dir", str, f"{w}.pool_with")
        ps = _need(pool, "settings", list, f"{w}.pool_with")
        for x in ps:
            if x not in names:
                raise GmtsError(f"{w}.pool_with.settings: unknown setting {x!r}")
    tag = plan.get("block_tag", BLOCK_TAG)
    if not isinstance(tag, str) or not tag or not all(ch.isalnum() or ch in "-_" for ch in tag):
        raise GmtsError(f"{w}.block_tag: expected a marker name of letters, digits, '-' and '_', got {tag!r}")


def _check_contrasts(plan: dict, names: dict[str, dict], w: str) -> None:
    """The plan's contrasts, checked against its settings ``names`` (see :func:`load_plan`)."""
    for i, c in enumerate(_need(plan, "contrasts", list, w)):
        wc = f"{w}: contrasts[{i}]"
        st = _need(c, "setting", str, wc)
        a, b = _need(c, "a", str, wc), _need(c, "b", str, wc)
        fam = _need(c, "family", str, wc)
        if fam not in FAMILIES:
            raise GmtsError(f"{wc}.family: must be one of {', '.join(FAMILIES)}, got {fam!r}")
        if st != "*" and st not in names:
            raise GmtsError(f"{wc}.setting: unknown setting '{st}'")
        for key, arm in (("a", a), ("b", b)):
            if arm != "*" and st != "*" and arm not in setting_arms(names[st]):
                raise GmtsError(f"{wc}.{key}: '{arm}' is not an arm of setting '{st}'")
        if a == b and a != "*":
            raise GmtsError(f"{wc}: a and b are both '{a}'")
        if fam == "primary" and "*" in (st, a, b):
            raise GmtsError(f"{wc}: a primary contrast names its setting and both arms")


def setting_arms(setting: dict) -> list[str]:
    """The arms reported in ``setting``: its own, after ``all`` when it takes ``all`` from another setting."""
    return (["all"] if setting.get("all_from") else []) + list(setting["arms"])


def expected_config(plan: dict, setting: dict) -> dict:
    """The config fields every run of ``setting`` must carry: the plan's ``common`` and :data:`SETTING_FIELDS`."""
    return {**plan["common"], **{k: setting[k] for k in SETTING_FIELDS}}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ----------------------------------------------------------------------------- one run


def final_prompts(config: dict) -> int:
    """Held-out prompts per domain of a run's final pass@1 (``final_eval_prompts``, or ``eval_prompts`` when 0)."""
    return int(config.get("final_eval_prompts") or config["eval_prompts"])


def run_final_pass1(rec: dict) -> float:
    """A run's final pass@1, mean over its config's domains."""
    return float(np.mean([rec["final_pass1"][d] for d in rec["config"]["domains"]]))


def run_eval_se(rec: dict) -> float:
    """The binomial SE of :func:`run_final_pass1` from the evaluation alone:
    ``sqrt(sum_d p_d (1 - p_d) / n_d) / D`` with ``n_d`` = :func:`final_prompts` (one sample per prompt)."""
    doms = rec["config"]["domains"]
    n = final_prompts(rec["config"])
    var = sum(rec["final_pass1"][d] * (1.0 - rec["final_pass1"][d]) / n for d in doms)
    return math.sqrt(var) / len(doms)


@functools.cache
def _config_defaults() -> dict:
    """:class:`~gmts_analysis.rl.config.RLConfig`'s defaults, JSON-ready (what a run recorded before a
    field existed ran with)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record_config(RLConfig()).items()}


def check_run(rec: Any, path: Path, want: dict, arm: str, seed: int, plan_path: Path) -> None:
    """Refuse (one line naming ``path`` and the field) a run record that is not the plan's run of
    ``arm`` and ``seed``: a config field other than ``want``, a final pass@1 without every domain, or a
    field the report reads of the wrong type or not finite
    (:func:`gmts_analysis.rl.arms_records.check_record_fields`)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict):
        raise GmtsError(f"{path}: not a run record of gmts rl (no 'config')")
    cfg = rec["config"]
    defaults = _config_defaults()
    for k, v in {**want, "selection": arm, "seed": seed}.items():
        if k not in cfg and k not in defaults:
            raise GmtsError(f"{path}: config.{k} is missing; the plan {plan_path} says {v!r}")
        got = cfg.get(k, defaults.get(k))  # a record older than the field ran with its default
        if not _same(got, v):
            shown = f"{got!r}" if k in cfg else f"missing (so the default {got!r})"
            raise GmtsError(f"{path}: config.{k} is {shown}, the plan {plan_path} says {v!r}")
    fp = rec.get("final_pass1")
    if not isinstance(fp, dict):
        raise GmtsError(f"{path}: no final_pass1")
    for d in cfg["domains"]:
        v = fp.get(d)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
            raise GmtsError(f"{path}: final_pass1.{d} is {v!r}, expected a pass rate in [0, 1]")
    check_record_fields(rec, path)  # every other field the report reads: its type, finite


# ----------------------------------------------------------------------------- provenance: fresh or repeated


def run_trajectory(rec: dict) -> tuple | None:
    """A run's training trajectory: ``(step, loss, reward_mean, grad_norm, n_selected)`` of every logged
    step (None when it logged none). Two runs with the same arm, seed and trajectory are the same
    training run (the evaluation may differ: a later run can re-evaluate on more prompts)."""
    steps = rec.get("steps") if isinstance(rec, dict) else None
    if not isinstance(steps, list):
        return None
    key = tuple(tuple(st.get(k) for k in ("step", "loss", "reward_mean", "grad_norm", "n_selected"))
                for st in steps if isinstance(st, dict))
    return key or None


def _shown(p: Path) -> str:
    """``p`` as a reader finds it: normalised (``data/rl/referee/../x`` is ``data/rl/x``), forward slashes."""
    import os

    return Path(os.path.normpath(p)).as_posix()


def _prior_index(plan: dict, data_dir: Path, plan_path: Path) -> dict[tuple[str, int], list[tuple[str, tuple]]]:
    """``{(arm, seed): [(file, trajectory), ...]}`` of every run record in the plan's ``prior_runs`` folders
    (the runs that existed before the plan), files named as :func:`_shown` names them."""
    import re

    own = {(data_dir / s["file"]).with_suffix("").name + ".runs" for s in plan["settings"]}
    index: dict[tuple[str, int], list[tuple[str, tuple]]] = {}
    for entry in plan.get("prior_runs", []):
        folder = (data_dir / entry)
        if not folder.is_dir():
            raise GmtsError(f"{plan_path}.prior_runs: {entry!r} is not a folder under {data_dir}")
        if folder.resolve().parent == data_dir.resolve() and folder.name in own:
            raise GmtsError(f"{plan_path}.prior_runs: {entry!r} is this plan's own run folder")
        for f in sorted(folder.iterdir()):
            m = re.fullmatch(r"([A-Za-z_]+)-s(\d+)\.json", f.name)
            if not m:
                continue
            traj = run_trajectory(read_json(f))
            if traj is not None:
                index.setdefault((m.group(1), int(m.group(2))), []).append((_shown(f), traj))
    return index


def repeats_of(records: dict, index: dict) -> dict[tuple[str, str, int], str]:
    """``{(setting, arm, seed): earlier file}`` for every run of ``records`` whose arm, seed and training
    trajectory equal an earlier run's (:func:`run_trajectory`): a repeat, not fresh evidence."""
    out = {}
    for (setting, arm, seed), rec in records.items():
        if rec is None:
            continue
        traj = run_trajectory(rec)
        for f, t in index.get((arm, seed), []):
            if traj is not None and t == traj:
                out[(setting, arm, seed)] = f
                break
    return out
