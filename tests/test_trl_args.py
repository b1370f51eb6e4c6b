"""The trained loss's TRL arguments, typed once (core/trl_args.py): TRL 1.16's defaults, read from a live config
or a saved record, the fields a record lacks defaulted and reported as before."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gmts_analysis.core.objective import LossSettings, trl_loss_settings
from gmts_analysis.core.trl_args import LOSS_FIELDS, TrlLossArgs
from gmts_analysis.readers.trl_output import defaulted_loss_fields, probe_loss_options

#: what the reading of a plain TrainingArguments gave before the arguments were typed (the old getattr
#: defaults): series.json's loss and loss_defaulted for such a run
PLAIN = {"loss_type": "dapo", "clip_low": 0.2, "clip_high": 0.2, "kl_beta": 0.0, "kl_bias_correction": "on",
         "importance_sampling_level": "token", "temperature": 1.0, "max_completion_length": None}


def test_defaults_are_trl_1_16s_grpo_config():
    """Every default is GRPOConfig's, but max_completion_length (None: not recorded; TRL's is 512)."""
    trl = pytest.importorskip("trl")
    assert trl.__version__.startswith("1.16")
    grpo = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    ours = {f.name: f.default for f in dataclasses.fields(TrlLossArgs) if f.name not in ("aux_loss_enabled",
                                                                                        "missing")}
    assert set(ours) <= set(grpo)
    differ = {k: (v, grpo[k]) for k, v in ours.items() if v != grpo[k]}
    assert differ == {"max_completion_length": (None, 512)}


def test_a_record_without_loss_fields_reads_as_before(tmp_path):
    """A plain TrainingArguments (saved by torch, read back inert): every loss field defaulted and said so."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gmts_analysis.readers.saved_args import read_training_args_bin

    torch.save(transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True),
               tmp_path / "a.bin")
    a = TrlLossArgs.of(read_training_args_bin(tmp_path / "a.bin"))
    assert defaulted_loss_fields(a) == list(LOSS_FIELDS)
    assert probe_loss_options(a, where="a.bin") == PLAIN
    assert a == TrlLossArgs()


def test_a_partial_record_keeps_what_it_holds():
    """An older TRL's record lacking some fields: the held ones are taken, the others defaulted and listed."""
    a = TrlLossArgs.of(SimpleNamespace(loss_type="grpo", beta=0.04, epsilon_high=0.28, output_dir="x"))
    assert (a.loss_type, a.beta, a.epsilon_high, a.epsilon) == ("grpo", 0.04, 0.28, 0.2)
    assert defaulted_loss_fields(a) == ["epsilon", "importance_sampling_level", "temperature", "max_completion_length"]
    assert probe_loss_options(a) == {**PLAIN, "loss_type": "grpo", "clip_high": 0.28, "kl_beta": 0.04}
    held = TrlLossArgs.of(SimpleNamespace(**{f: getattr(a, f) for f in LOSS_FIELDS}))
    assert defaulted_loss_fields(held) == [] and held == a  # missing is not part of equality


def test_vllm_settings_and_the_deprecated_cap():
    s = trl_loss_settings(TrlLossArgs(use_vllm=True))
    assert (s.vllm_is_mode, s.vllm_is_min, s.vllm_is_max) == ("sequence_mask", None, 3.0)
    s = trl_loss_settings(TrlLossArgs(use_vllm=True, vllm_importance_sampling_cap=2.0, loss_type="dr_grpo",
                                      max_completion_length=7))
    assert s == LossSettings(loss_agg="seq-mean-token-sum-norm", max_len=7, kl_bias_correction=True,
                             vllm_is_mode="sequence_mask", vllm_is_max=2.0)


def test_a_trainer_adds_its_aux_loss_flag():
    args = SimpleNamespace(loss_type="dapo")
    a = TrlLossArgs.of_trainer(SimpleNamespace(args=args, aux_loss_enabled=True))
    assert a.aux_loss_enabled and not TrlLossArgs.of(args).aux_loss_enabled
