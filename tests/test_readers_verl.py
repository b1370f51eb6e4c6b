"""verl rollout dumps (``trainer.rollout_data_dir``) read as verl writes them: groups from
``uid`` (else step and input), the chat template restored where the text allows, EOS back."""

import json

import pandas as pd
import pytest
from _trainer_logs import QWEN_TEMPLATE, chat_tokenizer, save_chat_model, write_verl_dumps

from gmts_analysis.cli import main
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.rollouts import ReaderOptions, read_rollouts


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


def test_verl_dump_ids_restored_and_groups_from_uid(tmp_path, tok):
    truth = write_verl_dumps(tmp_path / "dumps", tok)
    ans = read_rollouts(tmp_path / "dumps", tok, options=ReaderOptions(max_completion_length=6))
    assert len(ans) == 8 and ans.report["format"] == "verl" and ans.report["groups"] == ["uid"]
    for i, a in enumerate(ans):
        pids, cids, score, restorable = truth[(a.step, i % 4 + 1)]
        assert a.response_ids == cids and a.reward == score
        assert (a.prompt_ids == pids) == restorable  # the system-message prompt cannot be restored from text
        assert a.group_id == f"uid-{a.step}-{(i % 4) // 2}"
        assert a.extra["gts"] in ("0", "2") and isinstance(a.extra["acc"], bool)
    ctx = ans.report["context"]
    assert ctx["template_restored_verl"] == 6 and ctx["template_not_restored"] == 2
    assert ctx["eos_appended"] == 7 and ctx["eos_not_appended_length_limit"] == 1
    assert any(line.startswith("could not restore the chat template of 2") for line in ans.report["restored"])
    with pytest.raises(GmtsError, match="line 3: field 'input' is not the chat template's rendering"):
        read_rollouts(tmp_path / "dumps", tok, options=ReaderOptions(chat_template="on", steps="2"))
    off = read_rollouts(tmp_path / "dumps", tok, options=ReaderOptions(chat_template="off", steps="1"))
    assert off[0].prompt_ids == tok(off[0].prompt)["input_ids"]  # as logged, with special tokens


def test_verl_groups_from_step_and_input_without_uid(tmp_path, tok, caplog):
    write_verl_dumps(tmp_path / "d", tok, with_uid=False)
    ans = read_rollouts(tmp_path / "d", tok)
    assert ans.report["groups"] == ["prompt"]
    g = [a.group_id for a in ans]
    assert g[0] == g[1] != g[2] == g[3] and len(set(g)) == 4
    assert "no --max-completion-length" in " ".join(ans.report["restored"])


def test_verl_bad_score_names_file_and_line(tmp_path, tok):
    d = tmp_path / "d"
    d.mkdir()
    (d / "3.jsonl").write_text(json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 3}) + "\n"
                               + '{"input": "q", "output": "b", "score": NaN, "step": 3}\n')
    with pytest.raises(GmtsError, match=r"3\.jsonl: line 2: field 'score' is nan"):
        read_rollouts(d, tok)
    (d / "3.jsonl").write_text(json.dumps({"input": "q", "output": "a", "step": 3}) + "\n")
    with pytest.raises(GmtsError, match=r"line 1: missing field 'score'"):
        read_rollouts(d, tok)


def test_probe_end_to_end_on_a_verl_directory(tmp_path, tok, capsys):
    truth = write_verl_dumps(tmp_path / "dumps", tok)
    model = save_chat_model(tmp_path / "model", arch="llama")
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(model), "--rollouts", str(tmp_path / "dumps"), "--out", str(out),
               "--device", "cpu", "--no-figures", "--fidelity", "off", "--grad-norm", "none",
               "--max-completion-length", "6"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "could not restore the chat template of 2 verl prompt(s)" in err
    a = pd.read_parquet(out / "answers.parquet")
    assert len(a) == 8
    for i, row in enumerate(a.itertuples()):
        pids, cids, score, restorable = truth[(row.step, i % 4 + 1)]
        assert list(row.response_ids) == cids and row.reward == score
        assert (list(row.prompt_ids) == pids) == restorable
    m = json.loads((out / "manifest.json").read_text())
    assert m["rollouts"]["read"]["context"]["template_not_restored"] == 2


def test_verl_template_with_a_default_system_message(tmp_path):
    """Qwen2.5-style templates add a default system message: the logged text then starts with it,
    and a prompt with its own system message does not match (not restored, counted)."""
    tok = chat_tokenizer(QWEN_TEMPLATE)
    truth = write_verl_dumps(tmp_path / "d", tok)
    ans = read_rollouts(tmp_path / "d", tok, options=ReaderOptions(max_completion_length=6))
    assert ans[0].prompt.startswith("system\nYou are a helpful assistant.\nuser\n")  # the text as logged
    for i, a in enumerate(ans):
        pids, cids, score, restorable = truth[(a.step, i % 4 + 1)]
        assert (a.prompt_ids == pids) == restorable and a.response_ids == cids
    assert ans.report["context"]["template_restored_verl"] == 6
    assert ans.report["context"]["template_not_restored"] == 2
