"""``gmts run``: the main job on the embedded default.

Samples groups of answers from a shipped policy on the toy domains, probes them with
exact per-token gradient norms, writes statistics (overall and per domain), figures and
the report, and prints within-answer vs cross-answer Spearman for entropy and gmts.
"""

from __future__ import annotations

import argparse
import time

DEFAULT_DOMAINS = "arithmetic,program,logic"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="the main job: sample from a shipped policy, probe, statistics, figures, report",
        description="Sample answers from a shipped toy policy, probe them with exact per-token gradient norms, "
        "and write a complete run directory (tables, stats.json, figures, report.html).",
    )
    p.add_argument("--out", default=None, help="run directory (default: runs/run-YYYYmmdd-HHMMSS)")
    p.add_argument("--policy", default="small", help="shipped policy (tiny | small) or a checkpoint directory")
    p.add_argument("--domains", default=DEFAULT_DOMAINS, help=f"comma-separated toy domains (default: {DEFAULT_DOMAINS})")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per domain (default: 8)")
    p.add_argument("--group-size", type=int, default=8, help="answers per prompt (default: 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling and probing temperature (default: 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation budget (default: the policy card's)")
    p.add_argument("--grad-norm", default="exact", choices=("exact", "sketch", "none"),
                   help="per-token gradient norm (default: exact)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda[:N] (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="sampling, bootstrap and selection seed (default: 0)")
    p.add_argument("--no-figures", dest="figures", action="store_false", help="skip figures and report")
    p.add_argument("--fidelity", default="auto", choices=("auto", "on", "off"),
                   help="update fidelity of selections (default: auto = on under 100k tokens)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from gmts_analysis.config import ProbeConfig
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.models import load_model, resolve_model_path
    from gmts_analysis.finalize import write_run
    from gmts_analysis.kernel import probe_answers
    from gmts_analysis.rollouts import read_rollouts_rows
    from gmts_analysis.toy.domains import DOMAINS
    from gmts_analysis.toy.sample import sample_rollouts

    t0 = time.perf_counter()
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    unknown = [d for d in domains if d not in DOMAINS]
    if not domains or unknown:
        raise GmtsError(f"--domains: unknown domain(s) {', '.join(unknown) or '(none given)'} "
                        f"(choose from {', '.join(DOMAINS)})")
    if args.num_prompts < 1 or args.group_size < 2:
        raise GmtsError("--num-prompts must be >= 1 and --group-size >= 2 (a group needs a baseline)")
    out = Path(args.out or time.strftime("runs/run-%Y%m%d-%H%M%S"))
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise GmtsError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")

    model_path = resolve_model_path(args.policy)
    model, tok = load_model(args.policy, args.device, "float32")
    max_new = args.max_new_tokens or _card_max_new_tokens(model_path)
    rows = []
    for d in domains:
        rows += sample_rollouts(model, tok, d, args.num_prompts, args.group_size, temperature=args.temperature,
                                max_new_tokens=max_new, seed=args.seed, progress=not args.quiet)
    t_sample = time.perf_counter() - t0
    rollouts_text = "".join(json.dumps(r) + "\n" for r in rows)
    answers = read_rollouts_rows(rows, tok, where="sampled rollouts")
    cfg = ProbeConfig(model=args.policy, rollouts="rollouts.jsonl", out=str(out), device=args.device,
                      temperature=args.temperature, grad_norm=args.grad_norm, fidelity=args.fidelity,
                      figures=args.figures, seed=args.seed, overwrite=args.overwrite, quiet=args.quiet)
    result = probe_answers(model, tok, answers, cfg)
    result.timings["sample_s"] = t_sample
    write_run(cfg, model, model_path, answers, result,
              extra={"job": "gmts run", "domains": domains, "num_prompts": args.num_prompts,
                     "group_size": args.group_size, "max_new_tokens": max_new},
              extra_files={"rollouts.jsonl": rollouts_text})
    stats = json.loads((out / "stats.json").read_text())
    print(summary_table(stats, domains))
    rewards = result.answers.groupby("domain")["reward"].mean() if "domain" in result.answers else None
    if rewards is not None:
        print("pass@1 of the sampled answers: " + ", ".join(f"{d} {rewards.get(d, float('nan')):.2f}" for d in domains))
    wall = time.perf_counter() - t0
    print(f"{len(result.tokens)} tokens, {len(result.answers)} answers in {wall:.0f} s -> {out}/ "
          f"(report: {out / 'report.html'})")
    return 0


def _card_max_new_tokens(model_path: str) -> int:
    import json
    from pathlib import Path

    card = Path(model_path) / "card.json"
    if card.exists():
        try:
            v = json.loads(card.read_text()).get("max_new_tokens")
            if isinstance(v, int) and v > 0:
                return v
        except (ValueError, OSError):
            pass
    return 96


def summary_table(stats: dict, domains: list[str]) -> str:
    """Within-answer median vs cross-answer Spearman for entropy and gmts, overall and per domain."""

    def cells(s: dict) -> list[str]:
        out = []
        for est in ("entropy", "gmts"):
            w = (s.get("within_answer") or {}).get(est) or {}
            c = (s.get("cross_answer") or {}).get(est) or {}
            out += [_fmt(w.get("median")), _fmt(c.get("spearman"))]
        return out

    header = ["scope", "entropy within", "entropy cross", "gmts within", "gmts cross"]
    rows = [["all", *cells(stats)]]
    by = stats.get("by_domain") or {}
    for d in domains:
        if d in by:
            rows.append([d, *cells(by[d])])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["Spearman vs per-token gradient norm (within: median over answers vs grad_norm_logp; "
             "cross: pooled vs grad_norm)"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    return "\n".join(lines)


def _fmt(v) -> str:
    return "n/a" if v is None or v != v else f"{v:+.3f}"
