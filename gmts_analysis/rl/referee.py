"""The referee's experiment (docs/rl.md sections 7 and 7.1): its analysis, from the run records on disk.

Input: a data directory holding ``plan.json`` (settings, arms, seeds, contrasts, alpha) and, for every
setting, the run records of ``gmts rl --out DIR/<file>`` in ``DIR/<file stem>.runs/<arm>-s<seed>.json``.
No training, no torch: this reads JSON and computes.

- :func:`load_plan`: the plan, checked (one-line :class:`GmtsError` naming the file and field).
- :func:`run_final_pass1` / :func:`run_eval_se`: a run's final pass@1 (mean over domains) and the
  binomial evaluation SE of that mean, ``sqrt(sum_d p_d (1 - p_d) / n_d) / D``.
- :func:`build_report`: completeness per setting (a setting missing any run of any arm and plan seed is
  *cut*, listed with the missing files, and never reported on fewer seeds), the per-arm results, every
  planned paired contrast (``"*"`` expanded to every other pair of a complete setting, exploratory and
  unadjusted) with its t interval, t / sign / Wilcoxon p, Holm over the family ``primary``, and the
  verdict of the word rule (:func:`verdict`), and the mechanism per setting and arm
  (:func:`mechanism`).
- :func:`report_markdown`: the generated text (tables and sentences).

A run whose configuration disagrees with the plan (policy, steps, rho, scope, group size, dynamic
sampling, lr, normalizer, evaluation sizes, domains, prompts per domain, ...) is refused in one line
naming the file and field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gmts_analysis.errors import GmtsError

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
    from gmts_analysis.util.io import read_json_object

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
        from gmts_analysis.core.scores import SELECTION_ARMS

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
    return plan


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
    from dataclasses import asdict

    from gmts_analysis.rl.config import RLConfig

    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(RLConfig()).items()}


def check_run(rec: Any, path: Path, want: dict, arm: str, seed: int, plan_path: Path) -> None:
    """Refuse (one line naming ``path`` and the field) a run record that is not the plan's run of
    ``arm`` and ``seed``: a config field other than ``want``, or a final pass@1 without every domain."""
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
    if not isinstance(rec.get("steps", []), list):
        raise GmtsError(f"{path}: steps is not a list")


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

    from gmts_analysis.util.io import read_json

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


# ----------------------------------------------------------------------------- mechanism


def _mean(values: Sequence[Any]) -> float:
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(v)) if v else float("nan")


def run_mechanism(rec: dict) -> dict[str, float]:
    """One run's mechanism numbers: over its logged steps the mean share of groups with all-equal rewards
    (``zero_adv_groups``), of response tokens with A = 0 (``zero_adv_tokens``), of its own selection's
    picks with A = 0 (``waste``, ``frac_selected_zero_adv``), of groups kept by dynamic sampling
    (``groups_kept``) and the number of steps skipped (no group kept); at its last diagnostic step
    (``diag_step``) the mass capture and the update fidelity (``cosine``, ``norm_ratio``) of its own
    selection (NaN for ``all``, which the diagnostics do not score)."""
    arm = rec["config"]["selection"]
    steps = rec.get("steps", [])
    diag = [s for s in steps if isinstance(s.get("fidelity"), dict) or isinstance(s.get("mass_capture"), dict)]
    last = diag[-1] if diag else {}
    fid = (last.get("fidelity") or {}).get(arm) or {}
    return {
        "zero_adv_groups": _mean([s.get("frac_groups_zero_std") for s in steps]),
        "zero_adv_tokens": _mean([s.get("frac_tokens_zero_adv") for s in steps if not s.get("skipped")]),
        "waste": _mean([s.get("frac_selected_zero_adv") for s in steps if not s.get("skipped")]),
        "groups_kept": _mean([s["n_groups_kept"] / s["n_groups"] for s in steps
                              if s.get("n_groups") and s.get("n_groups_kept") is not None]),
        "skipped_steps": float(sum(1 for s in steps if s.get("skipped"))),
        "diag_step": float(last["step"]) if "step" in last else float("nan"),
        "mass_capture": _mean([(last.get("mass_capture") or {}).get(arm)]),
        "cosine": _mean([fid.get("cosine")]),
        "norm_ratio": _mean([fid.get("norm_ratio")]),
    }


def mechanism(runs: Sequence[dict]) -> dict[str, float]:
    """:func:`run_mechanism` averaged over ``runs`` (the seeds of one arm), with ``n_runs``."""
    per = [run_mechanism(r) for r in runs]
    out = {k: _mean([p[k] for p in per]) for k in per[0]} if per else {}
    out["n_runs"] = len(per)
    return out


# ----------------------------------------------------------------------------- contrasts


def verdict(a: str, b: str, stats: dict, family: str, alpha: float) -> tuple[str, str]:
    """``(code, words)`` of the word rule. Primary: ``beats`` only when the Holm-adjusted p is below
    ``alpha`` and the 95% CI excludes 0 (the sign of the mean says who beats whom). Exploratory (no
    adjustment): ``above_unadjusted`` under the same rule with the unadjusted p, said to be unconfirmed.
    Otherwise ``not_distinguishable``: "A and B are not distinguishable with N seeds" (never "tied")."""
    n = stats["n"]
    p = stats.get("p_holm") if family == "primary" else stats.get("p")
    lo, hi, m = stats.get("ci_low"), stats.get("ci_high"), stats.get("mean")
    ok = p is not None and not math.isnan(p) and p < alpha and lo is not None and not math.isnan(lo) \
        and (lo > 0 or hi < 0)
    if not ok:
        return "not_distinguishable", f"{a} and {b} are not distinguishable with {n} seeds"
    win, lose = (a, b) if m > 0 else (b, a)
    if family == "primary":
        return "beats", f"{win} beats {lose}"
    return "above_unadjusted", f"{win} is above {lose} (exploratory, unadjusted: not a confirmed difference)"


def _expand(plan: dict, complete: dict[str, bool]) -> list[dict]:
    """The planned contrasts, the explicit ones first in plan order, then each ``"*"`` entry expanded
    over the complete settings (every pair not already listed, ``a`` the later arm of the plan's order)."""
    by_name = {s["name"]: s for s in plan["settings"]}
    out, seen = [], set()
    for c in plan["contrasts"]:
        if "*" not in (c["setting"], c["a"], c["b"]):
            out.append({**{k: c.get(k) for k in ("setting", "a", "b", "family", "question")}, "expanded": False})
            seen.add((c["setting"], frozenset((c["a"], c["b"]))))
    for c in plan["contrasts"]:
        if "*" not in (c["setting"], c["a"], c["b"]):
            continue
        names = [s["name"] for s in plan["settings"]] if c["setting"] == "*" else [c["setting"]]
        for name in names:
            if not complete.get(name):
                continue
            arms = setting_arms(by_name[name])
            for j, x in enumerate(arms):
                for y in arms[:j]:
                    a, b = x, y
                    if c["a"] != "*" and c["a"] not in (a, b) or c["b"] != "*" and c["b"] not in (a, b):
                        continue
                    if c["a"] == b or c["b"] == a:  # orient as the entry says
                        a, b = b, a
                    key = (name, frozenset((a, b)))
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append({"setting": name, "a": a, "b": b, "family": c["family"],
                                "question": c.get("question"), "expanded": True})
    return out


# ----------------------------------------------------------------------------- the report


def _rel(p: Path, data_dir: Path) -> str:
    """``p`` relative to the data directory when it lies under it (the report names files portably)."""
    try:
        return p.relative_to(data_dir).as_posix()
    except ValueError:
        return p.as_posix()


def _read_records(plan: dict, data_dir: Path, plan_path: Path) -> dict[tuple[str, str, int], dict | None]:
    """``{(setting, arm, seed): record or None}``: every run file the plan names, read and checked once
    against the plan (a borrowed ``all`` is read where it lives)."""
    from gmts_analysis.rl.config import run_path
    from gmts_analysis.util.io import read_json

    records: dict[tuple[str, str, int], dict | None] = {}
    for s in plan["settings"]:
        want = expected_config(plan, s)
        for arm in s["arms"]:
            for seed in plan["seeds"]:
                p = run_path(data_dir / s["file"], arm, seed)
                rec = None
                if p.is_file():
                    rec = read_json(p)
                    check_run(rec, p, want, arm, seed, plan_path)
                records[(s["name"], arm, seed)] = rec
    return records


def _se_one_and_mean(var: Sequence[float]) -> tuple[float, float]:
    """From per-seed evaluation variances: the SE of one seed (RMS over seeds) and the SE of the mean
    over seeds."""
    return float(math.sqrt(np.mean(var))), float(math.sqrt(np.sum(var)) / len(var))


def _arm_result(source: str, runs: list[dict], seeds: list[int], repeat_of: list[str | None]) -> dict[str, Any]:
    """One arm of a complete setting: per-seed final pass@1 and evaluation SE, their mean, SD over seeds,
    the evaluation SE of one run (RMS) and of the mean, the per-domain means, and per seed the earlier run
    it repeats (None: fresh)."""
    fin = [run_final_pass1(r) for r in runs]
    se = [run_eval_se(r) for r in runs]
    return {
        "source": source, "seeds": seeds, "final_pass1": fin, "eval_se": se, "repeat_of": repeat_of,
        "mean": float(np.mean(fin)), "sd": float(np.std(fin, ddof=1)) if len(fin) > 1 else float("nan"),
        **dict(zip(("eval_se_run", "eval_se_mean"), _se_one_and_mean(np.square(se)))),
        "per_domain": {d: float(np.mean([r["final_pass1"][d] for r in runs])) for d in runs[0]["config"]["domains"]},
        "final_eval_prompts": final_prompts(runs[0]["config"]),
    }


def _setting_block(s: dict, plan: dict, records: dict, data_dir: Path, repeats: dict) -> dict[str, Any]:
    """A setting of the report: ``cut`` with its missing run files, or ``complete`` with every arm's
    results and mechanism (a borrowed ``all`` from the setting its ``all_from`` names), the evaluation
    seeds its runs used (one: every arm and seed saw the same prompts) and, per arm, the seeds whose run
    repeats an earlier one (``repeats``: :func:`repeats_of`)."""
    from gmts_analysis.rl.config import run_path

    by_name = {x["name"]: x for x in plan["settings"]}
    seeds = list(plan["seeds"])

    def source(arm: str) -> dict:
        return by_name[s["all_from"]] if arm == "all" and s.get("all_from") else s

    arms = setting_arms(s)
    missing = [_rel(run_path(data_dir / source(a)["file"], a, seed), data_dir) for a in arms for seed in seeds
               if records[(source(a)["name"], a, seed)] is None]
    n_exp = len(arms) * len(seeds)
    block: dict[str, Any] = {"name": s["name"], "role": s["role"], "file": s["file"],
                             **{k: s[k] for k in SETTING_FIELDS}, "all_from": s.get("all_from"),
                             "arms": arms, "n_runs_expected": n_exp, "n_runs_found": n_exp - len(missing),
                             "missing": missing}
    if missing:
        block["status"] = "cut"
        return block
    block["status"] = "complete"
    block["results"], block["mechanism"] = {}, {}
    eval_seeds = set()
    for a in arms:
        keys = [(source(a)["name"], a, seed) for seed in seeds]
        runs = [records[k] for k in keys]
        block["results"][a] = _arm_result(source(a)["name"], runs, seeds, [repeats.get(k) for k in keys])
        block["mechanism"][a] = mechanism(runs)
        eval_seeds |= {r["config"].get("eval_seed", _config_defaults()["eval_seed"]) for r in runs}
    block["eval_seeds"] = sorted(eval_seeds)
    return block


def _contrast_row(c: dict, settings: dict[str, dict], checked: bool) -> dict[str, Any]:
    """One contrast ``a - b``: ``cut`` when its setting is, else the paired statistics over seeds, the
    evaluation SE of one seed's difference (RMS over seeds) and of the mean difference, and the evidence:
    ``fresh`` (no run of either arm repeats an earlier run), ``pooled`` (some seeds do: their lists, and the
    statistics of the fresh seeds alone in ``fresh_only``) or ``unchecked`` (``checked``: the plan names
    its earlier runs)."""
    from gmts_analysis.analysis.paired import paired_contrast

    row: dict[str, Any] = dict(c)
    s = settings[c["setting"]]
    if s["status"] != "complete":
        row["status"] = "cut"
        return row
    ra, rb = s["results"][c["a"]], s["results"][c["b"]]
    (fa, sa), (fb, sb) = (ra["final_pass1"], ra["eval_se"]), (rb["final_pass1"], rb["eval_se"])
    row["status"] = "reported"
    row.update(paired_contrast(fa, fb))
    row["differences"] = [x - y for x, y in zip(fa, fb)]
    row["eval_se_diff"], row["eval_se_mean_diff"] = _se_one_and_mean([x * x + y * y for x, y in zip(sa, sb)])
    row["p_holm"] = None
    seeds = ra["seeds"]
    reps = list(zip(ra["repeat_of"], rb["repeat_of"]))
    row["seeds_fresh"] = [sd for sd, (x, y) in zip(seeds, reps) if not x and not y]
    row["seeds_repeat_both"] = [sd for sd, (x, y) in zip(seeds, reps) if x and y]
    row["seeds_repeat_one"] = [sd for sd, (x, y) in zip(seeds, reps) if bool(x) != bool(y)]
    row["repeated_from"] = sorted({Path(f).parent.as_posix() for pair in reps for f in pair if f})
    if not checked:
        row["evidence"] = "unchecked"
    elif len(row["seeds_fresh"]) == len(seeds):
        row["evidence"] = "fresh"
    else:
        row["evidence"] = "pooled"
        keep = [i for i, sd in enumerate(seeds) if sd in row["seeds_fresh"]]
        row["fresh_only"] = paired_contrast([fa[i] for i in keep], [fb[i] for i in keep]) if keep else None
    return row


def _judge(contrasts: list[dict], alpha: float) -> int:
    """Holm over every planned primary contrast (one whose setting is cut counts with p = 1:
    conservative), then each reported contrast's verdict and sentence; returns the number of primary
    contrasts."""
    from gmts_analysis.analysis.paired import holm

    primary = [r for r in contrasts if r["family"] == "primary"]
    adj = holm([r.get("p", 1.0) if r["status"] == "reported" else 1.0 for r in primary])
    for r, p in zip(primary, adj):
        if r["status"] == "reported":
            r["p_holm"] = p
    for r in contrasts:
        if r["status"] == "reported":
            r["verdict"], r["words"] = verdict(r["a"], r["b"], r, r["family"], alpha)
            r["sentence"] = contrast_sentence(r)
    return len(primary)


def check_data_dir(data_dir: str | Path) -> Path:
    """``data_dir`` as a Path, refused (one line) when it is not a directory."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise GmtsError(f"{data_dir}: not a directory (give the directory holding plan.json and the settings' runs)")
    return data_dir


def build_report(data_dir: str | Path, plan_path: str | Path | None = None, with_pool: bool = True) -> dict:
    """Everything ``gmts rl-report`` writes, as one JSON-ready dict (see the module docstring):
    ``generator``, ``plan`` (its path, title, metric, seeds, alpha, correction), ``settings``
    (status ``complete`` | ``cut``, missing run files, arms with per-seed final pass@1 and evaluation
    SE, mechanism), ``contrasts`` (every planned contrast; those of cut settings with status ``cut``), and
    with the plan's ``pool_with`` (and ``with_pool``) ``pooled`` (:func:`pooled_view`)."""
    data_dir = check_data_dir(data_dir)
    plan_path = Path(plan_path) if plan_path is not None else data_dir / "plan.json"
    plan = load_plan(plan_path)
    records = _read_records(plan, data_dir, plan_path)
    checked = "prior_runs" in plan
    repeats = repeats_of(records, _prior_index(plan, data_dir, plan_path)) if checked else {}
    settings = {s["name"]: _setting_block(s, plan, records, data_dir, repeats) for s in plan["settings"]}
    complete = {name: b["status"] == "complete" for name, b in settings.items()}
    contrasts = [_contrast_row(c, settings, checked) for c in _expand(plan, complete)]
    n_primary = _judge(contrasts, plan["alpha"])
    report = {
        "generator": GENERATOR,
        "plan": {"path": plan_path.as_posix(), "title": plan.get("title"), "metric": plan.get("metric"),
                 "seeds": list(plan["seeds"]), "alpha": plan["alpha"], "correction": plan.get("correction", "holm"),
                 "n_primary": n_primary, "prior_runs": list(plan.get("prior_runs", [])) if checked else None,
                 "block_tag": plan.get("block_tag", BLOCK_TAG)},
        "data_dir": data_dir.as_posix(),
        "settings": list(settings.values()),
        "contrasts": contrasts,
        "n_repeated_runs": len(repeats),
    }
    if with_pool and plan.get("pool_with"):
        report["pooled"] = pooled_view(report, plan["pool_with"], data_dir)
    return report


# ----------------------------------------------------------------------------- the pooled view


def held_on_replication(earlier: dict, here: dict) -> str:
    """Whether an earlier experiment's verdict on a contrast held here (both oriented ``a - b``):
    ``no_claim`` (the earlier one found no difference), ``held`` (here ``beats`` with the same sign),
    ``held_exploratory`` (here above, unadjusted, same sign), ``reversed`` (here a difference of the other
    sign) or ``not_confirmed`` (here not distinguishable)."""
    if earlier["verdict"] == "not_distinguishable":
        return "no_claim"
    if here["verdict"] == "not_distinguishable":
        return "not_confirmed"
    if (here["mean"] > 0) != (earlier["mean"] > 0):
        return "reversed"
    return "held" if here["verdict"] == "beats" else "held_exploratory"


def _side(r: dict, sign: float = 1.0) -> dict[str, Any]:
    """One experiment's numbers of a contrast in the pooled view (``sign`` -1 flips ``a - b``)."""
    lo, hi = (r["ci_low"], r["ci_high"]) if sign > 0 else (-r["ci_high"], -r["ci_low"])
    fo = r.get("fresh_only")
    return {"n": r["n"], "mean": sign * r["mean"], "se": r["se"], "ci_low": lo, "ci_high": hi, "p": r["p"],
            "p_holm": r.get("p_holm"), "family": r["family"], "verdict": r["verdict"], "words": r["words"],
            "evidence": r.get("evidence"), "n_fresh": len(r.get("seeds_fresh", [])),
            "fresh_only_mean": sign * fo["mean"] if fo else None, "fresh_only_n": fo["n"] if fo else 0,
            "differences": [sign * x for x in r["differences"]]}


def pooled_view(report: dict, pool: dict, data_dir: Path) -> dict[str, Any]:
    """The exploratory pooled view of the plan's ``pool_with``: for every reported contrast of the named
    settings that the earlier experiment (``pool_with.data_dir``, relative to ``data_dir``) also reports,
    this experiment's and the earlier one's mean paired difference, both pooled over their seeds (paired
    tests over all of them, unadjusted), the difference between the two experiments (Welch), Cochran's Q
    and I^2 of the two means, and whether the earlier verdict held here (:func:`held_on_replication`)."""
    from gmts_analysis.analysis.paired import heterogeneity, paired_contrast, welch_difference

    other_dir = data_dir / pool["data_dir"]
    other = build_report(other_dir, with_pool=False)
    o_set = {s["name"]: s for s in other["settings"]}
    o_rows = {(r["setting"], r["a"], r["b"]): r for r in other["contrasts"] if r["status"] == "reported"}
    rows = []
    for c in report["contrasts"]:
        if c["setting"] not in pool["settings"] or c["status"] != "reported":
            continue
        if o_set.get(c["setting"], {}).get("status") != "complete":
            continue
        o, sign = o_rows.get((c["setting"], c["a"], c["b"])), 1.0
        if o is None:
            o, sign = o_rows.get((c["setting"], c["b"], c["a"])), -1.0
        if o is None:
            continue
        here, earlier = _side(c), _side(o, sign)
        both = here["differences"] + earlier["differences"]
        pooled = paired_contrast(both, [0.0] * len(both))
        rows.append({
            "setting": c["setting"], "a": c["a"], "b": c["b"], "family": c["family"], "expanded": c["expanded"],
            "here": here, "earlier": earlier, "pooled": pooled,
            "difference": welch_difference(here["differences"], earlier["differences"]),
            "heterogeneity": heterogeneity([here["mean"], earlier["mean"]], [here["se"], earlier["se"]]),
            "held": held_on_replication({"verdict": earlier["verdict"], "mean": earlier["mean"]}, c),
        })
    eval_here = sorted({x for s in report["settings"] if s["name"] in pool["settings"] for x in s.get("eval_seeds", [])})
    eval_other = sorted({x for s in other["settings"] if s["name"] in pool["settings"] for x in s.get("eval_seeds", [])})
    return {"data_dir": _shown(other_dir), "plan": _shown(Path(other["plan"]["path"])), "settings": list(pool["settings"]),
            "seeds_here": report["plan"]["seeds"], "seeds_earlier": other["plan"]["seeds"],
            "eval_seeds_here": eval_here, "eval_seeds_earlier": eval_other, "note": pool.get("note"), "rows": rows}


# ----------------------------------------------------------------------------- words and tables


def _p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}" if p < 0.01 else f"{p:.3f}"


def _f(x: Any, sign: bool = False, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


#: the two evaluation SEs of a contrast, named the same way in the sentences, tables and forest plot
SE_ONE_DIFF = "evaluation SE of one seed's difference"
SE_MEAN_DIFF = "evaluation SE of the mean difference over {n} seeds"


def evidence_words(r: dict) -> str:
    """What the seeds of a reported contrast are: "confirmed on fresh seeds" (a ``beats`` verdict, no run of
    either arm repeating an earlier run), "on fresh seeds" (another verdict), "pilot and confirmation
    pooled" with how many seeds repeat earlier runs and the fresh seeds alone, or "seed provenance not
    checked" (the plan names no earlier runs)."""
    ev, n = r.get("evidence"), r["n"]
    if ev == "fresh":
        head = "confirmed on fresh seeds" if r["verdict"] == "beats" else "on fresh seeds"
        return f"{head} (no run of the {n} seeds repeats an earlier run)"
    if ev == "pooled":
        both, one = len(r["seeds_repeat_both"]), len(r["seeds_repeat_one"])
        src = ", ".join(f"`{x}`" for x in r.get("repeated_from", []))
        out = (f"pilot and confirmation pooled: {both + one} of {n} seeds repeat earlier runs ({both} in both arms, "
               f"{one} in one arm; from {src})")
        fo = r.get("fresh_only")
        if fo:
            ci = f", 95% CI {_f(fo['ci_low'], True)} to {_f(fo['ci_high'], True)}" if fo["n"] > 1 else ""
            return out + (f"; on the {fo['n']} fresh seeds alone {_f(fo['mean'], True)}{ci}, {r['a']} higher on "
                          f"{fo['wins_a']} of {fo['n']}")
        return out + "; no seed is fresh in both arms"
    return "seed provenance not checked (the plan names no earlier runs)"


def contrast_sentence(r: dict) -> str:
    """One sentence of a reported contrast: the mean paired difference with its 95% CI, the p-values,
    the wins, the evaluation SEs beside them, the verdict's words and what its seeds are
    (:func:`evidence_words`)."""
    holm_part = f", Holm-adjusted {_p(r['p_holm'])}" if r.get("p_holm") is not None else " (unadjusted)"
    return (f"{r['a']} - {r['b']} ({r['setting']}, {r['family']}): {_f(r['mean'], True)} "
            f"(95% CI {_f(r['ci_low'], True)} to {_f(r['ci_high'], True)}; paired t p = {_p(r['p'])}{holm_part}; "
            f"sign p = {_p(r['p_sign'])}; Wilcoxon p = {_p(r['p_wilcoxon'])}; {r['a']} higher on {r['wins_a']} of "
            f"{r['n']} seeds; {SE_ONE_DIFF} {_f(r['eval_se_diff'])}, "
            f"{SE_MEAN_DIFF.format(n=r['n'])} {_f(r['eval_se_mean_diff'])}): {r['words']}; {evidence_words(r)}.")


_CONTRAST_HEAD = ("| contrast | n | mean diff | 95% CI | SD diff | t p | {holm}sign p | Wilcoxon p | wins a/b/equal "
                  "| eval SE (one seed's diff) | fresh seeds | verdict |")


def _fresh_cell(r: dict) -> str:
    if r.get("evidence") in (None, "unchecked"):
        return "not checked"
    return f"{len(r['seeds_fresh'])}/{r['n']}"


def _short(r: dict) -> str:
    """The verdict in a table cell: "gmts beats entropy", "all above random (unadj.)", "not distinguishable"."""
    if r["verdict"] == "not_distinguishable":
        return "not distinguishable"
    win, lose = (r["a"], r["b"]) if r["mean"] > 0 else (r["b"], r["a"])
    return f"{win} beats {lose}" if r["verdict"] == "beats" else f"{win} above {lose} (unadj.)"


def _contrast_table(rows: list[dict], with_holm: bool) -> list[str]:
    head = _CONTRAST_HEAD.format(holm="Holm p | " if with_holm else "")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        label = f"{r['a']} - {r['b']}" if with_holm else f"{r['setting']}: {r['a']} - {r['b']}"
        holm_cell = f"{_p(r.get('p_holm'))} | " if with_holm else ""
        out.append(f"| {label} | {r['n']} | {_f(r['mean'], True)} | [{_f(r['ci_low'], True)}, {_f(r['ci_high'], True)}]"
                   f" | {_f(r['sd'])} | {_p(r['p'])} | {holm_cell}{_p(r['p_sign'])} | {_p(r['p_wilcoxon'])} | "
                   f"{r['wins_a']}/{r['wins_b']}/{r['ties']} | {_f(r['eval_se_diff'])} | {_fresh_cell(r)} | {_short(r)} |")
    return out


def crn_sentence(report: dict) -> str:
    """Whether every arm of a setting was evaluated on the same prompts (one evaluation seed: common random
    numbers) and what that means for the evaluation SEs; names a setting whose runs used several."""
    done = [s for s in report["settings"] if s["status"] == "complete"]
    mixed = [s for s in done if len(s.get("eval_seeds", [])) > 1]
    if not done:
        return "Common random numbers: not known yet (no setting is complete)."
    if mixed:
        names = "; ".join(f"{s['name']}: {', '.join(map(str, s['eval_seeds']))}" for s in mixed)
        return ("**Not common random numbers**: the runs of a setting used different evaluation seeds "
                f"({names}), so its arms were evaluated on different prompts and the paired differences carry "
                "the full evaluation noise of both runs.")
    seeds = sorted({x for s in done for x in s["eval_seeds"]})
    return ("Common random numbers: within each setting every arm and seed is evaluated on the same held-out prompts "
            f"with the same sampling noise (evaluation seed {', '.join(map(str, seeds))}), and every arm of a seed "
            "trains on the same prompts. The evaluation noise of two arms is therefore strongly correlated and largely "
            "cancels in a paired difference: the evaluation SEs above treat the two runs as independent and so "
            "overstate it; the SD of the paired differences over seeds, which the t interval uses, already holds "
            "whatever evaluation noise remains. This is why differences well below one run's evaluation SE are resolved.")


def provenance_sentence(report: dict) -> str:
    """Which runs repeat earlier runs (the plan's ``prior_runs``), in one sentence."""
    prior = report["plan"].get("prior_runs")
    if prior is None:
        return "Seed provenance: not checked (the plan names no earlier runs to compare with)."
    n_rep = report.get("n_repeated_runs", 0)
    where = []
    for s in report["settings"]:
        for a, res in (s.get("results") or {}).items():
            if res["source"] != s["name"]:
                continue
            seeds = [sd for sd, f in zip(res["seeds"], res["repeat_of"]) if f]
            if seeds:
                src = sorted({Path(f).parent.as_posix() for f in res["repeat_of"] if f})
                where.append(f"{s['name']} {a} seeds {', '.join(map(str, seeds))} (from {', '.join(src)})")
    head = (f"Seed provenance: every run was compared with the {len(prior)} earlier run folders the plan names "
            "(same arm, seed and per-step training trajectory = the same training run); ")
    if not n_rep:
        return head + "no run repeats an earlier one: every seed is fresh."
    return (head + f"{n_rep} runs repeat earlier runs (only their final evaluation can be new): "
            + "; ".join(where) + ". A contrast on such seeds says \"pilot and confirmation pooled\" and gives the "
            "fresh seeds alone beside it.")


def _settings_lines(report: dict) -> list[str]:
    """The report's opening paragraph and one line per setting (complete, or cut with its missing runs)."""
    plan = report["plan"]
    seeds = plan["seeds"]
    lines = [
        f"Generated by `gmts rl-report` from `{report['data_dir']}` (plan `{plan['path']}`): {plan.get('metric')}; "
        f"seeds {', '.join(map(str, seeds))}; alpha = {plan['alpha']}, Holm over the {plan['n_primary']} primary "
        "contrasts; every other contrast exploratory and unadjusted. \"A beats B\" is said only where the "
        "Holm-adjusted paired t-test and the 95% paired t interval agree. Evaluation SE: binomial, of the final "
        f"pass@1 mean over domains (one run), the {SE_ONE_DIFF} (both runs, treated as independent), and the "
        f"{SE_MEAN_DIFF.format(n='N')} (the forest plot's grey bar).",
        "",
        crn_sentence(report),
        "",
        provenance_sentence(report),
        "",
        "**Settings**",
        "",
    ]
    for s in report["settings"]:
        cfg = f"rho {s['rho']}, {s['scope']} scope, groups of {s['group_size']}" + (
            ", dynamic sampling" if s["dynamic_sampling"] else "") + (f"; `all` from {s['all_from']}" if s["all_from"] else "")
        if s["status"] == "complete":
            lines.append(f"- {s['name']} ({s['role']}; {cfg}): complete, {len(s['arms'])} arms x {len(seeds)} seeds.")
        else:
            shown = ", ".join(f"`{m}`" for m in s["missing"][:6]) + (f" and {len(s['missing']) - 6} more"
                                                                     if len(s["missing"]) > 6 else "")
            lines.append(f"- {s['name']} ({s['role']}; {cfg}): **cut**, {s['n_runs_found']} of "
                         f"{s['n_runs_expected']} runs found (missing {shown}); not reported.")
    return lines


def _planned_lines(report: dict) -> list[str]:
    """The planned contrasts: one sentence each (or "not reported" for a cut setting), then the tables."""
    planned = [r for r in report["contrasts"] if not r["expanded"]]
    lines = ["", "**Planned contrasts** (final pass@1, paired over seeds)", ""]
    for r in planned:
        if r["status"] == "cut":
            lines.append(f"- {r['a']} - {r['b']} ({r['setting']}, {r['family']}): not reported, the setting is cut.")
        else:
            lines.append(f"- {r['sentence']}")
    done = [r for r in planned if r["status"] == "reported"]
    prim = [r for r in done if r["family"] == "primary"]
    if prim:
        lines += ["", *_contrast_table(prim, True)]
    expl = [r for r in done if r["family"] != "primary"]
    if expl:
        lines += ["", *_contrast_table(expl, False)]
    return lines


def _results_lines(report: dict) -> list[str]:
    """Final pass@1 per setting and arm, then every other pair of arms (collapsed)."""
    lines = ["", "**Final pass@1 per arm** (mean over domains; SD over seeds; evaluation SE of one run)", "",
             "| setting | arm | mean | SD | min | max | eval SE (run) | per domain |", "|---|---|---|---|---|---|---|---|"]
    for s in report["settings"]:
        for a, res in (s.get("results") or {}).items():
            dom = ", ".join(f"{d} {v:.3f}" for d, v in res["per_domain"].items())
            src = f" (from {res['source']})" if res["source"] != s["name"] else ""
            lines.append(f"| {s['name']} | {a}{src} | {res['mean']:.4f} | {_f(res['sd'], nd=4)} | "
                         f"{min(res['final_pass1']):.4f} | {max(res['final_pass1']):.4f} | {res['eval_se_run']:.4f} | {dom} |")
    others = [r for r in report["contrasts"] if r["status"] == "reported" and r["expanded"]]
    if others:
        lines += ["", f"<details><summary>Every other pair of arms ({len(others)} exploratory contrasts, "
                  "unadjusted)</summary>", "", *_contrast_table(others, False), "", "</details>"]
    return lines


def _mechanism_lines(report: dict) -> list[str]:
    """The mechanism table: zero-advantage shares, waste, groups kept, mass capture and fidelity per arm."""
    lines = ["", "**Mechanism** (mean over seeds; shares over every training step; mass capture and fidelity of "
             "the arm's own selection at the last diagnostic step)", "",
             "| setting | arm | zero-adv groups | zero-adv tokens | waste | groups kept | mass capture | cosine | "
             "norm ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for s in report["settings"]:
        for a, m in (s.get("mechanism") or {}).items():
            kept = _f(m["groups_kept"]) if s["dynamic_sampling"] else "-"
            lines.append(f"| {s['name']} | {a} | {_f(m['zero_adv_groups'])} | {_f(m['zero_adv_tokens'])} | "
                         f"{_f(m['waste'])} | {kept} | {_f(m['mass_capture'])} | {_f(m['cosine'])} | "
                         f"{_f(m['norm_ratio'])} |")
    return lines


_HELD_WORDS = {"held": "held", "held_exploratory": "held (exploratory here)", "reversed": "reversed",
               "not_confirmed": "did not hold", "no_claim": "no earlier claim"}


def held_sentence(row: dict) -> str:
    """Whether the earlier experiment's verdict held here, in words ("... held on fresh seeds")."""
    here, earlier = row["here"], row["earlier"]
    where = "on fresh seeds" if here["evidence"] == "fresh" else "in this experiment (not every seed fresh)"
    if row["held"] == "no_claim":
        return f"no earlier claim to test (earlier: {earlier['words']}); here: {here['words']}"
    if row["held"] == "not_confirmed":
        return f"the earlier claim \"{earlier['words']}\" did not hold {where} (here: {here['words']})"
    if row["held"] == "reversed":
        return f"the earlier claim \"{earlier['words']}\" was reversed {where} (here: {here['words']})"
    return f"the earlier claim \"{earlier['words']}\" {_HELD_WORDS[row['held']]} {where}"


def _ci(x: dict, lo: str = "ci_low", hi: str = "ci_high") -> str:
    return f"[{_f(x[lo], True)}, {_f(x[hi], True)}]"


def _pooled_lines(report: dict, short: bool) -> list[str]:
    """The pooled view: one sentence per planned contrast, then (full report) the table of every contrast."""
    pv = report.get("pooled")
    if not pv:
        return []
    nh, ne = len(pv["seeds_here"]), len(pv["seeds_earlier"])
    lines = ["", f"**Pooled view** (exploratory: pilot and confirmation pooled). This experiment ({nh} seeds, "
             f"evaluation seed {', '.join(map(str, pv['eval_seeds_here']))}) beside the earlier one "
             f"(`{pv['data_dir']}`, {ne} seeds, evaluation seed {', '.join(map(str, pv['eval_seeds_earlier']))}) "
             f"and both pooled over their {nh + ne} seeds (paired t, unadjusted), with the heterogeneity between "
             "them: the difference of the two means (Welch 95% interval), Cochran's Q of the two means and I^2. The "
             "two experiments evaluate on different prompt sets when their evaluation seeds differ, so a difference "
             "between them can come from the prompts as well as from the seeds. Only this experiment's own numbers "
             "above can say \"confirmed on fresh seeds\".", ""]
    if not pv["rows"]:
        return lines + ["No contrast of the pooled settings is reported by both experiments yet."]
    for r in pv["rows"]:
        if r["expanded"]:
            continue
        h, e, po, d, q = r["here"], r["earlier"], r["pooled"], r["difference"], r["heterogeneity"]
        fresh = (f", {e['n'] - e['n_fresh']} of them repeating earlier runs; its fresh seeds alone "
                 f"{_f(e['fresh_only_mean'], True)} on {e['fresh_only_n']}") if e["evidence"] == "pooled" else ""
        lines.append(f"- {r['a']} - {r['b']} ({r['setting']}): here {_f(h['mean'], True)} {_ci(h)} on {h['n']} seeds; "
                     f"earlier {_f(e['mean'], True)} {_ci(e)} on {e['n']} seeds{fresh}. {held_sentence(r)[0].upper()}"
                     f"{held_sentence(r)[1:]}. Pooled over {po['n']} seeds (exploratory): {_f(po['mean'], True)} "
                     f"{_ci(po)}, t p = {_p(po['p'])}; here - earlier {_f(d['diff'], True)} {_ci(d)}; Cochran's Q = "
                     f"{_f(q['q'], nd=2)} (p = {_p(q['p'])}), I^2 = {_f(100 * q['i2'], nd=0) if q['i2'] == q['i2'] else 'n/a'}%.")
    if short:
        return lines
    lines += ["", "| contrast | here | earlier | pooled | here - earlier | Q (p) | I^2 | earlier verdict held? |",
              "|---|---|---|---|---|---|---|---|"]
    for r in pv["rows"]:
        h, e, po, d, q = r["here"], r["earlier"], r["pooled"], r["difference"], r["heterogeneity"]
        i2 = f"{100 * q['i2']:.0f}%" if q["i2"] == q["i2"] else "n/a"
        lines.append(f"| {r['setting']}: {r['a']} - {r['b']}{'' if r['expanded'] else ' (planned)'} | "
                     f"{_f(h['mean'], True)} {_ci(h)} ({h['n']}) | {_f(e['mean'], True)} {_ci(e)} ({e['n']}, "
                     f"{e['n_fresh']} fresh) | {_f(po['mean'], True)} {_ci(po)} ({po['n']}) | {_f(d['diff'], True)} "
                     f"{_ci(d)} | {_f(q['q'], nd=2)} ({_p(q['p'])}) | {i2} | {_HELD_WORDS[r['held']]} |")
    return lines


def report_markdown(report: dict, short: bool = False) -> str:
    """The generated text of a report: settings and their status, the planned contrasts (sentences and a
    table), the per-arm final pass@1, the exploratory pairs (collapsed) and the mechanism table.
    short: only the settings and the planned contrasts (a README block: ``<!-- TAG:begin short -->``)."""
    lines = _settings_lines(report) + _planned_lines(report) + _pooled_lines(report, short)
    if short:
        return "\n".join(lines) + "\n"
    if not any(s["status"] == "complete" for s in report["settings"]):
        lines += ["", "No setting is complete: no final pass@1, contrast or mechanism is reported yet."]
        return "\n".join(lines) + "\n"
    lines += _results_lines(report) + _mechanism_lines(report)
    return "\n".join(lines) + "\n"
