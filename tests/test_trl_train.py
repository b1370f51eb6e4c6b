"""Training a causal LM with token selection through TRL (gmts_analysis.integrations.trl_train and
examples/trl_grpo_word_problems.py): the word problems split, the example script end to end on a tiny model,
checkpoints that keep only the newest optimizer, and a killed run resumed to the same weights.

A tiny random llama with the character tokenizer and a minimal chat template stands in for SmolLM2 (the
script takes any causal LM directory); one thread, about a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("math_verify")

from gmts_analysis.errors import GmtsError  # noqa: E402
from gmts_analysis.integrations import trl_train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAT = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'][-40:] }}\n{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random llama and the character tokenizer with a chat template (short prompts: the last 40
    characters of each message)."""
    from gmts_analysis.toy.testing import save_tiny_model

    d = save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "model", seed=0)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def _args(out: Path, model: Path, **kw) -> list[str]:
    base = {"output_dir": str(out), "model_name_or_path": str(model), "train_problems": 16, "eval_problems": 8,
            "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 6,
            "learning_rate": 5e-2, "lr_scheduler_type": "constant", "max_steps": 2, "save_steps": 1,
            "logging_steps": 1, "report_to": "none", "use_cpu": "true", "seed": 3, "threads": 1,
            "token_selection": "gmts", "selection_rho": 0.5, "disable_tqdm": "true", "bf16": "false"}
    base.update(kw)
    return [x for k, v in base.items() for x in (f"--{k}", str(v))]


def test_problem_splits_are_disjoint_reproducible_and_exclude(tmp_path):
    train, held = trl_train.word_problem_splits(600, 200, seed=1, eval_seed=2)
    t = {trl_train._problem_text(r) for r in train}
    h = {trl_train._problem_text(r) for r in held}
    assert len(t) == 600 and len(h) == 200 and not t & h  # more than one word_problems call can draw (250)
    assert trl_train.word_problem_splits(600, 200, seed=1, eval_seed=2) == (train, held)
    from gmts_analysis.integrations.rollout_log import write_rows

    write_rows(tmp_path / "other.jsonl", held[:50])
    t2, h2 = trl_train.word_problem_splits(100, 20, seed=1, eval_seed=3,
                                           exclude=trl_train.problem_texts(str(tmp_path / "other.jsonl")))
    assert not ({trl_train._problem_text(r) for r in t2 + h2} & {trl_train._problem_text(r) for r in held[:50]})
    with pytest.raises(GmtsError, match="distinct problems"):
        trl_train.distinct_word_problems(5000, 0)


def test_level_one_problems_draw_all_700_and_match_examples_without_changing_which():
    one = trl_train.distinct_word_problems(700, 4, difficulty=1)  # a draw of 150 at level 1 stalls
    assert len({trl_train._problem_text(r) for r in one}) == 700 and {r["difficulty"] for r in one} == {1}
    with pytest.raises(GmtsError, match="only 700 distinct"):
        trl_train.distinct_word_problems(701, 4, difficulty=1)
    train, held = trl_train.word_problem_splits(100, 50, seed=1, eval_seed=2, difficulty=1)
    mt, mh = trl_train.word_problem_splits(100, 50, seed=1, eval_seed=2, difficulty=1, matched_examples=True)
    assert [trl_train._problem_text(r) for r in train + held] == [trl_train._problem_text(r) for r in mt + mh]
    assert all(m["prompt"][1]["content"].count("=") == 1 and r["prompt"][1]["content"].count("=") == 2
               for r, m in zip(train + held, mt + mh))


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """The example script run as a user runs it: 2 steps, a checkpoint each, rollouts and completions logged."""
    out = tmp_path_factory.mktemp("trl") / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "trl_grpo_word_problems.py"),
           *_args(out, tiny_dir, rollouts_dir=out / "rollouts", log_completions="true")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    (out.parent / "stderr.txt").write_text(r.stderr)
    return out, cmd


def test_example_script_trains_and_keeps_one_optimizer(tiny_dir, trained):
    out, cmd = trained
    c1, c2 = out / "checkpoint-1", out / "checkpoint-2"
    assert (c1 / "model.safetensors").is_file() and not (c1 / "optimizer.pt").exists()  # model only
    assert (c2 / "optimizer.pt").is_file() and (c2 / "trainer_state.json").is_file()
    assert trl_train.resumable_checkpoint(out) == str(c2)
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["rollouts_rank0_00001.jsonl",
                                                                    "rollouts_rank0_00002.jsonl"]
    rec = json.loads((out / trl_train.SCRIPT_ARGS_FILE).read_text())
    assert rec["model_path"] == str(tiny_dir) and rec["train_problems"] == 16
    held = [json.loads(x) for x in (out / trl_train.HELDOUT_PROBLEMS).read_text().splitlines()]
    train = [json.loads(x) for x in (out / trl_train.TRAIN_PROBLEMS).read_text().splitlines()]
    assert len(held) == 8 and len(train) == 16
    args = json.loads((out / trl_train.TRAINING_ARGS_FILE).read_text())  # the training arguments, never pickled
    assert args["selection_rho"] == 0.5 and args["max_completion_length"] == 6 and list(args) == sorted(args)
    err = (out.parent / "stderr.txt").read_text()
    assert "deprecated" not in err and "Traceback" not in err  # TRL's gradient_checkpointing calls: filtered
    # the same output_dir with other problems is refused in one line
    r = subprocess.run(cmd[:2] + _args(out, tiny_dir, problem_seed=9), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "other script arguments (problem_seed)" in r.stderr
    assert r.stderr.count("\n") == 1 and "--restart" in r.stderr  # one line, naming the fix
    assert rec["examples"] == "fixed"
    r = subprocess.run(cmd[:2] + _args(out, tiny_dir, examples="matched"), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "other script arguments (examples)" in r.stderr


def test_trl_output_read_as_trl_leaves_it(trained, tiny_dir):
    from gmts_analysis.core.trl_args import TrlLossArgs
    from gmts_analysis.readers.sources import rollout_files
    from gmts_analysis.readers.trl_output import own_batch, probe_loss_options, read_trl_output, training_args
    from gmts_analysis.run.series import checkpoint_series

    out, _ = trained
    (out / "config.json").write_text((out / "checkpoint-2" / "config.json").read_text())  # as save_model() leaves
    t = read_trl_output(out)
    assert t.steps == [0, 1, 2] and t.checkpoints[0][1] == str(tiny_dir)  # the base model is step 0
    assert checkpoint_series(str(out)) == [str(tiny_dir), str(out / "checkpoint-1"), str(out / "checkpoint-2")]
    loss = probe_loss_options(TrlLossArgs.of(training_args(out / "checkpoint-2")))
    assert loss["loss_type"] == "dapo" and loss["max_completion_length"] == 6  # TRL 1.16's default loss
    assert [p.name for p in own_batch(t, 1)] == ["rollouts_rank0_00002.jsonl"]  # generated by checkpoint-1
    assert own_batch(t, 2) is None  # training stopped before checkpoint-2 generated a batch
    files = rollout_files(out)  # the output_dir itself: the drop-in's exact ids, not the final model's json
    assert [f.path.name for f in files] == ["rollouts_rank0_00001.jsonl", "rollouts_rank0_00002.jsonl"]
    import shutil

    shutil.move(str(out / "rollouts"), str(out.parent / "moved"))
    try:
        assert [f.path.name for f in rollout_files(out)] == ["completions_00001.parquet", "completions_00002.parquet"]
    finally:
        shutil.move(str(out.parent / "moved"), str(out / "rollouts"))
        (out / "config.json").unlink()


def test_series_audit_of_the_trained_run(trained, tmp_path):
    from gmts_analysis.cli import main

    out, _ = trained
    audit = tmp_path / "audit"
    args = ["series", str(out), "--out", str(audit), "--num-prompts", "2", "--num-generations", "2",
            "--token-answers", "2", "--own-batches", "--threads", "1", "-q", "--no-figures"]
    assert main(args) == 0
    rec = json.loads((audit / "series.json").read_text())
    assert [c["step"] for c in rec["checkpoints"]] == [0, 1, 2]
    assert rec["loss"]["loss_type"] == "dapo" and rec["temperature"] == 1.0
    for c in rec["checkpoints"]:
        assert c["method"] == "exact" and "exact" in c["why"]  # 2-6 token answers: exact is cheaper
        assert 0.0 <= c["ci_low"] <= c["pass1"] <= c["ci_high"] <= 1.0 and c["n_answers"] == 4
        # the answers' modal final answer beside pass@1 (a constant-answer collapse); 2 problems, 2 answers each
        assert "modal_answer" in c and c["modal_solution_share"] in (0.5, 1.0)
        assert c["modal_answer_share"] is None or 0.25 <= c["modal_answer_share"] <= 1.0
        assert (audit / c["run"] / "stats.json").is_file()
    assert rec["checkpoints"][0]["own_batch"] == "batches/step-00000"
    assert rec["checkpoints"][2]["own_batch"] is None
    cmp = json.loads((audit / "compare" / "compare.json").read_text())
    assert [r["x"] for r in cmp["runs"]] == [0, 1, 2]
    moves = json.loads((audit / "tokens" / "token_moves.json").read_text())
    assert moves["steps"] == [0, 2] or moves["steps"] == [0, 1, 2]
    import pandas as pd

    t = pd.read_csv(audit / "tokens" / "token_moves.csv")
    for st in (0, 1, 2):
        assert abs(t.groupby("answer_id")[f"share_{st}"].sum() - 1).max() < 1e-9  # shares of each answer sum to 1
    assert (t["delta"] - (t["share_2"] - t["share_0"])).abs().max() < 1e-12
    # the same command again: everything is reused (no new sampling or probing)
    before = {p: p.stat().st_mtime_ns for p in (audit / "samples").iterdir()}
    assert main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in (audit / "samples").iterdir()} == before


def _parity(prompts, completions, **kw):
    """Mixed rewards for a random policy, so the loss moves the weights."""
    return [float(sum(map(ord, str(c))) % 2) for c in completions]


def _weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def _run(out: Path, model: Path, stop_after: int | None = None):
    from transformers import TrainerCallback

    a, t = trl_train.parse_arguments(_args(out, model, max_steps=3))
    if stop_after is None:
        return trl_train.train(a, t, reward_funcs=_parity)

    class Kill(TrainerCallback):  # a kill right after a checkpoint is written
        def on_save(self, args, state, control, **kw):
            if state.global_step >= stop_after:
                raise KeyboardInterrupt

    orig = trl_train.build_trainer

    def with_kill(*args, **kw):
        tr = orig(*args, **kw)
        tr.add_callback(Kill())
        return tr

    trl_train.build_trainer = with_kill
    try:
        with pytest.raises(KeyboardInterrupt):
            trl_train.train(a, t, reward_funcs=_parity)
    finally:
        trl_train.build_trainer = orig


def test_killed_run_resumes_to_the_same_weights(tiny_dir, tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path / "straight", tiny_dir)
    _run(tmp_path / "killed", tiny_dir, stop_after=1)
    assert trl_train.resumable_checkpoint(tmp_path / "killed").endswith("checkpoint-1")
    tr = _run(tmp_path / "killed", tiny_dir)  # the same command again: resumes from checkpoint-1
    assert tr.state.global_step == 3
    base = _weights(tiny_dir)
    a, b = _weights(tmp_path / "straight" / "checkpoint-3"), _weights(tmp_path / "killed" / "checkpoint-3")
    assert any(not torch.equal(a[k], base[k]) for k in a)  # it trained
    for k in a:
        assert torch.equal(a[k], b[k]), k
    logs = [json.loads((tmp_path / d / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
            for d in ("straight", "killed")]
    assert [h.get("reward") for h in logs[0]] == [h.get("reward") for h in logs[1]]


def test_trl_run_records_are_read_by_rl_report(trained, tmp_path):
    """A TRL run as a gmts rl-report run record: TRL's per-step metrics, held-out evaluations, the plan's config."""
    from gmts_analysis.cli import main
    from gmts_analysis.rl.trl_records import trl_run_record

    out, _ = trained
    common = {"policy": "tiny-llama", "steps": 2, "lr": 0.05, "normalizer": "all", "loss_agg": "token-mean",
              "prompts_per_domain": 2, "temperature": 1.0, "eval_prompts": 8, "final_eval_prompts": 8}
    setting = {"name": "rho0.5_batch", "role": "primary", "file": "rho0.5_batch.json", "rho": 0.5,
               "scope": "batch", "group_size": 2, "dynamic_sampling": False, "arms": ["all", "gmts"]}
    plan = {"title": "t", "seeds": [3, 4], "alpha": 0.05, "correction": "holm", "common": common,
            "settings": [setting], "contrasts": [{"setting": "rho0.5_batch", "a": "gmts", "b": "all",
                                                  "family": "primary", "question": "?"}]}
    data = tmp_path / "study"
    (data / "rho0.5_batch.runs").mkdir(parents=True)
    (data / "plan.json").write_text(json.dumps(plan))
    ev = {"n_answers": 8, "ci_low": 0.0, "ci_high": 0.25, "se": 0.1, "boxed_share": 0.0, "truncated_share": 1.0,
          "modal_answer": "8", "modal_answer_share": 0.75, "modal_solution_share": 0.25}
    for arm in ("all", "gmts"):
        for seed, p in ((3, 0.125), (4, 0.25 if arm == "gmts" else 0.125)):
            cfg = {**common, **{k: setting[k] for k in ("rho", "scope", "group_size", "dynamic_sampling")},
                   "selection": arm, "seed": seed}
            rec = trl_run_record(out, cfg, {0: {**ev, "pass1": 0.0}, 2: {**ev, "pass1": p}},
                                 timing={"train": 1.0})
            (data / "rho0.5_batch.runs" / f"{arm}-s{seed}.json").write_text(json.dumps(rec))
    assert [s["step"] for s in rec["steps"]] == [1, 2]
    st = rec["steps"][0]
    assert 0.0 <= st["frac_groups_zero_std"] <= 1.0 and 0.0 <= st["frac_tokens_zero_adv"] <= 1.0
    assert 0.0 <= st["frac_selected_zero_adv"] <= 1.0 and abs(st["frac_selected"] - 0.5) < 0.1
    assert rec["final_pass1"] == {"word": 0.25} and rec["evals"][0]["step"] == 0
    assert rec["evals"][-1]["modal_answer_share"] == 0.75 and rec["evals"][-1]["modal_answer"] == "8"
    assert main(["rl-report", str(data), "-q"]) == 0
    rep = json.loads((data / "rl_report.json").read_text())
    s = rep["settings"][0]
    assert s["status"] == "complete" and abs(s["results"]["gmts"]["mean"] - 0.1875) < 1e-12
    assert 0.0 <= s["mechanism"]["gmts"]["zero_adv_tokens"] <= 1.0


def test_a_finished_run_keeps_the_checkpoints_asked_for_as_models_only(tmp_path):
    for step in (5, 10, 15, 20):
        c = tmp_path / f"checkpoint-{step}"
        c.mkdir()
        for f in ("config.json", "model.safetensors", "trainer_state.json", "optimizer.pt", "rng_state.pth"):
            (c / f).write_bytes(b"x" * 10)
    freed = trl_train.prune_finished_run(tmp_path, keep_steps=[5, 10])
    assert [s for s, _ in trl_train.checkpoint_dirs(tmp_path)] == [5, 10, 20]  # the newest always stays
    assert not list(tmp_path.glob("checkpoint-*/optimizer.pt")) and not list(tmp_path.glob("checkpoint-*/rng_*"))
    assert (tmp_path / "checkpoint-20" / "trainer_state.json").is_file()
    assert freed == 50 + 3 * 20
    assert trl_train.prune_finished_run(tmp_path) == 0  # nothing left to free; keep_steps None keeps every model
