"""The real-model study's two summaries that ``gmts rl-report`` does not make (docs/studies/trl.md section 12):

    python benchmarks/trl_study_summary.py audit data/trl_study/audit    # entropy vs gradient across checkpoints
    python benchmarks/trl_study_summary.py cost data/trl_study           # wall and CPU seconds of each part

``audit`` reads each series audit (``gmts series``: ``series.json`` and ``compare/compare.json``) under the folder,
one per run, and prints per checkpoint (docs/definitions.md has each statistic): held-out pass@1 of the audit's
answers, the method, the share of tokens with zero advantage, the within-answer Spearman of entropy H with the
exact norm of the token's log-prob gradient (median over informative answers), the cross-answer Spearman of H
(every token; informative tokens only) and of GMTS with the exact norm of the token's policy-gradient term g,
and how much of the batch's top 20% by |g| the top 20% by H and by GMTS hold: by count
(``topk_overlap.batch.*.0.2``) and by gradient mass (``mass_capture.batch.*.0.2``).

``cost`` reads the run records' ``timing_s`` (wall seconds per run: training, the run's three evaluations) and,
where present, ``cpu_samples.log`` (lines ``EPOCH PID SELF_CPU_S CHILDREN_CPU_S KIND WHAT [PPID]`` every 30 s;
kind ``train`` is a training process, ``driver`` the study driver, which evaluates in its own process,
``series`` an audit): a process's CPU seconds are its last sample's (up to 30 s short).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

#: (column, compare.json statistic) of the audit table
AUDIT_STATS = [
    ("zero-adv tokens", "zero_advantage.token_share"),
    ("within-answer rho(H, ‖∇log p‖)", "within_answer.entropy.median"),
    ("cross-answer rho(H, ‖g‖)", "cross_answer.entropy.spearman"),
    ("cross-answer rho(H, ‖g‖), informative", "cross_answer_informative.entropy.spearman"),
    ("cross-answer rho(GMTS, ‖g‖)", "cross_answer.gmts.spearman"),
    ("top-20% overlap H", "topk_overlap.batch.entropy.0.2"),
    ("top-20% overlap GMTS", "topk_overlap.batch.gmts.0.2"),
    ("top-20% mass H", "mass_capture.batch.entropy.0.2"),
    ("top-20% mass GMTS", "mass_capture.batch.gmts.0.2"),
]


def _fmt(v: float | None, nd: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def audit_table(root: Path) -> str:
    """A markdown table, one row per (run, checkpoint) of every series audit under ``root``."""
    head = ["run", "step", "pass@1 (audit)", "method", *[c for c, _ in AUDIT_STATS], "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in sorted(p.parent for p in root.glob("*/series.json")):
        series = json.loads((d / "series.json").read_text())
        if not (d / "compare" / "compare.json").is_file():  # an audit still running (or killed) writes it last
            print(f"{d}: no compare/compare.json yet (unfinished audit): left out", file=sys.stderr)
            continue
        cmp = json.loads((d / "compare" / "compare.json").read_text())
        val = {(r["run"], r["statistic"]): r["value"] for r in cmp["rows"]}
        for c in series["checkpoints"]:
            vals = [_fmt(val.get((c["run"], s))) for _, s in AUDIT_STATS]
            lines.append("| " + " | ".join([d.name, str(c["step"]), f"{c['pass1']:.3f}", c["method"], *vals,
                                            f"{c['seconds']['total']:.0f}"]) + " |")
    return "\n".join(lines)


def _cpu_by_process(log: Path) -> dict[int, dict]:
    """{pid: {kind, what, run, ppid, cpu (s), first, last (epoch s), samples: [(epoch, cpu)]}} from the sampler's
    log; ``run`` is the last part of ``what`` (a training's output directory, an audit's); ``ppid`` is the 7th
    field, or for older lines ``cpu_parents.json`` beside the log ({pid: ppid}), else None."""
    parents_file = log.parent / "cpu_parents.json"
    parents = {int(k): v for k, v in json.loads(parents_file.read_text()).items()} if parents_file.is_file() else {}
    procs: dict[int, dict] = {}
    for line in log.read_text().splitlines():
        f = line.split()
        if len(f) < 6 or not f[0].isdigit():
            continue
        t, pid, cpu = int(f[0]), int(f[1]), int(f[2])
        p = procs.setdefault(pid, {"kind": f[4], "what": f[5], "run": Path(f[5]).name, "first": t, "samples": [],
                                   "ppid": int(f[6]) if len(f) > 6 else parents.get(pid)})
        p["last"], p["cpu"] = t, cpu
        p["samples"].append((t, cpu))
    return procs


def _stats(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"{statistics.mean(xs):.0f} (min {min(xs):.0f}, max {max(xs):.0f}, n={len(xs)})"


def _eval_cpu_by_run(procs: dict[int, dict]) -> dict[str, float]:
    """A driver evaluates in its own process between the trainings it starts (its children): each rise of a
    driver's CPU while none of them runs goes to the run whose training ended last (the base model's one
    evaluation goes to the first run a driver evaluates). A driver of one run (``--only RUN``) with no training
    ended yet gives its rises to that run: a run resumed after its training was done only evaluates."""
    out: dict[str, float] = defaultdict(float)
    for pid, p in procs.items():
        if p["kind"] != "driver":
            continue
        mine = sorted((c["last"], c["first"], c["run"]) for c in procs.values()
                      if c["kind"] == "train" and c["ppid"] == pid)
        for (_, c0), (t1, c1) in zip(p["samples"], p["samples"][1:]):
            if c1 <= c0 or any(first <= t1 <= last for last, first, _ in mine):
                continue
            ended = [run for last, _, run in mine if last <= t1] or ([] if "," in p["what"] else [p["run"]])
            if ended:
                out[ended[-1]] += c1 - c0
    return out


def cost_table(root: Path) -> str:
    """Wall seconds per part from the run records; CPU seconds from the sampler's log, when there is one, of the
    recorded runs only: training (summed over a run's processes, a resumed run has several), its evaluations,
    the trainings again for an audit (a training process whose parent is no driver), and the series audits."""
    wall: dict[str, list[float]] = defaultdict(list)
    recorded = set()
    for f in sorted(root.glob("*.runs/*.json")):
        recorded.add(f.stem)
        t = json.loads(f.read_text()).get("timing_s", {})
        for part in ("train", "eval"):
            if part in t:
                wall[f"{part} (one run)"].append(float(t[part]))
    cpu: dict[str, list[float]] = defaultdict(list)
    log = root / "cpu_samples.log"
    if log.is_file():
        procs = _cpu_by_process(log)
        drivers = {pid for pid, p in procs.items() if p["kind"] == "driver"}
        per: dict[tuple[str, str], float] = defaultdict(float)
        for p in procs.values():
            if p["kind"] == "train" and p["run"] in recorded:
                per["train (one run)" if p["ppid"] in drivers else "train again for an audit", p["run"]] += p["cpu"]
            elif p["kind"] == "series":
                per["series audit (one run's)", p["run"]] += p["cpu"]
        for (part, _), v in per.items():
            cpu[part].append(v)
        cpu["eval (one run)"] = [v for run, v in _eval_cpu_by_run(procs).items() if run in recorded]
    out = ["| part | wall s (run records) | CPU s (sampled processes) |", "|---|---|---|"]
    for part in sorted(set(wall) | set(cpu)):
        out.append(f"| {part} | {_stats(wall.get(part, []))} | {_stats(cpu.get(part, []))} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("audit", "cost"))
    p.add_argument("folder", type=Path)
    a = p.parse_args(argv)
    print(audit_table(a.folder) if a.what == "audit" else cost_table(a.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
