"""TRL drop-in (optional extra [trl]): SelectiveGRPOTrainer runs 2 steps on CPU for each selection
mode; with selection none it reproduces stock GRPOTrainer exactly; the masks it hands to TRL are
the exact-k selections of docs/definitions.md section 5 on TRL's own entropies and advantages."""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl")

from gmts_analysis.core.selection import select_tokens  # noqa: E402
from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer  # noqa: E402

G = 4


def char_sum_reward(prompts, completions, **kwargs):
    """Mixed rewards for a random policy: parity of the completion's character codes."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def _dataset(n=8):
    from datasets import Dataset

    from gmts_analysis.toy.domains import generate_problems

    return Dataset.from_dict({"prompt": [p.prompt for p in generate_problems("arithmetic", n, seed=0, split="train")]})


def _model():
    from gmts_analysis.toy.testing import build_tiny_model
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_tiny_model("qwen2", vocab_size=len(tok), seed=0)
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def _args(tmp_path, cls=SelectiveGRPOConfig, **kw):
    base = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8, "num_generations": G,
        "max_completion_length": 8, "max_steps": 2, "learning_rate": 1e-2, "logging_steps": 1,
        "report_to": "none", "use_cpu": True, "seed": 0, "save_strategy": "no", "disable_dropout": True,
        "dataloader_num_workers": 0,
    }
    base.update(kw)
    return cls(**base)


def _train(trainer_cls, args):
    model, tok = _model()
    tr = trainer_cls(model=model, reward_funcs=char_sum_reward, args=args, train_dataset=_dataset(),
                     processing_class=tok)
    tr.train()
    return tr


def _losses(tr):
    return [h["loss"] for h in tr.state.log_history if "loss" in h]


def test_selection_none_equals_stock_trl(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    stock = _train(GRPOTrainer, _args(tmp_path, cls=GRPOConfig))
    ours = _train(SelectiveGRPOTrainer, _args(tmp_path, token_selection="all"))
    assert len(_losses(stock)) == 2
    assert _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
    # and the run is not trivial: the policy moved
    fresh, _ = _model()
    assert any(not torch.equal(a, b) for a, b in zip(fresh.parameters(), ours.model.parameters()))


def test_inherited_top_entropy_quantile_with_the_default_arm_equals_stock_trl(tmp_path):
    """TRL's own entropy mask, set on a SelectiveGRPOConfig with the default arm, is TRL's bit for bit."""
    from trl import GRPOConfig, GRPOTrainer

    stock = _train(GRPOTrainer, _args(tmp_path / "a", cls=GRPOConfig, top_entropy_quantile=0.3))
    ours = _train(SelectiveGRPOTrainer, _args(tmp_path / "b", top_entropy_quantile=0.3))
    plain = _train(GRPOTrainer, _args(tmp_path / "c", cls=GRPOConfig))
    assert len(_losses(stock)) == 2 and _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
    # the mask is not a no-op here: without it TRL trains differently
    assert any(not torch.equal(a, b) for a, b in zip(stock.model.parameters(), plain.model.parameters()))


class Recording(SelectiveGRPOTrainer):
    """Keeps what TRL's forward gave the selection and the mask it returned, for independent checks."""

    records: list

    def _selection_mask(self, inputs, entropies, logps, lgn, mask):
        out = super()._selection_mask(inputs, entropies, logps, lgn, mask)
        rec = {k: inputs[k].detach().clone() for k in ("advantages", "selection_row_ids")}
        rec.update(entropies=entropies.detach().clone(), mask=mask.clone(), out=out.detach().clone())
        type(self).records.append(rec)
        return out


@pytest.mark.parametrize("selection", ["entropy", "gmts", "random"])
@pytest.mark.parametrize("scope", ["batch", "group"])
def test_two_steps_each_mode_exact_k(tmp_path, selection, scope):
    Recording.records = []
    tr = _train(Recording, _args(tmp_path, token_selection=selection, selection_scope=scope, selection_rho=0.25))
    losses = _losses(tr)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert len(Recording.records) >= 2
    for rec in Recording.records:
        sel, mask = rec["out"].bool(), rec["mask"].bool()
        assert not (sel & ~mask).any()
        groups = rec["selection_row_ids"] // G
        scopes = [groups == g for g in groups.unique()] if scope == "group" else [torch.ones_like(groups).bool()]
        for rows in scopes:
            n = int(mask[rows].sum())
            assert int(sel[rows].sum()) == math.ceil(0.25 * n - 1e-9)
        if selection in ("entropy", "gmts"):
            # independent: on-policy dapo has constant w, so GMTS ranks by entropy * |A|; rows in global order
            order = torch.argsort(rec["selection_row_ids"])
            s = rec["entropies"].double()
            if selection == "gmts":
                s = s * rec["advantages"].abs().double()[:, None]
            want = select_tokens(s[order], rec["mask"][order], 0.25, scope, groups[order])
            assert torch.equal(sel[order], want)
    assert any(rec["advantages"].abs().sum() > 0 for rec in Recording.records), "rewards should be mixed"
    logged = [h for h in tr.state.log_history if "gmts/selection/frac_selected" in h]
    assert logged and all(0.2 <= h["gmts/selection/frac_selected"] <= 0.5 for h in logged)


def test_selected_normalizer_scales_the_mask(tmp_path):
    Recording.records = []
    _train(Recording, _args(tmp_path, token_selection="entropy", selection_normalizer="selected", max_steps=1))
    rec = Recording.records[0]
    out, mask = rec["out"], rec["mask"].bool()
    sel = out > 0
    assert torch.allclose(out[sel], torch.full_like(out[sel], float(mask.sum()) / float(sel.sum())))


def test_conflicting_settings_raise(tmp_path):
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _args(tmp_path, token_selection="gmts", top_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="token_selection"):
        _args(tmp_path, token_selection="bogus")
    from gmts_analysis.errors import GmtsError

    with pytest.raises(GmtsError, match="cispo"):  # omega of a loss it does not model: refused for gmts
        _train(SelectiveGRPOTrainer, _args(tmp_path, token_selection="gmts", loss_type="cispo"))


def _read_jsonl(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rollouts_dir_writes_exact_ids_that_probe_reads_as_is(tmp_path):
    """SelectiveGRPOConfig(rollouts_dir=...) writes each generation's rows with the ids TRL trained on;
    `gmts probe` reads them with no re-tokenization and its log-probs under the generating model equal
    the old log-probs TRL computed (num_iterations=2 makes TRL compute them)."""
    import pandas as pd

    from gmts_analysis.cli import main

    model0, tok = _model()
    mdir = tmp_path / "policy0"
    model0.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    rdir = tmp_path / "rollouts"
    # bf16=False: TRL 1.16 defaults to bf16 autocast, under which its log-probs differ from a float32
    # forward by up to ~6e-3 on this model; the ids and advantages are exact either way
    tr = _train(SelectiveGRPOTrainer, _args(tmp_path, rollouts_dir=str(rdir), num_iterations=2, max_steps=2,
                                            bf16=False))
    files = sorted(rdir.glob("*.jsonl"))
    assert [f.name for f in files] == ["rollouts_rank0_00001.jsonl"]  # one generation serves 2 iterations (numbered as TRL: trained at step 1)
    rows = _read_jsonl(files[0])
    assert len(rows) == 8
    for r in rows:
        assert r["prompt_ids"] == tok(r["prompt"], add_special_tokens=True)["input_ids"]
        ids = r["response_ids"]
        assert 1 <= len(ids) <= 8 and (ids[-1] == tok.eos_token_id or len(ids) == 8)
        assert tok.eos_token_id not in ids[:-1]
        assert len(r["old_logprobs"]) == len(ids)
        assert r["group_id"] == f"1-{int(r['answer_id'].split('-')[1]) // G}"
    assert len({r["group_id"] for r in rows}) == 2
    assert any(r["logged_advantage"] != 0 for r in rows)
    out = tmp_path / "run"
    assert main(["probe", "--model", str(mdir), "--rollouts", str(rdir), "--out", str(out), "--device", "cpu",
                 "--grad-norm", "none", "--no-figures", "--fidelity", "off", "--advantage", "logged",
                 "--quiet"]) == 0
    ans = pd.read_parquet(out / "answers.parquet").set_index("answer_id")
    tokens = pd.read_parquet(out / "tokens.parquet")
    for r in rows:
        a = ans.loc[r["answer_id"]]
        assert list(a["prompt_ids"]) == r["prompt_ids"] and list(a["response_ids"]) == r["response_ids"]
        assert a["advantage"] == pytest.approx(r["logged_advantage"], abs=1e-6)
        lp = tokens[tokens.answer_id == r["answer_id"]].sort_values("position")["logprob"].to_numpy()
        assert abs(lp - r["old_logprobs"]).max() < 2e-5
    assert tr.state.global_step == 2


def test_log_rollouts_on_stock_trainer(tmp_path):
    """The hook for stock GRPOTrainer: wraps the instance, training is unchanged, rows are written."""
    from trl import GRPOConfig, GRPOTrainer

    from gmts_analysis.integrations.rollout_log import log_rollouts

    model, tok = _model()
    tr = GRPOTrainer(model=model, reward_funcs=char_sum_reward, args=_args(tmp_path, cls=GRPOConfig, max_steps=1),
                     train_dataset=_dataset(), processing_class=tok)
    log_rollouts(tr, tmp_path / "r")
    with pytest.raises(ValueError):
        log_rollouts(tr, tmp_path / "r")
    tr.train()
    rows = _read_jsonl(tmp_path / "r" / "rollouts_rank0_00001.jsonl")
    assert len(rows) == 8 and all("old_logprobs" not in r for r in rows)  # on-policy: TRL computed none
    assert {r["reward"] for r in rows} <= {0.0, 1.0}
    for r in rows:  # rewards as the reward function gives them for the logged text
        assert r["reward"] == char_sum_reward([r["prompt"]], [r["response"]])[0]


def test_rollouts_numbered_as_trl_completions(tmp_path):
    """The drop-in's rollouts file N holds the batch TRL logs as completions_N (the batch trained at step N)."""
    import pandas as pd

    tr = _train(SelectiveGRPOTrainer, _args(tmp_path, rollouts_dir=str(tmp_path / "r"), log_completions=True,
                                            max_steps=2))
    comp = sorted((tmp_path / "out" / "completions").glob("*.parquet"))
    ours = sorted((tmp_path / "r").glob("*.jsonl"))
    assert [p.name for p in comp] == ["completions_00001.parquet", "completions_00002.parquet"]
    assert [p.name for p in ours] == ["rollouts_rank0_00001.jsonl", "rollouts_rank0_00002.jsonl"]
    for c, o in zip(comp, ours):
        logged = pd.read_parquet(c)["completion"].tolist()
        rows = _read_jsonl(o)
        assert [r["response"] for r in rows] == logged
        assert {r["step"] for r in rows} == {int(o.stem.split("_")[-1])}
    assert tr.state.global_step == 2
