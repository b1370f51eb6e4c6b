"""The arms comparison's words and tables: :func:`report_markdown` renders a report of
:func:`gmts_analysis.rl.arms_report.build_report` as the generated text of docs/rl.md (tables and sentences)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
            "whatever evaluation noise remains, so a paired difference well below one run's evaluation SE can be "
            "resolved when the seeds agree.")


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
        f"Generated by `gmts rl-report` from `{report['data_dir']}` (plan `{plan['path']}`): "
        f"{plan.get('metric') or 'final pass@1'}; "
        f"seeds {', '.join(map(str, seeds))}; alpha = {plan['alpha']}, Holm over the {plan['n_primary']} primary "
        "contrasts; every other contrast exploratory and unadjusted. \"A beats B\" is said only where the "
        "Holm-adjusted paired t-test and the 95% paired t interval agree. Evaluation SE: binomial, of the final "
        "pass@1 of one run (its mean over domains where there are several), "
        f"the {SE_ONE_DIFF} (both runs, treated as independent), and the "
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


#: the title of the learning-phase section (after the mechanism table)
LEARNING_TITLE = "**Learning phase**"


def _mean_cell(x: dict | None) -> str:
    """An arm's mean over seeds with its 95% t interval: ``0.533 [0.525, 0.541]``."""
    if x is None:
        return "n/a"
    return f"{_f(x['mean'])} [{_f(x['ci_low'])}, {_f(x['ci_high'])}]"


def _diff_cell(r: dict | None, c: dict) -> str:
    """A learning-phase contrast ``c``'s entry ``r`` (a step or the reward) in a table cell:
    ``+0.005 [-0.003, +0.012] not distinguishable``."""
    if r is None:
        return "not logged"
    if r["status"] == "identical":
        return "identical by construction" if r["step"] == 0 else "identical on every seed"
    return f"{_f(r['mean'], True)} {_ci(r)} {_short({**r, 'a': c['a'], 'b': c['b']})}"


def _trajectory_table(s: dict, shown: list[dict]) -> list[str]:
    """One setting's learning phase: a row per shared evaluation step (the final one pointing to the planned
    contrasts) and one of the mean training reward; a column per arm, then per contrast of ``shown``."""
    tr = s["trajectory"]
    arms = list(tr["pass1"])
    head = ["step", *arms, *(f"{c['a']} - {c['b']}" for c in shown)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, step in enumerate(tr["steps"]):
        cells = [_mean_cell(tr["pass1"][a][i]) for a in arms]
        if step in tr["intermediate_steps"]:
            cells += [_diff_cell(next(x for x in c["steps"] if x["step"] == step), c) for c in shown]
            label = str(step)
        else:
            final = step == tr["final_step"]
            cells += ["final: planned contrasts above" if final else "-" for _ in shown]
            label = f"{step} (final)" if final else str(step)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    rew = tr["reward"] or {}
    out.append("| training reward (mean over steps) | " + " | ".join(
        [_mean_cell(rew.get(a)) for a in arms] + [_diff_cell(c["reward"], c) for c in shown]) + " |")
    return out


def _learning_lines(report: dict) -> list[str]:
    """The learning phase (exploratory, unadjusted): per complete setting a table of the arms' mean pass@1 at
    every evaluation step all its runs share and the planned contrasts at the intermediate steps and on the
    training reward; every other pair of arms in a collapsed table."""
    done = [s for s in report["settings"] if s["status"] == "complete" and s.get("trajectory")]
    if not done:
        return []
    lines = ["", f"{LEARNING_TITLE} (exploratory and unadjusted: pass@1 at the intermediate evaluations and the "
             "per-step training reward). Per arm: pass@1 (mean over domains) at every evaluation step that every "
             "run of the setting has, mean over seeds with its 95% t interval; the last row: each run's training "
             "reward averaged over its logged steps, mean over seeds. Per planned contrast of the setting: the "
             "paired difference over seeds at each intermediate step (mean [95% t interval] and the exploratory "
             "verdict, never \"beats\"); at the final step the planned contrasts above hold, on the final pass@1 "
             "(a toy run's final pass@1 is a larger evaluation, on final_eval_prompts). Steps where every paired "
             "difference is exactly 0 are marked identical (step 0: by construction)."]
    others = []
    for s in done:
        tr = s["trajectory"]
        named = [c for c in tr["contrasts"] if not c["expanded"]]
        others += [(s["name"], c) for c in tr["contrasts"] if c["expanded"]]
        lines += ["", f"*{s['name']}* (steps {', '.join(map(str, tr['steps'])) or 'none'} evaluated in every run; "
                  f"{len(s['arms'])} arms x {len(s['results'][s['arms'][0]]['seeds'])} seeds)", ""]
        if not tr["steps"]:
            lines.append("No evaluation step is shared by every run of this setting.")
            continue
        lines += _trajectory_table(s, named)
    if others:
        rows = []
        for name, c in others:
            for r in [*c["steps"], {**(c["reward"] or {}), "step": "reward"} if c["reward"] else None]:
                if r is None or r.get("status") == "identical":
                    continue
                rows.append(f"| {name}: {c['a']} - {c['b']} | {r['step']} | {r['n']} | {_f(r['mean'], True)} | "
                            f"{_ci(r)} | {r['wins_a']}/{r['wins_b']}/{r['ties']} | "
                            f"{_short({**r, 'a': c['a'], 'b': c['b']})} |")
        if rows:
            lines += ["", f"<details><summary>Every other pair of arms in the learning phase ({len(others)} "
                      "exploratory contrasts, unadjusted; identical steps left out)</summary>", "",
                      "| contrast | step | n | mean diff | 95% CI | wins a/b/equal | verdict |",
                      "|---|---|---|---|---|---|---|", *rows, "", "</details>"]
    return lines


def report_markdown(report: dict, short: bool = False) -> str:
    """The generated text of a report: settings and their status, the planned contrasts (sentences and a
    table), the per-arm final pass@1, the exploratory pairs (collapsed), the mechanism table and the
    learning phase (:func:`_learning_lines`: pass@1 at every shared evaluation step, the contrasts at the
    intermediate steps and on the training reward; exploratory).
    short: only the settings and the planned contrasts (a README block: ``<!-- TAG:begin short -->``)."""
    lines = _settings_lines(report) + _planned_lines(report) + _pooled_lines(report, short)
    if short:
        return "\n".join(lines) + "\n"
    if not any(s["status"] == "complete" for s in report["settings"]):
        lines += ["", "No setting is complete: no final pass@1, contrast or mechanism is reported yet."]
        return "\n".join(lines) + "\n"
    lines += _results_lines(report) + _mechanism_lines(report) + _learning_lines(report)
    return "\n".join(lines) + "\n"
