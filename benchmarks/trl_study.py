"""The real-model training study's driver (docs/studies/trl.md section 11): train, evaluate and record every run of a plan.

    python benchmarks/trl_study.py run data/trl_study/plan.json --runs-root /work/study37/runs [--only gmts-s0]
    python benchmarks/trl_study.py eval RUN_DIR --prompts heldout.jsonl --steps 0,20,40 [--base smollm2]

``run`` goes through the plan's runs seed by seed (every arm of a seed, then the next seed), each in three
resumable stages: **train** (``examples/trl_grpo_word_problems.py`` in a subprocess with the plan's ``trl``
arguments and the run's arm and seed; killed, it resumes from its newest checkpoint), **evaluate** (pass@1 on the
plan's held-out problems at the plan's evaluation steps, ``answers_per_problem`` answers each at the fixed
evaluation seed; each evaluation cached in ``RUN_DIR/evals/step-NNNNN.json`` and reused only for the same
settings; step 0 is the base model, evaluated once for all runs, under a lock when two drivers share it)
and **record** (the run record that ``gmts rl-report`` reads, :func:`gmts_analysis.rl.trl_records.trl_run_record`,
written into the plan's ``<setting>.runs/`` beside plan.json). Run it again after a kill: finished stages are
skipped; a stop (``kill PID``, Ctrl-C) stops the training script too. Logs go to stderr and RUN_DIR/train.log.

The plan is ``gmts rl-report``'s (:func:`gmts_analysis.rl.arms_plan.load_plan`) with a ``trl`` block:
``script_args`` (``WordProblemArguments``' fields), ``training_args`` (``SelectiveGRPOConfig``'s) and ``eval``
(``prompts``, a JSONL file beside plan.json; ``steps``; ``temperature``; ``max_new_tokens``; ``seed``;
``answers_per_problem``), and optionally ``keep_checkpoints``: once a run is recorded, its checkpoints of other
steps are deleted (the newest always stays) and every checkpoint's optimizer and RNG states with them
(:func:`gmts_analysis.integrations.trl_train.prune_finished_run`; 0.54 GB per SmolLM2 checkpoint kept). A run
trains what its record says: the config fields of :data:`PLAN_FLAGS` (the setting's ``rho``, ``scope``,
``group_size``; ``common``'s ``steps``, ``lr``, ...) are passed as their TRL flags, and a plan is refused before any
training when its ``training_args`` say otherwise, when the held-out problems are among the training problems
(name them in ``script_args.exclude_problems``), or when its evaluation is not the config's (:func:`check_plan`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("trl_study")


def _eval_dir(run_dir: Path) -> Path:
    d = run_dir / "evals"
    d.mkdir(parents=True, exist_ok=True)
    return d


def evaluate(model: str, rows: list[dict], out: Path, ev: dict) -> dict:
    """pass@1 of ``model`` on ``rows`` cached at ``out`` (json) and ``out.answers.jsonl``.

    The cache is reused only when its answers' sampling key (:func:`gmts_analysis.run.heldout.sampling_key`:
    the model, the prompts, the answers per problem, temperature, token budget, seed and verifier) is this
    evaluation's; otherwise it is evaluated again and replaced. Two drivers that need the same evaluation (the
    base model's, shared by every run) take turns on a lock file: the second reads what the first wrote."""
    import fcntl

    from gmts_analysis.run.heldout import cached_key, evaluate_pass1, sampling_key
    from gmts_analysis.util.io import atomic_write_json

    n = int(ev.get("answers_per_problem", 1))
    verifier = ev.get("verifier", "math_boxed")
    answers = out.with_suffix(".answers.jsonl")
    key = sampling_key(model, rows, n, temperature=ev["temperature"], max_new_tokens=ev["max_new_tokens"],
                       seed=ev["seed"], verifier=verifier)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            if cached_key(answers) == key:
                return json.loads(out.read_text())
            log.warning("%s: cached with other settings than the plan's evaluation; evaluating again", out)
        res = evaluate_pass1(model, rows, temperature=ev["temperature"], max_new_tokens=ev["max_new_tokens"],
                             seed=ev["seed"], verifier=verifier, path=answers, batch_size=ev.get("batch_size", 32),
                             answers_per_problem=n)
        res["model"] = model
        atomic_write_json(out, res)
    log.info("%s: pass@1 %.3f [%.3f, %.3f] on %d (%.0f s)", out, res["pass1"], res["ci_low"], res["ci_high"],
             res["n_answers"], res["seconds"])
    return res


def eval_run(run_dir: Path, rows: list[dict], steps: list[int], ev: dict, base: str | None,
             base_cache: Path | None = None) -> dict[int, dict]:
    """Evaluations of the checkpoints ``steps`` of ``run_dir`` (step 0: ``base``, cached at ``base_cache``)."""
    from gmts_analysis.readers.trl_output import is_trl_output, read_trl_output

    if is_trl_output(run_dir):
        where = dict(read_trl_output(run_dir, base=base).checkpoints)
    else:  # no checkpoint yet: only the base model (step 0), as the script recorded it
        args = json.loads((run_dir / "gmts_script_args.json").read_text())
        where = {0: base or args["model_path"]}
    out = {}
    for s in steps:
        if s not in where:
            raise SystemExit(f"{run_dir}: no checkpoint of step {s} (have {sorted(where)})")
        f = base_cache if (s == 0 and base_cache is not None) else _eval_dir(run_dir) / f"step-{s:05d}.json"
        out[s] = evaluate(where[s], rows, f, ev)
    return out


def _flags(d: dict) -> list[str]:
    return [x for k, v in d.items() if v is not None for x in (f"--{k}", str(v))]


def train(run_dir: Path, trl: dict, arm: str, seed: int, threads: int, training_args: dict | None = None) -> float:
    """Train (or resume) one run with ``training_args`` (default: the plan's ``trl.training_args``); returns this
    segment's wall seconds (0 when already finished), also added to ``RUN_DIR/timing.json`` when the segment ends,
    killed or not. Finished means the final checkpoint has its ``trainer_state.json``, which TRL writes last."""
    from gmts_analysis.integrations.trl_train import checkpoint_dirs
    from gmts_analysis.util.io import atomic_write_json

    training_args = trl["training_args"] if training_args is None else training_args
    steps = int(training_args["max_steps"])
    done = [s for s, _ in checkpoint_dirs(run_dir)]
    if steps in done and (run_dir / f"checkpoint-{steps}" / "trainer_state.json").is_file():
        return 0.0
    run_dir.mkdir(parents=True, exist_ok=True)
    args = {**trl["script_args"], **training_args, "output_dir": str(run_dir), "seed": seed,
            "token_selection": arm, "threads": threads, "rollouts_dir": str(run_dir / "rollouts")}
    cmd = [sys.executable, str(ROOT / "examples" / "trl_grpo_word_problems.py"), *_flags(args)]
    log.info("train %s (resume from %s)", run_dir.name, max(done) if done else "scratch")
    t0 = time.time()
    try:
        with open(run_dir / "train.log", "a") as f:  # subprocess.run kills the script when this process is stopped
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    finally:
        seg = time.time() - t0
        tfile = run_dir / "timing.json"
        timing = json.loads(tfile.read_text()) if tfile.is_file() else {"train_wall_segments": []}
        timing["train_wall_segments"].append(round(seg, 1))
        atomic_write_json(tfile, timing)
    if r.returncode != 0:
        raise SystemExit(f"{run_dir}: training failed (exit {r.returncode}); see {run_dir / 'train.log'}")
    return seg


#: the plan's run config fields (``common`` and the setting's) -> the TRL flags that train them
PLAN_FLAGS = {"rho": "selection_rho", "scope": "selection_scope", "group_size": "num_generations",
              "normalizer": "selection_normalizer", "steps": "max_steps", "lr": "learning_rate",
              "temperature": "temperature", "max_new_tokens": "max_completion_length",
              "max_grad_norm": "max_grad_norm", "weight_decay": "weight_decay"}


def setting_training_args(plan: dict, setting: dict, plan_path: Path) -> dict:
    """The TRL training arguments of ``setting``'s runs: the plan's ``trl.training_args`` with the fields of the
    runs' config (:data:`PLAN_FLAGS`) filled in, so that a run trains what its record says; a plan whose
    ``training_args`` say otherwise, or whose setting needs what the TRL script lacks, is refused."""
    from gmts_analysis.rl.arms_plan import _same, expected_config

    cfg = expected_config(plan, setting)
    out = dict(plan["trl"]["training_args"])
    for k, flag in PLAN_FLAGS.items():
        if k in cfg:
            if flag in out and not _same(out[flag], cfg[k]):
                raise SystemExit(f"{plan_path}: setting {setting['name']}: trl.training_args.{flag} is {out[flag]!r}, "
                                 f"the runs' config.{k} is {cfg[k]!r}")
            out[flag] = cfg[k]
    if cfg.get("dynamic_sampling"):
        raise SystemExit(f"{plan_path}: setting {setting['name']}: dynamic_sampling is true; the TRL script has none")
    if "max_steps" not in out:
        raise SystemExit(f"{plan_path}: give common.steps (or trl.training_args.max_steps)")
    out.setdefault("logging_steps", 1)  # the record's steps: one per optimizer step, from TRL's log_history
    if out["logging_steps"] != 1:
        raise SystemExit(f"{plan_path}: trl.training_args.logging_steps is {out['logging_steps']!r}; the run record "
                         "takes every step's metrics from TRL's log (1)")
    return out


def check_plan(plan: dict, plan_path: Path, rows: list[dict]) -> dict[str, dict]:
    """Refuse, before any training, a plan whose runs would not be what their records say: held-out problems
    trained on, evaluation steps without a checkpoint or ending before the last step, an evaluation other than
    the config's (prompts, seed). Returns ``{setting name: training arguments}`` (:func:`setting_training_args`)."""
    from gmts_analysis.integrations.trl_train import WordProblemArguments, _problem_text, script_splits
    from gmts_analysis.rl.arms_plan import expected_config

    ev = plan["trl"]["eval"]
    train_rows, _ = script_splits(WordProblemArguments(**plan["trl"]["script_args"]))
    held = {_problem_text(r) for r in rows}
    trained = sum(_problem_text(r) in held for r in train_rows)
    if trained:
        raise SystemExit(f"{plan_path}: {trained} of the held-out problems ({ev['prompts']}) are among the training "
                         "problems; name that file in trl.script_args.exclude_problems")
    out = {}
    for setting in plan["settings"]:
        targs = setting_training_args(plan, setting, plan_path)
        cfg = expected_config(plan, setting)
        steps = int(targs["max_steps"])
        save = int(targs.get("save_steps") or steps)
        evs = list(ev["steps"])
        if evs != sorted(set(evs)) or not evs or evs[-1] != steps \
                or any(s and s % save and s != steps for s in evs):
            raise SystemExit(f"{plan_path}: trl.eval.steps {evs}: expected increasing checkpoint steps (multiples of "
                             f"save_steps {save}) ending at the last step {steps}")
        keep = plan["trl"].get("keep_checkpoints")
        if keep is not None and (not isinstance(keep, list) or any(
                not isinstance(k, int) or k < 1 or (k % save and k != steps) for k in keep)
                or not set(s for s in evs if s) <= set(keep)):
            raise SystemExit(f"{plan_path}: trl.keep_checkpoints {keep!r}: expected checkpoint steps (multiples of "
                             f"save_steps {save}) that hold every evaluated step {[s for s in evs if s]}")
        for k in ("final_eval_prompts", "eval_prompts"):
            if cfg.get(k) and cfg[k] != len(rows):
                raise SystemExit(f"{plan_path}: common.{k} is {cfg[k]}, the held-out problems ({ev['prompts']}) "
                                 f"are {len(rows)}")
        if not (cfg.get("final_eval_prompts") or cfg.get("eval_prompts")):
            raise SystemExit(f"{plan_path}: give common.eval_prompts: {len(rows)} (the held-out problems; gmts "
                             "rl-report's evaluation SE)")
        if cfg.get("eval_seed") is not None and cfg["eval_seed"] != ev["seed"]:
            raise SystemExit(f"{plan_path}: common.eval_seed is {cfg['eval_seed']}, trl.eval.seed {ev['seed']}")
        out[setting["name"]] = targs
    return out


def run_plan(plan_path: Path, runs_root: Path, only: set[str] | None, threads: int) -> None:
    from gmts_analysis.integrations.trl_train import checkpoint_dirs, prune_finished_run
    from gmts_analysis.rl.arms_plan import expected_config, load_plan
    from gmts_analysis.rl.config import run_path
    from gmts_analysis.rl.trl_records import trl_run_record
    from gmts_analysis.sampling.generate import read_prompts
    from gmts_analysis.util.io import atomic_write_json

    plan = load_plan(plan_path)
    if not isinstance(plan.get("trl"), dict) or not all(isinstance(plan["trl"].get(k), dict)
                                                          for k in ("script_args", "training_args", "eval")):
        raise SystemExit(f"{plan_path}: expected a trl block of objects script_args, training_args and eval")
    trl = plan["trl"]
    ev = trl["eval"]
    rows = read_prompts(plan_path.parent / ev["prompts"])
    targs = check_plan(plan, plan_path, rows)
    base = trl["script_args"]["model_name_or_path"]
    base_cache = runs_root / "base_eval.json"
    runs_root.mkdir(parents=True, exist_ok=True)
    for seed in plan["seeds"]:
        for setting in plan["settings"]:
            for arm in setting["arms"]:
                name = f"{arm}-s{seed}"
                if only and name not in only:
                    continue
                rec_path = run_path(plan_path.parent / setting["file"], arm, seed)
                if rec_path.is_file():
                    continue
                run_dir = runs_root / setting["name"] / name
                train(run_dir, trl, arm, seed, threads, targs[setting["name"]])
                timing = json.loads((run_dir / "timing.json").read_text()) if (run_dir / "timing.json").is_file() \
                    else {"train_wall_segments": []}
                evals = eval_run(run_dir, rows, list(ev["steps"]), ev, base=None if 0 not in ev["steps"] else
                                 _base_path(base), base_cache=base_cache)
                cfg = {**expected_config(plan, setting), "selection": arm, "seed": seed}
                # the evaluations' own seconds (a cached one keeps its time); step 0, shared, is not this run's
                rec = trl_run_record(run_dir, cfg, evals, timing={
                    "train": float(sum(timing["train_wall_segments"])),
                    "eval": round(sum(float(v.get("seconds", 0.0)) for s, v in evals.items() if s != 0), 1),
                    "threads": threads})
                rec["timing_s"]["total"] = rec["timing_s"]["train"] + rec["timing_s"]["eval"]
                rec_path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(rec_path, rec)
                log.info("recorded %s: final pass@1 %.3f", rec_path, rec["final_pass1"]["word"])
                freed = prune_finished_run(run_dir, trl.get("keep_checkpoints"))
                log.info("%s: %.1f GB of checkpoints freed (kept: steps %s)", run_dir.name, freed / 1e9,
                         [s for s, _ in checkpoint_dirs(run_dir)])


def _base_path(name: str) -> str:
    from gmts_analysis.integrations.trl_train import trainable_checkpoint

    return trainable_checkpoint(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("plan", type=Path)
    r.add_argument("--runs-root", type=Path, required=True)
    r.add_argument("--only", default=None, help="comma-separated run names (arm-sSEED)")
    r.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("eval")
    e.add_argument("run_dir", type=Path)
    e.add_argument("--prompts", type=Path, required=True)
    e.add_argument("--steps", required=True)
    e.add_argument("--base", default=None)
    e.add_argument("--seed", type=int, default=12345)
    e.add_argument("--temperature", type=float, default=0.7)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--answers-per-problem", type=int, default=1)
    e.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    import signal

    import torch

    # a stop (kill PID) ends this process as an exception does: the training script it runs is killed with it
    # (subprocess.run), not left training into the run's folder beside the next driver's
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(a.threads)
    from gmts_analysis.errors import GmtsError

    try:
        if a.cmd == "run":
            run_plan(a.plan, a.runs_root, set(a.only.split(",")) if a.only else None, a.threads)
        else:
            from gmts_analysis.sampling.generate import read_prompts

            ev = {"temperature": a.temperature, "max_new_tokens": a.max_new_tokens, "seed": a.seed,
                  "answers_per_problem": a.answers_per_problem}
            steps = [int(x) for x in a.steps.split(",")]
            res = eval_run(a.run_dir, read_prompts(a.prompts), steps, ev,
                           base=_base_path(a.base) if a.base else None)
            for s, v in res.items():
                print(eval_line(s, v))
    except GmtsError as e:  # bad input (a run record refused, a file unreadable): one line, like the driver's own
        raise SystemExit(str(e)) from None
    return 0


def eval_line(step: int, v: dict) -> str:
    """One evaluation (:func:`evaluate`'s result) as a line; a pass@1 refused (no answer could be scored) says
    why instead of a number."""
    if v["pass1"] is None:
        p1 = f"pass@1 not given ({v.get('pass1_refused')})"
    else:
        p1 = f"pass@1 {v['pass1']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
    if v.get("n_unscorable"):
        p1 += f", {v['n_unscorable']} unscorable"
    return (f"step {step}: {p1} n={v['n_answers']} boxed {v['boxed_share']} truncated {v['truncated_share']:.3f} "
            f"len {v['mean_answer_tokens']:.0f}")


if __name__ == "__main__":
    sys.exit(main())
