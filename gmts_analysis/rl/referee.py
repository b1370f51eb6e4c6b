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


def _arm_result(source: str, runs: list[dict], seeds: list[int]) -> dict[str, Any]:
    """One arm of a complete setting: per-seed final pass@1 and evaluation SE, their mean, SD over seeds,
    the evaluation SE of one run (RMS) and of the mean, and the per-domain means."""
    fin = [run_final_pass1(r) for r in runs]
    se = [run_eval_se(r) for r in runs]
    return {
        "source": source, "seeds": seeds, "final_pass1": fin, "eval_se": se,
        "mean": float(np.mean(fin)), "sd": float(np.std(fin, ddof=1)) if len(fin) > 1 else float("nan"),
        **dict(zip(("eval_se_run", "eval_se_mean"), _se_one_and_mean(np.square(se)))),
        "per_domain": {d: float(np.mean([r["final_pass1"][d] for r in runs])) for d in runs[0]["config"]["domains"]},
        "final_eval_prompts": final_prompts(runs[0]["config"]),
    }


def _setting_block(s: dict, plan: dict, records: dict, data_dir: Path) -> dict[str, Any]:
    """A setting of the report: ``cut`` with its missing run files, or ``complete`` with every arm's
    results and mechanism (a borrowed ``all`` from the setting its ``all_from`` names)."""
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
    for a in arms:
        runs = [records[(source(a)["name"], a, seed)] for seed in seeds]
        block["results"][a] = _arm_result(source(a)["name"], runs, seeds)
        block["mechanism"][a] = mechanism(runs)
    return block


def _contrast_row(c: dict, settings: dict[str, dict]) -> dict[str, Any]:
    """One contrast ``a - b``: ``cut`` when its setting is, else the paired statistics over seeds and the
    evaluation SE of one seed's difference (RMS over seeds) and of the mean difference."""
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


def build_report(data_dir: str | Path, plan_path: str | Path | None = None) -> dict:
    """Everything ``gmts rl-report`` writes, as one JSON-ready dict (see the module docstring):
    ``generator``, ``plan`` (its path, title, metric, seeds, alpha, correction), ``settings``
    (status ``complete`` | ``cut``, missing run files, arms with per-seed final pass@1 and evaluation
    SE, mechanism), ``contrasts`` (every planned contrast; those of cut settings with status ``cut``)."""
    data_dir = check_data_dir(data_dir)
    plan_path = Path(plan_path) if plan_path is not None else data_dir / "plan.json"
    plan = load_plan(plan_path)
    records = _read_records(plan, data_dir, plan_path)
    settings = {s["name"]: _setting_block(s, plan, records, data_dir) for s in plan["settings"]}
    complete = {name: b["status"] == "complete" for name, b in settings.items()}
    contrasts = [_contrast_row(c, settings) for c in _expand(plan, complete)]
    n_primary = _judge(contrasts, plan["alpha"])
    return {
        "generator": GENERATOR,
        "plan": {"path": plan_path.as_posix(), "title": plan.get("title"), "metric": plan.get("metric"),
                 "seeds": list(plan["seeds"]), "alpha": plan["alpha"], "correction": plan.get("correction", "holm"),
                 "n_primary": n_primary},
        "data_dir": data_dir.as_posix(),
        "settings": list(settings.values()),
        "contrasts": contrasts,
    }


# ----------------------------------------------------------------------------- words and tables


def _p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}" if p < 0.01 else f"{p:.3f}"


def _f(x: Any, sign: bool = False, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def contrast_sentence(r: dict) -> str:
    """One sentence of a reported contrast: the mean paired difference with its 95% CI, the p-values,
    the wins, the evaluation SE beside them, and the verdict's words."""
    holm_part = f", Holm-adjusted {_p(r['p_holm'])}" if r.get("p_holm") is not None else " (unadjusted)"
    return (f"{r['a']} - {r['b']} ({r['setting']}, {r['family']}): {_f(r['mean'], True)} "
            f"(95% CI {_f(r['ci_low'], True)} to {_f(r['ci_high'], True)}; paired t p = {_p(r['p'])}{holm_part}; "
            f"sign p = {_p(r['p_sign'])}; Wilcoxon p = {_p(r['p_wilcoxon'])}; {r['a']} higher on {r['wins_a']} of "
            f"{r['n']} seeds; evaluation SE of one seed's difference {_f(r['eval_se_diff'])}): {r['words']}.")


_CONTRAST_HEAD = ("| contrast | n | mean diff | 95% CI | SD diff | t p | {holm}sign p | Wilcoxon p | wins a/b/equal "
                  "| eval SE (diff) | verdict |")


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
                   f"{r['wins_a']}/{r['wins_b']}/{r['ties']} | {_f(r['eval_se_diff'])} | {_short(r)} |")
    return out


def _settings_lines(report: dict) -> list[str]:
    """The report's opening paragraph and one line per setting (complete, or cut with its missing runs)."""
    plan = report["plan"]
    seeds = plan["seeds"]
    lines = [
        f"Generated by `gmts rl-report` from `{report['data_dir']}` (plan `{plan['path']}`): {plan.get('metric')}; "
        f"seeds {', '.join(map(str, seeds))}; alpha = {plan['alpha']}, Holm over the {plan['n_primary']} primary "
        "contrasts; every other contrast exploratory and unadjusted. \"A beats B\" is said only where the "
        "Holm-adjusted paired t-test and the 95% paired t interval agree. Evaluation SE: binomial, of the final "
        "pass@1 mean over domains (one run), and of one seed's paired difference (both runs, treated as independent).",
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


def report_markdown(report: dict, short: bool = False) -> str:
    """The generated text of a report: settings and their status, the planned contrasts (sentences and a
    table), the per-arm final pass@1, the exploratory pairs (collapsed) and the mechanism table.
    short: only the settings and the planned contrasts (a README block: ``<!-- TAG:begin short -->``)."""
    lines = _settings_lines(report) + _planned_lines(report)
    if short:
        return "\n".join(lines) + "\n"
    if not any(s["status"] == "complete" for s in report["settings"]):
        lines += ["", "No setting is complete: no final pass@1, contrast or mechanism is reported yet."]
        return "\n".join(lines) + "\n"
    lines += _results_lines(report) + _mechanism_lines(report)
    return "\n".join(lines) + "\n"
