"""Methods and formats are entries (issue #29): a gradient-norm method or a rollouts format registered in one
place is chosen by name, listed in the refusals and (a format) detected from a file's columns."""

import json

import pytest
import torch

from gmts_analysis.engine import grad_norms
from gmts_analysis.engine import methods as M
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers import formats as F
from gmts_analysis.readers.rollouts import read_rollouts
from gmts_analysis.toy.testing import build_tiny_model
from gmts_analysis.toy.tokenizer import build_char_tokenizer


@pytest.fixture
def extra_method():
    calls = []

    def run(model, input_ids, prompt_len, args):
        calls.append(args)
        return M.GRAD_METHODS["loop"].run(model, input_ids, prompt_len, args)

    def check(args):
        if args.probes == 3:
            raise GmtsError("probes=3: not for this method")

    M.register_method(M.GradMethod("twice_loop", run, check=check))
    yield calls
    del M.GRAD_METHODS["twice_loop"]


def test_a_registered_method_is_chosen_by_name(extra_method):
    model = build_tiny_model("llama", dtype=torch.float64)
    ids = torch.arange(3, 13)
    got = grad_norms(model, ids, 4, method="twice_loop", chunk_size="2")
    want = grad_norms(model, ids, 4, method="loop")
    torch.testing.assert_close(got.norms, want.norms)
    assert extra_method[0].chunk_size == 2  # parsed before the method runs
    with pytest.raises(GmtsError, match="probes=3: not for this method"):
        grad_norms(model, ids, 4, method="twice_loop", probes=3)
    with pytest.raises(GmtsError, match="choose from exact, sketch, loop, twice_loop"):
        grad_norms(model, ids, 4, method="nope")


@pytest.fixture
def qa_format():
    def normalize(row, spec, where):
        return {"prompt": row.get("q"), "response": row.get("a"), "reward": row.get("ok"), "_source": "qa",
                "_missing": {"prompt": "q", "response": "a", "reward": "ok"}}

    F.register_format(F.RolloutFormat("qa", normalize, detect=lambda keys: {"q", "a"} <= keys, reward_field="ok"))
    yield
    del F.FORMAT_ENTRIES["qa"]


def test_a_registered_format_is_detected_read_and_listed(qa_format, tmp_path):
    tok = build_char_tokenizer()
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [{"q": "1+1=", "a": "2", "ok": 1.0},
                                                          {"q": "1+1=", "a": "3", "ok": 0.0}]))
    ans = read_rollouts(p, tok)
    assert ans.report["format"] == "qa" and ans.report["reward"]["field"] == "ok"
    assert [a.reward for a in ans] == [1.0, 0.0] and ans[0].group_id == ans[1].group_id
    assert F.detect_format(["q", "a"]) == "qa" and F.detect_format(["prompt", "response"]) == "gmts"
    with pytest.raises(GmtsError, match=r"line 1: missing field 'ok' \(or name a verifier"):
        p.write_text(json.dumps({"q": "1+1=", "a": "2"}) + "\n")
        read_rollouts(p, tok)
    with pytest.raises(GmtsError, match=r"choose from auto, gmts, verl, trl, qa\)"):
        read_rollouts(p, tok, fmt="bogus")


def test_grad_norm_choices_are_the_registered_methods():
    """The probe's --grad-norm choices (one torch-free table) are registered methods, plus none; the CLI
    offers exactly them."""
    from gmts_analysis.core.vocabulary import GRAD_NORM_METHODS
    from gmts_analysis.options.config import ProbeConfig

    offered = [k for k in GRAD_NORM_METHODS if k != "none"]
    assert offered and all(k in M.GRAD_METHODS for k in offered)
    from gmts_analysis.options.fields import fields_of

    field = fields_of(ProbeConfig)["grad_norm"]
    assert tuple(field.metadata["choices"]) == tuple(GRAD_NORM_METHODS)
    assert all(k in field.metadata["help"] for k in GRAD_NORM_METHODS)
