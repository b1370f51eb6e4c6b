"""The real-model training study's driver (benchmarks/trl_study.py run) end to end on a tiny model: every run of
a plan trained through the TRL example script, evaluated on the held-out problems at the plan's steps (step 0,
the base model, once for all runs), recorded where gmts rl-report reads it, and reported with the plan's paired
contrast. Stopped (kill PID) while training, it stops its training script too; run again, it trains what is
left and does nothing once every record exists; a run whose record alone is missing is recorded again from its
checkpoints and cached evaluations without training. A plan whose runs would not be what their records say
(held-out problems trained on, TRL arguments other than the setting's) is refused before any training.

A tiny random llama with the character tokenizer and a minimal chat template stands in for SmolLM2 (as in
tests/test_trl_train.py): two arms x two seeds of 2 steps each, one thread, under a minute."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("math_verify")

ROOT = Path(__file__).resolve().parents[1]
CHAT = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'][-40:] }}\n{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}")
SETTING = "rho0.5_batch"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random llama and the character tokenizer with a chat template (tests/test_trl_train.py's)."""
    from gmts_analysis.toy.testing import save_tiny_model

    d = save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "model", seed=0)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def study_plan(model: Path, heldout: Path) -> dict:
    """A plan in the shape of the real study's: the referee's fields (load_plan) and the driver's ``trl`` block."""
    common = {"policy": "tiny-llama", "steps": 2, "lr": 0.05, "normalizer": "all", "loss_agg": "token-mean",
              "prompts_per_domain": 2, "temperature": 1.0, "max_new_tokens": 6, "eval_prompts": 8,
              "final_eval_prompts": 8, "eval_seed": 3}
    setting = {"name": SETTING, "role": "primary", "file": f"{SETTING}.json", "rho": 0.5, "scope": "batch",
               "group_size": 2, "dynamic_sampling": False, "arms": ["all", "gmts"]}
    trl = {"script_args": {"model_name_or_path": str(model), "train_problems": 16, "eval_problems": 8,
                           "problem_seed": 1, "eval_seed": 2, "difficulty": 1, "examples": "matched",
                           "exclude_problems": str(heldout)},
           "training_args": {"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 6,
                             "learning_rate": 0.05, "lr_scheduler_type": "constant", "max_steps": 2,
                             "save_steps": 1, "logging_steps": 1, "selection_rho": 0.5, "selection_scope": "batch",
                             "report_to": "none", "use_cpu": True, "bf16": False, "disable_tqdm": True},
           "eval": {"prompts": "heldout.jsonl", "steps": [0, 1, 2], "temperature": 0.7, "max_new_tokens": 6,
                    "seed": 3, "answers_per_problem": 2},
           "keep_checkpoints": [1, 2]}
    return {"title": "A tiny TRL study", "metric": "final pass@1 on the held-out word problems", "seeds": [0, 1],
            "alpha": 0.05, "correction": "holm", "common": common,
            "settings": [setting], "trl": trl,
            "contrasts": [{"setting": SETTING, "a": "gmts", "b": "all", "family": "primary",
                           "question": "Does GMTS beat training on every token?"}]}


def _driver(plan: Path, runs: Path, *extra: str, wait: bool = True):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "trl_study.py"), "run", str(plan), "--runs-root", str(runs),
           "--threads", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _driver_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_study", ROOT / "benchmarks" / "trl_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plans_whose_runs_would_not_match_their_records_are_refused(tiny_dir, tmp_path):
    from gmts_analysis.integrations.rollout_log import write_rows
    from gmts_analysis.integrations.trl_train import distinct_word_problems

    drv = _driver_module()
    held = tmp_path / "heldout.jsonl"
    write_rows(held, distinct_word_problems(8, 1, difficulty=1, matched_examples=True))  # the training seed's
    plan = study_plan(tiny_dir, held)
    cases = [({"exclude_problems": None}, {}, "held-out problems"),
             ({}, {"selection_rho": 0.2}, "selection_rho is 0.2, the runs' config.rho is 0.5"),
             ({}, {"save_steps": 2}, "trl.eval.steps [0, 1, 2]"), ({}, {"logging_steps": 2}, "logging_steps is 2"),
             ({}, {"keep_checkpoints": [2]}, "trl.keep_checkpoints [2]")]
    for script, training, needle in cases:
        keep = {"keep_checkpoints": training.pop("keep_checkpoints")} if "keep_checkpoints" in training else {}
        p = {**plan, "trl": {**plan["trl"], "script_args": {**plan["trl"]["script_args"], **script},
                             "training_args": {**plan["trl"]["training_args"], **training}, **keep}}
        (tmp_path / "plan.json").write_text(json.dumps(p))
        with pytest.raises(SystemExit, match=re.escape(needle)):
            drv.run_plan(tmp_path / "plan.json", tmp_path / "runs", None, 1)
        assert not (tmp_path / "runs").exists()  # refused before any training
    # the setting's fields are what the runs train with, not a flag the plan's training_args lack
    p = {**plan, "trl": {**plan["trl"], "training_args": {k: v for k, v in plan["trl"]["training_args"].items()
                                                          if k not in ("selection_rho", "num_generations",
                                                                       "logging_steps")}}}
    args = drv.setting_training_args(p, p["settings"][0], tmp_path / "plan.json")
    assert args["selection_rho"] == 0.5 and args["num_generations"] == 2 and args["max_steps"] == 2
    assert args["logging_steps"] == 1


def test_study_driver_trains_evaluates_records_and_reports(tiny_dir, tmp_path):
    from gmts_analysis.cli import main
    from gmts_analysis.integrations.rollout_log import write_rows
    from gmts_analysis.integrations.trl_train import _problem_text, distinct_word_problems
    from gmts_analysis.rl.arms_plan import load_plan

    plan = tmp_path / "plan.json"
    held = distinct_word_problems(8, 5, difficulty=1, matched_examples=True)
    write_rows(tmp_path / "heldout.jsonl", held)
    plan.write_text(json.dumps(study_plan(tiny_dir, tmp_path / "heldout.jsonl"), indent=1))
    load_plan(plan)
    runs = tmp_path / "runs"

    # stopped while its first run trains: the training script is stopped with it, before its first checkpoint
    proc = _driver(plan, runs, "--only", "all-s0", wait=False)
    deadline = time.time() + 120
    while not (kids := [k for k in _children(proc.pid) if _alive(k)]) and proc.poll() is None:
        assert time.time() < deadline, "the driver started no training script"
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=60) == 143, proc.stderr.read()[-3000:]
    t0 = time.time()
    while any(_alive(k) for k in kids):
        assert time.time() - t0 < 10, "the training script outlived the driver"
        time.sleep(0.05)
    first = runs / SETTING / "all-s0"
    assert not (first / "checkpoint-2").exists()
    assert len(json.loads((first / "timing.json").read_text())["train_wall_segments"]) == 1

    r = _driver(plan, runs)
    assert r.returncode == 0, r.stderr[-4000:]
    recs = tmp_path / f"{SETTING}.runs"
    names = [f"{arm}-s{seed}" for seed in (0, 1) for arm in ("all", "gmts")]
    assert sorted(p.name for p in recs.iterdir()) == sorted(f"{n}.json" for n in names)
    base = json.loads((runs / "base_eval.json").read_text())  # step 0: the base model, evaluated once
    assert base["model"] == str(tiny_dir) and base["n_answers"] == 16 and base["n_prompts"] == 8  # 2 answers each
    for n in names:
        rec = json.loads((recs / f"{n}.json").read_text())
        arm, seed = n.split("-s")
        assert rec["config"]["selection"] == arm and rec["config"]["seed"] == int(seed)
        assert rec["config"]["trainer"] == "trl" and rec["config"]["domains"] == ["word"]
        assert [e["step"] for e in rec["evals"]] == [0, 1, 2]
        assert rec["evals"][0]["pass1"] == {"word": base["pass1"]}  # the shared base evaluation
        assert rec["final_pass1"] == rec["evals"][-1]["pass1"] and rec["final_eval_prompts"] == 8
        assert rec["final_eval_answers"] == 16 and all(e["n"] == 16 and e["n_prompts"] == 8 for e in rec["evals"])
        assert all(0.0 <= e["ci_low"] <= e["pass1_mean"] <= e["ci_high"] <= 1.0 for e in rec["evals"])
        assert [s["step"] for s in rec["steps"]] == [1, 2]
        assert rec["timing_s"]["train"] > 0 and rec["timing_s"]["threads"] == 1 and rec["timing_s"]["eval"] >= 0
        segments = json.loads((runs / SETTING / n / "timing.json").read_text())["train_wall_segments"]
        assert len(segments) == (2 if n == "all-s0" else 1) and rec["timing_s"]["train"] == sum(segments)
        run_dir = runs / SETTING / n
        assert sorted(p.name for p in (run_dir / "evals").glob("step-?????.json")) == ["step-00001.json",
                                                                                   "step-00002.json"]
        args = json.loads((run_dir / "gmts_script_args.json").read_text())
        assert args["examples"] == "matched" and args["difficulty"] == 1
        trained = {_problem_text(json.loads(x)) for x in (run_dir / "problems_train.jsonl").read_text().splitlines()}
        assert len(trained) == 16 and not trained & {_problem_text(x) for x in held}
        ta = _training_args(run_dir / "checkpoint-2")
        # recorded, so nothing will resume it: the kept checkpoints are models only
        assert not list(run_dir.glob("checkpoint-*/optimizer.pt")) and (run_dir / "checkpoint-1").is_dir()
        assert ta.token_selection == arm and ta.seed == int(seed) and ta.selection_rho == 0.5
        assert ta.num_generations == 2 and ta.max_steps == 2
    assert not list(runs.rglob("step-00000.json"))

    # run again: every record exists, nothing is trained, evaluated or rewritten
    stamps = {p: p.stat().st_mtime_ns for p in [*recs.iterdir(), *runs.rglob("*.json"), *runs.rglob("train.log")]}
    t0 = time.time()
    r = _driver(plan, runs)
    assert r.returncode == 0, r.stderr[-4000:]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps and time.time() - t0 < 60

    # a run killed after its training and evaluations, before its record: recorded again, nothing retrained
    old = json.loads((recs / "gmts-s1.json").read_text())
    (recs / "gmts-s1.json").unlink()
    r = _driver(plan, runs)
    assert r.returncode == 0, r.stderr[-4000:]
    new = json.loads((recs / "gmts-s1.json").read_text())
    assert new["evals"] == old["evals"] and new["steps"] == old["steps"]
    assert new["timing_s"] == old["timing_s"]  # the evaluations' own seconds, cached with them
    assert {p: p.stat().st_mtime_ns for p in stamps if p.name != "gmts-s1.json"} == \
        {p: t for p, t in stamps.items() if p.name != "gmts-s1.json"}

    assert main(["rl-report", str(tmp_path), "-q"]) == 0
    rep = json.loads((tmp_path / "rl_report.json").read_text())
    s = rep["settings"][0]
    assert s["name"] == SETTING and s["status"] == "complete"
    finals = {arm: [json.loads((recs / f"{arm}-s{seed}.json").read_text())["final_pass1"]["word"] for seed in (0, 1)]
              for arm in ("all", "gmts")}
    for arm, v in finals.items():
        assert abs(s["results"][arm]["mean"] - sum(v) / 2) < 1e-12
    (c,) = [c for c in rep["contrasts"] if (c["a"], c["b"]) == ("gmts", "all")]
    assert c["status"] == "reported" and c["family"] == "primary"
    md = (tmp_path / "rl_report.md").read_text()
    assert "final pass@1 on the held-out word problems; seeds 0, 1" in md and "- gmts - all (rho0.5_batch, primary)" in md


def _training_args(checkpoint: Path):
    from gmts_analysis.readers.trl_output import training_args

    return training_args(checkpoint)


def test_cached_evaluations_are_reused_only_for_the_same_settings(tiny_dir, tmp_path):
    """The driver's evaluation cache: the same evaluation is read back (nothing sampled again); one whose
    settings changed (answers per problem, temperature) is evaluated again and replaces it; two drivers that
    need the same evaluation at once evaluate it once (the lock), the second reading what the first wrote."""
    import threading

    from gmts_analysis.integrations.trl_train import distinct_word_problems
    from gmts_analysis.run import heldout

    drv = _driver_module()
    rows = distinct_word_problems(4, 5, difficulty=1, matched_examples=True)
    ev = {"temperature": 0.7, "max_new_tokens": 6, "seed": 3, "answers_per_problem": 2}
    out = tmp_path / "base_eval.json"
    calls = []
    real = heldout.evaluate_pass1

    def counted(*a, **k):
        calls.append(k["answers_per_problem"])
        return real(*a, **k)

    heldout.evaluate_pass1 = counted
    try:
        threads = [threading.Thread(target=drv.evaluate, args=(str(tiny_dir), rows, out, ev)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert calls == [2]  # evaluated once for both
        first = json.loads(out.read_text())
        assert first["n_answers"] == 8 and drv.evaluate(str(tiny_dir), rows, out, ev) == first and calls == [2]
        again = drv.evaluate(str(tiny_dir), rows, out, {**ev, "answers_per_problem": 3})
        assert calls == [2, 3] and again["n_answers"] == 12 and json.loads(out.read_text())["n_answers"] == 12
        drv.evaluate(str(tiny_dir), rows, out, {**ev, "answers_per_problem": 3, "temperature": 1.0})
        assert calls == [2, 3, 3]
        assert heldout.cached_key(out.with_suffix(".answers.jsonl"))["temperature"] == 1.0
    finally:
        heldout.evaluate_pass1 = real


def test_a_step_with_no_scorable_held_out_answer_is_refused_not_recorded_as_null():
    """A run record's pass@1 is a number (gmts rl-report's check_evals refuses null): a step whose held-out
    answers were all unscorable is refused in one line naming the step and the fix; where only some were, the
    record says how many (n_unscorable, as series.json does) and passes the readers' checks."""
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.rl.arms_records import check_evals
    from gmts_analysis.rl.trl_records import eval_entry
    from gmts_analysis.run.heldout import pass_at_1

    rows = [{"group_id": g, "reward": float(g % 2), "response_ids": [1, 2]} for g in range(4)]
    none = pass_at_1([{**r, "reward": 0.0, "unscorable": True} for r in rows], n_boot=20)
    with pytest.raises(GmtsError, match=r"^step 3: no held-out pass@1 to record \(none of the 4 answers could be "
                                        r"scored by the verifier\); .*solution"):
        eval_entry(3, {**none, "mean_answer_tokens": 2.0})
    some = pass_at_1([{**r, "unscorable": True, "reward": 0.0} if r["group_id"] == 0 else r for r in rows], n_boot=20)
    e = eval_entry(3, {**some, "mean_answer_tokens": 2.0})
    assert e["n_unscorable"] == 1 and e["n"] == 4 and e["pass1_mean"] == pytest.approx(2 / 3)
    check_evals([e], ["word"], Path("rec.json"))
    assert "n_unscorable" not in eval_entry(3, {**pass_at_1(rows, n_boot=20), "mean_answer_tokens": 2.0})


def test_driver_refusals_are_one_line_and_an_unscored_step_prints_why(tmp_path, monkeypatch, capsys):
    """The driver turns the package's refusals (a step with no scorable answer, above) into its own one-line exit,
    and its eval command prints a refused pass@1 as such (it formatted None as a number: a traceback)."""
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.run.heldout import pass_at_1

    drv = _driver_module()

    def refuse(*a, **k):
        raise GmtsError("step 3: no held-out pass@1 to record")

    monkeypatch.setattr(drv, "run_plan", refuse)
    with pytest.raises(SystemExit, match="^step 3: no held-out pass@1 to record$"):
        drv.main(["run", str(tmp_path / "plan.json"), "--runs-root", str(tmp_path / "runs"), "--threads", "1"])
    rows = [{"group_id": g, "reward": 0.0, "unscorable": True, "truncated": False, "response_ids": [1]}
            for g in range(2)]
    ev = {**pass_at_1(rows, n_boot=10), "mean_answer_tokens": 1.0}
    monkeypatch.setattr(drv, "eval_run", lambda *a, **k: {2: ev})
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "1+1=", "solution": "2"}) + "\n")
    assert drv.main(["eval", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"), "--steps", "2",
                     "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: pass@1 not given (none of the 2 answers could be scored by the verifier), 2 "
                          "unscorable n=2"), out
