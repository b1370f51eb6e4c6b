"""The drop-in's two cut-off rules (docs/definitions.md section 5) and TRL's own.

``selection_cutoff="quantile"`` is TRL's ``top_entropy_quantile`` rule for every arm: with the entropy arm at
batch scope the drop-in trains bit for bit as ``GRPOConfig(top_entropy_quantile=rho)``, also when tied
entropies (the first tokens of one prompt's answers) sit on the cut-off, where the exact-k ``top_k`` rule
keeps fewer of them and trains differently.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from test_rl_trl import _args, _losses, _train  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from gmts_analysis.core.rank import n_keep  # noqa: E402
from gmts_analysis.core.selection import select_tokens  # noqa: E402
from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer  # noqa: E402

_ONE_PROCESS = SimpleNamespace(pad_across_processes=lambda x, dim=0, pad_index=0: x, gather=lambda x: x)


def _trl_mask(entropies, mask, rho):
    """TRL 1.16's own get_high_entropy_mask, called unbound on one process."""
    return GRPOTrainer.get_high_entropy_mask(SimpleNamespace(accelerator=_ONE_PROCESS), entropies, mask, 1 - rho)


def test_rho_03_n4_trl_keeps_1_top_k_keeps_2():
    scores = torch.tensor([[0.4, 0.1, 0.3, 0.2]])
    mask = torch.ones_like(scores)
    q = select_tokens(scores, mask, 0.3, cutoff="quantile")
    k = select_tokens(scores, mask, 0.3, cutoff="top_k")
    assert int(q.sum()) == 1 and int(k.sum()) == 2
    assert torch.equal(q, _trl_mask(scores, mask, 0.3))


def test_counts_differ_for_rho_not_1_over_m():
    """rho = 0.3: the two rules keep different counts for 80 of n = 1..400 distinct scores; rho = 1/5: never."""
    def differ(rho):
        out = 0
        for n in range(1, 401):
            s = torch.arange(n, dtype=torch.float32)[None] / n
            m = torch.ones_like(s)
            kept = select_tokens(s, m, rho, cutoff="quantile")
            assert torch.equal(kept, _trl_mask(s, m, rho))
            out += int(kept.sum()) != n_keep(rho, n)
        return out

    assert differ(0.3) == 80
    assert differ(0.2) == 0


@pytest.mark.parametrize("seed", range(5))
def test_quantile_rule_is_trl_rule_with_ties_and_padding(seed):
    g = torch.Generator().manual_seed(seed)
    ent = torch.randint(0, 6, (5, 7), generator=g).float() / 3  # many ties
    mask = (torch.rand(5, 7, generator=g) < 0.8).long()
    for rho in (0.05, 0.2, 0.3, 0.5, 0.77, 1.0):
        ours = select_tokens(ent.double(), mask, rho, "batch", cutoff="quantile")
        assert torch.equal(ours, _trl_mask(ent, mask, rho)), rho


def test_group_scope_quantile_is_the_rule_per_group():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(6, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.long)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    ours = select_tokens(s, mask, 0.3, "group", groups, cutoff="quantile")
    for c in range(3):
        rows = groups == c
        assert torch.equal(ours[rows], _trl_mask(s[rows].float(), mask[rows], 0.3))


class _RecordTRL(GRPOTrainer):
    """Stock TRL, keeping the entropies and the mask of each call of its entropy mask."""

    records: list = []

    def get_high_entropy_mask(self, entropies, mask, threshold):
        out = super().get_high_entropy_mask(entropies, mask, threshold)
        type(self).records.append((entropies.detach().clone(), mask.clone(), out.clone()))
        return out


def _rho_on_a_tie(entropies, mask):
    """A rho whose interpolated cut-off falls between the last two of >= 3 bit-identical entropies, so TRL keeps
    the whole tie while the exact-k rule keeps only part of it."""
    v = torch.sort(entropies[mask.bool()].float()).values
    n = v.numel()
    for j in range(n - 1, 1, -1):
        if v[j] == v[j - 1] == v[j - 2]:
            q = (j - 0.5) / (n - 1)
            return 1 - q, n
    pytest.fail("no three-way tie among the first micro-batch's entropies")


def test_quantile_cutoff_trains_bit_for_bit_as_top_entropy_quantile_with_a_tie_on_the_cutoff(tmp_path):
    # the first micro-batch's entropies (before any update, so the same whatever rho), to place the cut-off
    _RecordTRL.records = []
    _train(_RecordTRL, _args(tmp_path / "probe", cls=GRPOConfig, top_entropy_quantile=0.5, max_steps=1))
    ent, mask, _ = _RecordTRL.records[0]
    rho, n = _rho_on_a_tie(ent, mask)

    _RecordTRL.records = []
    stock = _train(_RecordTRL, _args(tmp_path / "trl", cls=GRPOConfig, top_entropy_quantile=rho))
    first = _RecordTRL.records[0][2]
    assert int(first.sum()) > n_keep(rho, n)  # the tie at the cut-off: TRL keeps more than ceil(rho n)
    ours = _train(SelectiveGRPOTrainer, _args(tmp_path / "q", token_selection="entropy", selection_rho=rho,
                                              selection_cutoff="quantile"))
    assert len(_losses(stock)) == 2 and _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
    # the exact-k rule keeps part of the tie and trains differently: the comparison above can fail
    top_k = _train(SelectiveGRPOTrainer, _args(tmp_path / "k", token_selection="entropy", selection_rho=rho))
    assert any(not torch.equal(a, b) for a, b in zip(stock.model.parameters(), top_k.model.parameters()))
    # and the run says which cut-off ran
    logged = [h["gmts/selection/cutoff_quantile"] for h in ours.state.log_history
              if "gmts/selection/cutoff_quantile" in h]
    assert logged and set(logged) == {1.0}
    assert {h["gmts/selection/cutoff_quantile"] for h in top_k.state.log_history
            if "gmts/selection/cutoff_quantile" in h} == {0.0}


@pytest.mark.parametrize("arm", ["gmts", "random"])
def test_quantile_cutoff_for_other_arms_keeps_at_or_above_the_quantile(tmp_path, arm):
    seen = []

    class Rec(SelectiveGRPOTrainer):
        def _selection_scores(self, inputs, entropies, logps, lgn, mask):
            s = super()._selection_scores(inputs, entropies, logps, lgn, mask)
            seen.append({"s": s.detach().clone(), "mask": mask.clone()})
            return s

        def _selection_mask(self, inputs, entropies, logps, lgn, mask):
            out = super()._selection_mask(inputs, entropies, logps, lgn, mask)
            seen[-1]["out"] = out.detach().clone()
            return out

    _train(Rec, _args(tmp_path, token_selection=arm, selection_rho=0.3, selection_cutoff="quantile", max_steps=1))
    for rec in seen:
        want = _trl_mask(rec["s"].float(), rec["mask"], 0.3)
        assert torch.equal(rec["out"].bool(), want)


@pytest.mark.parametrize("field, value", [
    ("selection_rho", 0.0), ("selection_rho", 1.5), ("selection_rho", math.nan), ("selection_scope", "prompt"),
    ("selection_cutoff", "quantiles"), ("token_selection", "bogus"), ("selection_normalizer", "kept"),
    ("diagnostics_every", -1), ("diagnostics_tokens", -2),
])
def test_config_checks_itself_one_line_naming_the_field(tmp_path, field, value):
    with pytest.raises(ValueError) as e:
        _args(tmp_path, **{field: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(field)


def test_config_keeps_the_old_name_and_refuses_undefined_normalizer(tmp_path):
    assert _args(tmp_path, token_selection="none").token_selection == "all"
    with pytest.raises(ValueError, match="loss_type 'dr_grpo'"):
        _args(tmp_path, token_selection="entropy", selection_normalizer="selected", loss_type="dr_grpo")
    with pytest.raises(ValueError, match="entropy bonus"):
        _args(tmp_path, token_selection="entropy", selection_normalizer="selected", entropy_coef=0.01)
    assert isinstance(_args(tmp_path), SelectiveGRPOConfig)


def test_the_selection_enters_through_one_override():
    """No TRL entropy-mask hook, no tensors parked on the trainer between methods."""
    import inspect

    from gmts_analysis.integrations.trl import trainer

    src = inspect.getsource(trainer)
    assert "get_high_entropy_mask" not in src and "top_entropy_quantile =" not in src
    assert "self._sel_" not in src
    overridden = {k for k, v in vars(SelectiveGRPOTrainer).items() if callable(v) and k in vars(GRPOTrainer)}
    assert overridden == {"__init__", "_compute_loss", "_generate_and_score_completions"}


def test_selection_metrics_of_log_selection():
    from gmts_analysis.integrations.trl import selection

    batch = selection.GatheredBatch(
        scores=torch.tensor([[3.0, 2.0, 1.0]], dtype=torch.float64), mask=torch.tensor([[1, 1, 1]]),
        entropy=torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64), zero_adv=torch.tensor([[True, False, False]]),
        groups=torch.tensor([0]), mine=torch.tensor([0]))
    kept, by_ent = selection.select(batch, 1 / 3, "batch", "top_k")
    m = defaultdict(list)
    selection.log_selection(m, batch, kept, by_ent, "top_k")
    assert m["gmts/selection/frac_selected"] == [1 / 3] and m["gmts/selection/overlap_entropy"] == [0.0]
    assert m["gmts/selection/frac_selected_zero_adv"] == [1.0] and m["gmts/selection/cutoff_quantile"] == [0.0]


class _TwoProcesses:
    """Accelerate's collectives for process ``index`` of 2, replayed: a first pass records what each process
    hands to ``gather`` (after padding to the sizes both processes agree on), a second returns their concatenation."""

    def __init__(self, index, sizes, recorded=None):
        self.process_index, self.num_processes = index, 2
        self.sizes, self.recorded, self.sent = sizes, recorded, []

    def pad_across_processes(self, x, dim=0, pad_index=0):
        n = self.sizes.get((dim, x.dim(), x.dtype), self.sizes.get((dim, x.dim())))
        if n is None or x.shape[dim] == n:
            return x
        pad = list(x.shape)
        pad[dim] = n - x.shape[dim]
        return torch.cat([x, torch.full(pad, pad_index, dtype=x.dtype)], dim=dim)

    def gather(self, x):
        self.sent.append(x)
        if self.recorded is None:  # the first pass: the right size, contents unused
            return torch.cat([x, x], dim=0)
        k = len(self.sent) - 1
        return torch.cat([self.recorded[0][k], self.recorded[1][k]], dim=0)


def _replay(fn, sizes, per_process):
    first = [_TwoProcesses(i, sizes) for i in range(2)]
    for acc, args in zip(first, per_process):
        fn(acc, *args)
    recorded = [acc.sent for acc in first]
    return [fn(_TwoProcesses(i, sizes, recorded), *args) for i, args in enumerate(per_process)]


@pytest.mark.parametrize("cutoff", ["top_k", "quantile"])
def test_two_processes_select_over_both_micro_batches(cutoff):
    """The selection ranks the micro-batches of both processes together (rows of different lengths and counts):
    each process's mask is its rows of the selection of the union; under the quantile cut-off it is TRL's own
    entropy mask of each process."""
    from gmts_analysis.integrations.trl import selection

    g = torch.Generator().manual_seed(3)
    shapes = [(4, 6), (3, 9)]  # process 0: 4 rows of 6 positions; process 1: 3 rows of 9
    ents, masks, rows = [], [], []
    for p, (B, T) in enumerate(shapes):
        ents.append((torch.randint(0, 5, (B, T), generator=g).float() / 4))  # ties
        masks.append((torch.arange(T)[None] < torch.randint(1, T + 1, (B, 1), generator=g)).long())
        rows.append(torch.arange(B) + 4 * p)
    adv = [torch.ones(B) for B, _ in shapes]

    def ours(acc, ent, mask, row, a):
        batch = selection.gather_rows(acc, ent.double() * mask, mask, ent, a, row, num_generations=2)
        kept, _ = selection.select(batch, 0.3, "batch", cutoff)
        return selection.local_mask(batch, kept, mask)

    sizes = {(1, 2): 9, (0, 2): 4}  # every (B, T) part padded to 9 positions and 4 rows
    got = _replay(ours, sizes, [(ents[p], masks[p], rows[p], adv[p]) for p in range(2)])
    # the union, rows in global order, padded to 9 positions
    pad = [torch.nn.functional.pad(x, (0, 9 - x.shape[1])) for x in ents]
    padm = [torch.nn.functional.pad(x, (0, 9 - x.shape[1])) for x in masks]
    union = select_tokens(torch.cat(pad).double() * torch.cat(padm), torch.cat(padm), 0.3, cutoff=cutoff)
    assert torch.equal(got[0], union[:4, :6]) and torch.equal(got[1], union[4:, :9])
    if cutoff == "quantile":
        n_valid = [int(m.sum()) for m in masks]

        def trl(acc, ent, mask):
            return GRPOTrainer.get_high_entropy_mask(SimpleNamespace(accelerator=acc), ent, mask, 1 - 0.3)

        want = _replay(trl, {(0, 1, torch.float32): max(n_valid)}, [(ents[p], masks[p]) for p in range(2)])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kw", [
    dict(loss_type="grpo"), dict(loss_type="bnpo"), dict(loss_type="dr_grpo"), dict(loss_type="cispo"),
    dict(loss_type="sapo"), dict(loss_type="vespo"), dict(loss_type="luspo", importance_sampling_level="sequence"),
    dict(entropy_coef=0.01), dict(num_iterations=2, epsilon_high=0.28),
], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_quantile_cutoff_equals_top_entropy_quantile_for_every_loss(tmp_path, kw):
    """TRL's loss, as the drop-in runs it (integrations/trl/loss.py), is TRL's for every loss type,
    the entropy bonus and off-policy ratios: the same parameters after 2 steps."""
    stock = _train(GRPOTrainer, _args(tmp_path / "trl", cls=GRPOConfig, top_entropy_quantile=0.3, **kw))
    ours = _train(SelectiveGRPOTrainer, _args(tmp_path / "q", token_selection="entropy", selection_rho=0.3,
                                              selection_cutoff="quantile", **kw))
    assert _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)


def test_quantile_cutoff_equals_top_entropy_quantile_with_the_kl_term(tmp_path):
    """beta > 0: TRL loads a reference model by path, so the tiny model is saved first."""
    from test_rl_trl import _dataset, _model, char_sum_reward

    model, tok = _model()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")

    def train(cls, args):
        tr = cls(model=str(tmp_path / "m"), reward_funcs=char_sum_reward, args=args, train_dataset=_dataset(),
                 processing_class=tok)
        tr.train()
        return tr

    kw = dict(loss_type="grpo", beta=0.04, bf16=False)
    stock = train(GRPOTrainer, _args(tmp_path / "trl", cls=GRPOConfig, top_entropy_quantile=0.3, **kw))
    ours = train(SelectiveGRPOTrainer, _args(tmp_path / "q", token_selection="entropy", selection_rho=0.3,
                                             selection_cutoff="quantile", **kw))
    assert any(k == "kl" for h in stock.state.log_history for k in h)
    assert _losses(ours) == _losses(stock)
    for a, b in zip(stock.model.parameters(), ours.model.parameters()):
        assert torch.equal(a, b)
