"""TRL drop-in (optional extra [trl]): SelectiveGRPOTrainer runs 2 steps on CPU for each selection
mode; with selection none it reproduces stock GRPOTrainer exactly; the masks it hands to TRL are
the exact-k selections of SPEC section 5 on TRL's own entropies and advantages."""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl")

from gmts_analysis.rl.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer  # noqa: E402
from gmts_analysis.selection import select_tokens  # noqa: E402

G = 4


def char_sum_reward(prompts, completions, **kwargs):
    """Mixed rewards for a random policy: parity of the completion's character codes."""
    return [float(sum(map(ord, c)) % 2) for c in completions]


def _dataset(n=8):
    from datasets import Dataset

    from gmts_analysis.toy.domains import generate_problems

    return Dataset.from_dict({"prompt": [p.prompt for p in generate_problems("arithmetic", n, seed=0, split="train")]})


def _model():
    from gmts_analysis.testing import build_tiny_model
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
    ours = _train(SelectiveGRPOTrainer, _args(tmp_path, token_selection="none"))
    assert len(_losses(stock)) == 2
    assert _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
    # and the run is not trivial: the policy moved
    fresh, _ = _model()
    assert any(not torch.equal(a, b) for a, b in zip(fresh.parameters(), ours.model.parameters()))


class Recording(SelectiveGRPOTrainer):
    """Keeps what TRL passed in and what the selection returned, for independent checks."""

    records: list

    def get_high_entropy_mask(self, entropies, mask, threshold):
        out = super().get_high_entropy_mask(entropies, mask, threshold)
        rec = {k: self._sel_inputs[k].detach().clone() for k in ("advantages", "selection_row_ids")}
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
    logged = [h for h in tr.state.log_history if "selection/frac_selected" in h]
    assert logged and all(0.2 <= h["selection/frac_selected"] <= 0.5 for h in logged)


def test_selected_normalizer_scales_the_mask(tmp_path):
    Recording.records = []
    _train(Recording, _args(tmp_path, token_selection="entropy", selection_normalizer="selected", max_steps=1))
    rec = Recording.records[0]
    out, mask = rec["out"], rec["mask"].bool()
    sel = out > 0
    assert torch.allclose(out[sel], torch.full_like(out[sel], float(mask.sum()) / float(sel.sum())))


def test_conflicting_settings_raise(tmp_path):
    with pytest.raises(ValueError):
        _train(SelectiveGRPOTrainer, _args(tmp_path, token_selection="gmts", top_entropy_quantile=0.2))
    with pytest.raises(ValueError):
        _train(SelectiveGRPOTrainer, _args(tmp_path, token_selection="bogus"))
