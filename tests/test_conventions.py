"""The ecosystem's spellings: underscores, TRL/verl names, --config YAML, help groups, hub downloads,
verl's extra aggregation modes."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import make_rollouts

from gmts_analysis.cli import build_parser, main
from gmts_analysis.errors import GmtsError

BASE = ["probe", "--model", "tiny", "--rollouts", "r.jsonl", "--out", "o"]


def parse(*extra: str):
    return build_parser().parse_args([*BASE, *extra])


# ----------------------------------------------------------------- command line


def test_underscores_and_hyphens_are_the_same_flag():
    a = parse("--loss_agg", "seq-mean-token-mean", "--kl_beta", "0.1", "--no_figures", "--grad_norm", "none")
    b = parse("--loss-agg", "seq-mean-token-mean", "--kl-beta", "0.1", "--no-figures", "--grad-norm", "none")
    for k in ("loss_agg", "kl_beta", "figures", "grad_norm"):
        assert getattr(a, k) == getattr(b, k)
    assert a.figures is False and a.kl_beta == 0.1
    assert not getattr(a, "aliases", None)  # our own names, spelled either way, are no alias


@pytest.mark.parametrize("value, expected", [("group", "group"), ("batch", "batch"), ("none", "none"),
                                             ("true", "group"), ("True", "group"), ("false", "none")])
def test_scale_rewards_values(value, expected):
    a = parse("--scale_rewards", value)
    assert a.advantage == expected and a.aliases == {"--scale_rewards": "advantage"}


def test_trl_command_line_maps_and_records():
    a = parse("--loss_type", "dapo", "--epsilon", "0.25", "--epsilon_high", "0.3", "--beta", "0.04",
              "--top_entropy_quantile", "0.1", "--mask_truncated_completions", "--max_completion_length", "64")
    assert (a.loss_type, a.clip_low, a.clip_high, a.kl_beta, a.rho) == ("dapo", 0.25, 0.3, 0.04, 0.1)
    assert a.mask_truncated_completions is True and a.max_completion_length == 64
    # TRL's names are recorded, those that are also ours mapped to themselves (options.TRL_NAMES)
    assert a.aliases == {"--epsilon": "clip_low", "--epsilon_high": "clip_high", "--beta": "kl_beta",
                         "--top_entropy_quantile": "rho", "--loss_type": "loss_type",
                         "--mask_truncated_completions": "mask_truncated_completions",
                         "--max_completion_length": "max_completion_length"}


def test_epsilon_alone_sets_both_sides_like_trl():
    a = parse("--epsilon", "0.3")
    assert a.clip_low == a.clip_high == 0.3 and a.aliases == {"--epsilon": "clip_low, clip_high"}
    b = parse("--epsilon", "0.3", "--clip-high", "0.28")  # an explicit other side wins, in any order
    assert (b.clip_low, b.clip_high) == (0.3, 0.28)
    c = parse("--clip_high", "0.28", "--epsilon=0.3")
    assert (c.clip_low, c.clip_high) == (0.3, 0.28)
    d = parse("--clip_ratio", "0.1")
    assert d.clip_low == d.clip_high == 0.1


def test_verl_names():
    a = parse("--loss_agg_mode", "seq-mean-token-sum", "--clip_ratio_low", "0.2", "--clip_ratio_high", "0.28",
              "--kl_loss_coef", "0.001", "--clip_ratio_c", "3")
    assert (a.loss_agg, a.clip_low, a.clip_high, a.kl_beta, a.clip_ratio_c) == (
        "seq-mean-token-sum", 0.2, 0.28, 0.001, 3.0)
    assert a.aliases == {"--loss_agg_mode": "loss_agg", "--clip_ratio_low": "clip_low",
                         "--clip_ratio_high": "clip_high", "--kl_loss_coef": "kl_beta"}


def test_bad_alias_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        parse("--scale_rewards", "maybe")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "maybe" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        parse("--loss_agg_mode", "seq-max")  # verl names map onto our choices, which argparse checks


# ----------------------------------------------------------------- --config FILE.yaml


def test_config_file_like_trl(tmp_path):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("loss_type: dr_grpo\nscale_rewards: false\nepsilon: 0.2\nepsilon-high: 0.28\nbeta: 0.0\n"
                   "max_completion_length: 128\ntop_entropy_quantile: 0.2\nkl_beta: 0.01\nfigures: false\n"
                   "mask_truncated_completions: true\nseed: 7\n")
    a = parse("--config", str(cfg), "--seed", "3", "--rho", "0.1")
    assert (a.loss_type, a.advantage, a.clip_low, a.clip_high, a.max_completion_length) == (
        "dr_grpo", "none", 0.2, 0.28, 128)
    assert a.kl_beta == 0.01  # the file's later key wins inside the file, like a command line
    assert a.figures is False and a.mask_truncated_completions is True
    assert a.seed == 3 and a.rho == 0.1  # the command line overrides the file
    assert a.config == str(cfg)
    assert a.aliases == {"grpo.yaml: scale_rewards": "advantage", "grpo.yaml: epsilon": "clip_low",
                         "grpo.yaml: epsilon-high": "clip_high", "grpo.yaml: beta": "kl_beta",
                         "grpo.yaml: top_entropy_quantile": "rho", "grpo.yaml: loss_type": "loss_type",
                         "grpo.yaml: max_completion_length": "max_completion_length"}


def test_more_trl_and_verl_names():
    a = parse("--use_bias_correction_kl", "false", "--vllm_importance_sampling_mode", "token_truncate",
              "--vllm_importance_sampling_clip_min", "0.5", "--vllm_importance_sampling_clip_max", "2")
    assert (a.kl_bias_correction, a.vllm_is_mode, a.vllm_is_min, a.vllm_is_max) == ("off", "token_truncate", 0.5, 2.0)
    b = parse("--norm_adv_by_std_in_grpo", "false", "--loss_scale_factor", "512")
    assert (b.advantage, b.max_len) == ("none", 512)
    assert b.aliases == {"--norm_adv_by_std_in_grpo": "advantage", "--loss_scale_factor": "max_len"}
    assert parse("--norm_adv_by_std_in_grpo", "true").advantage == "group"


def test_config_file_env_section_like_trl(tmp_path, monkeypatch):
    """TRL's TrlParser sets the variables of an `env` mapping before parsing (trl/scripts/utils.py)."""
    monkeypatch.delenv("GMTS_TEST_ENV_FROM_YAML", raising=False)
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("env:\n  GMTS_TEST_ENV_FROM_YAML: 1\nbeta: 0.0\n")
    a = parse("--config", str(cfg))
    import os

    assert os.environ["GMTS_TEST_ENV_FROM_YAML"] == "1" and a.kl_beta == 0.0
    monkeypatch.delenv("GMTS_TEST_ENV_FROM_YAML", raising=False)


def test_config_file_refusals(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss_type: grpo\nlearning_rate: 1e-6\nper_device_train_batch_size: 8\n")
    with pytest.raises(SystemExit) as e:
        parse("--config", str(bad))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "per_device_train_batch_size" in err and len(err.strip().splitlines()) == 1
    nested = tmp_path / "nested.yaml"
    nested.write_text("actor:\n  clip_ratio_low: 0.2\n")
    with pytest.raises(SystemExit):
        parse("--config", str(nested))
    assert "nested" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("loss_type: [grpo\n")
    with pytest.raises(SystemExit):
        parse("--config", str(broken))
    assert "broken.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--config", str(tmp_path / "missing.yaml"))


def test_probe_records_mapped_settings(tiny_model_dirs, tmp_path):
    """`gmts probe` with a TRL command line and a YAML file: the run uses and records the mapped settings."""
    r = make_rollouts(tmp_path / "r.jsonl")
    cfg = tmp_path / "trl.yaml"
    cfg.write_text("scale_rewards: batch\nloss_agg_mode: seq-mean-token-mean\ntop_entropy_quantile: 0.25\n")
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
               "--device", "cpu", "-q", "--no_figures", "--fidelity", "off", "--grad_norm", "none",
               "--config", str(cfg), "--epsilon", "0.25", "--beta", "0.0"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    c = m["config"]
    assert (c["advantage"], c["loss_agg"], c["rho"], c["clip_low"], c["clip_high"], c["kl_beta"]) == (
        "batch", "seq-mean-token-mean", 0.25, 0.25, 0.25, 0.0)
    assert m["aliases"] == {"trl.yaml: scale_rewards": "advantage", "trl.yaml: loss_agg_mode": "loss_agg",
                            "trl.yaml: top_entropy_quantile": "rho", "--epsilon": "clip_low, clip_high",
                            "--beta": "kl_beta"}
    assert m["config_file"] == str(cfg)
    assert m["n_cut_by_truncate"] == 0 and m["n_unterminated"] is None and "n_truncated" not in m
    # the objective omega was computed under, resolved (what loss_type and the aliases mean)
    assert m["objective"]["loss_agg"] == "seq-mean-token-mean" and m["objective"]["clip_high"] == 0.25
    # the user's rho: recorded in stats.json and added to the fixed grid of top-k fractions
    s = json.loads((out / "stats.json").read_text())
    assert s["meta"]["rho"] == "0.25" and s["meta"]["rhos"] == ["0.05", "0.1", "0.2", "0.25", "0.3", "0.5"]
    assert "0.25" in s["topk_overlap"]["batch"]["entropy"] and "0.2" in s["topk_overlap"]["batch"]["entropy"]


def test_kl_beta_without_ref_logprobs_is_one_error_before_any_work(tiny_model_dirs, tmp_path, capsys):
    r = make_rollouts(tmp_path / "r.jsonl")  # no ref_logprobs
    rc = main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(tmp_path / "o"),
               "--device", "cpu", "-q", "--no-figures", "--grad-norm", "none", "--beta", "0.04"])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("gmts:")]  # not transformers' bar
    assert rc == 2 and len(err) == 1 and "ref_logprobs" in err[0] and "failed and is skipped" not in err[0]


# ----------------------------------------------------------------- --help


def _sub(name: str):
    p = build_parser()
    sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[name]


def test_probe_help_groups_units_defaults():
    text = _sub("probe").format_help()
    for g in ("inputs:", "RL objective:", "gradient engine:", "output:", "run control:"):
        assert g in text
    assert "do not:" not in text
    p = _sub("probe")
    for a in p._actions:
        if a.option_strings and a.help and a.dest not in ("help", "debug") and not a.required:
            assert "default" in a.help, a.option_strings
    assert "--max-memory MiB" in text and "--max-len TOKENS" in text


@pytest.mark.parametrize("name", ["run", "sample", "probe", "merge", "stats", "figures", "compare", "rl",
                                  "rl-report", "toy-train", "bench"])
def test_every_subcommand_help_in_groups_with_defaults(name):
    p = _sub(name)
    groups = {g.title: [a for a in g._group_actions if a.option_strings] for g in p._action_groups}
    assert [a.dest for a in groups.get("options", [])] in (["help"], ["help", "debug"]), name
    assert set(groups) - {"options", "positional arguments"} <= {"inputs", "RL objective", "gradient engine",
                                                                  "output", "run control"}
    for a in p._actions:
        if a.option_strings and a.help and a.dest not in ("help", "debug") and not a.required:
            assert "default" in a.help, (name, a.option_strings)


def test_run_domains_space_or_comma_separated():
    p = build_parser()
    a = p.parse_args(["run", "--domains", "arithmetic", "program"])
    b = p.parse_args(["run", "--domains", "arithmetic,program"])
    flat = lambda x: [d for s in x for d in s.split(",")]  # noqa: E731
    assert flat(a.domains) == flat(b.domains) == ["arithmetic", "program"]


def test_one_name_per_concept_across_subcommands():
    for name in ("run", "sample", "probe", "merge", "stats", "figures", "rl", "rl-report", "toy-train", "bench"):
        text = _sub(name).format_help()
        assert "-q, --quiet" in text, name
        assert "do not:" not in text, name
    for name in ("run", "sample", "rl"):
        opts = _sub(name)._option_string_actions
        assert "--model" in opts and "--domains" in opts, name
    assert "--policy" not in _sub("run").format_help()  # old name: a hidden alias only
    assert "MiB" in _sub("bench")._option_string_actions["--max-memory"].help


# ----------------------------------------------------------------- hub downloads


def test_offline_hub_id_is_one_clear_line(monkeypatch):
    from gmts_analysis.readers.models import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GmtsError) as e:
        load_model("gmts-nobody/does-not-exist-0", device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE=1" in msg and "gmts-nobody/does-not-exist-0" in msg


def test_hub_id_may_download_unless_offline(monkeypatch, tiny_model_dirs):
    """Without HF_HUB_OFFLINE a hub id is loaded with local_files_only=False (mocked: no network)."""
    import transformers

    from gmts_analysis.readers.models import load_model

    real = transformers.AutoModelForCausalLM.from_pretrained
    calls = []

    def fake_model(name, **kw):
        calls.append(("model", name, kw.get("local_files_only")))
        kw["local_files_only"] = True
        return real(str(tiny_model_dirs["qwen2"]), **kw)

    def fake_tok(name, **kw):
        calls.append(("tokenizer", name, kw.get("local_files_only")))
        raise OSError("no tokenizer")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    import gmts_analysis.readers.models as models

    # a hub id missing from the cache, with the hub reachable (mocked: the test itself has no network)
    monkeypatch.setattr(models, "hub_cached", lambda path: False)
    monkeypatch.setattr(models, "hub_reachable", lambda: True)
    model, tok = load_model("Qwen/Qwen2.5-Math-1.5B", device="cpu")
    assert tok is None and calls == [("model", "Qwen/Qwen2.5-Math-1.5B", False),
                                     ("tokenizer", "Qwen/Qwen2.5-Math-1.5B", False)]
    calls.clear()
    load_model("Qwen/Qwen2.5-Math-1.5B", device="cpu", offline=True)
    assert [c[2] for c in calls] == [True, True]
    calls.clear()
    load_model(str(tiny_model_dirs["qwen2"]), device="cpu")  # a local directory never downloads
    assert [c[2] for c in calls] == [True, True]
    calls.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load_model("Qwen/Qwen2.5-Math-1.5B", device="cpu")
    assert [c[2] for c in calls] == [True, True]


def test_offline_flag_parses():
    assert parse("--offline").offline is True and parse().offline is False


@pytest.mark.parametrize("argv", [
    ["sample", "--domains", "arithmetic", "--out", "{tmp}/r.jsonl", "-q"],
    ["run", "--out", "{tmp}/run", "--num-prompts", "1", "--group-size", "2", "-q", "--no-figures"],
    ["rl", "--selection", "all", "--seed", "0", "--max-steps", "1", "--out", "{tmp}/rl.json", "--figures", "none",
     "-q"],
])
@pytest.mark.parametrize("offline", [True, False])
def test_offline_on_every_command_that_loads_a_hub_model(argv, offline, tmp_path, monkeypatch, capsys):
    """`--offline` means the same in gmts sample, run and rl as in probe: load_model(..., offline=True)."""
    import gmts_analysis.readers.models as models

    seen = []

    def fake_load(name, device="auto", dtype="float32", offline=False):
        seen.append((name, offline))
        raise GmtsError("stop here")

    monkeypatch.setattr(models, "load_model", fake_load)
    name = argv[0]
    assert "--offline" in _sub(name)._option_string_actions
    group = next(g.title for g in _sub(name)._action_groups
                 if any("--offline" in a.option_strings for a in g._group_actions))
    assert group == "inputs", name  # the group probe has it in
    args = [x.replace("{tmp}", str(tmp_path)) for x in argv] + ["--model", "Qwen/Qwen2.5-Math-1.5B"]
    rc = main(args + (["--offline"] if offline else []))
    assert rc == 2 and "stop here" in capsys.readouterr().err
    assert seen == [("Qwen/Qwen2.5-Math-1.5B", offline)], name


def test_device_defaults_to_auto_everywhere():
    for name in ("run", "sample", "probe", "rl", "bench", "merge"):
        a = _sub(name)._option_string_actions["--device"]
        assert a.default == "auto" and "default: auto" in a.help, name
        if name in ("run", "sample", "probe", "rl"):
            assert "cuda if available, else cpu" in a.help, name


def test_max_steps_counts_training_steps(capsys):
    """`--max-steps` (TRL's max_steps) counts training steps in gmts rl and toy-train; the names of gmts
    before 0.2 (`--steps`, `--policy`) are gone (`--domain` is only argparse's prefix of `--domains`);
    `gmts probe --steps` keeps selecting logged steps."""
    p = build_parser()
    for cmd in (["rl"], ["toy-train", "--size", "tiny"]):
        assert p.parse_args([*cmd, "--max-steps", "7"]).max_steps == 7
        assert p.parse_args([*cmd, "--max_steps", "7"]).max_steps == 7
        assert capsys.readouterr().err == ""
        with pytest.raises(SystemExit):
            p.parse_args([*cmd, "--steps", "5"])
        assert "unrecognized arguments: --steps 5" in capsys.readouterr().err, cmd
        text = _sub(cmd[0]).format_help()
        assert "--steps" not in text, cmd
    for argv in (["rl", "--policy", "tiny"], ["run", "--policy", "tiny"]):
        with pytest.raises(SystemExit):
            p.parse_args(argv)
        assert "unrecognized arguments" in capsys.readouterr().err, argv
    assert p.parse_args(["rl"]).max_steps == 100 and p.parse_args(["toy-train", "--size", "tiny"]).max_steps is None
    a = parse("--steps", "10-20")
    assert a.steps == "10-20" and not getattr(a, "aliases", None) and capsys.readouterr().err == ""


def test_manifest_truncation_counts_are_named_apart():
    """n_cut_by_truncate: answers --truncate cut to the context; n_unterminated: answers without a stop token
    (TRL's truncated completions), counted only with --mask-truncated-completions."""
    from types import SimpleNamespace

    from gmts_analysis.probing.inputs import truncation_counts

    ans = [SimpleNamespace(extra={"unterminated": True}), SimpleNamespace(extra={"unterminated": False}),
           SimpleNamespace(extra={})]
    assert truncation_counts(True, ans, 2) == {
        "n_cut_by_truncate": 2, "n_unterminated": 1}
    assert truncation_counts(False, ans, 0) == {
        "n_cut_by_truncate": 0, "n_unterminated": None}


# ----------------------------------------------------------------- verl's aggregation modes


def test_token_sum_and_seq_mean_token_sum_weights():
    from gmts_analysis.core.advantages import loss_weights
    from gmts_analysis.core.selection_tensor import aggregate_loss

    lengths = [3, 5, 2, 7]
    assert loss_weights(lengths, "token-sum").tolist() == [1.0] * 4
    assert loss_weights(lengths, "seq-mean-token-sum").tolist() == pytest.approx([0.25] * 4)
    # two batches (steps): N counts the answers of each batch
    w = loss_weights(lengths, "seq-mean-token-sum", steps=[0, 0, 0, 1])
    assert w.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    # the tensor loss aggregates with the same weights as verl's agg_loss does
    g = torch.Generator().manual_seed(0)
    T = max(lengths)
    loss = torch.randn(4, T, generator=g, dtype=torch.float64)
    mask = torch.zeros(4, T, dtype=torch.float64)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    verl = {"token-sum": (loss * mask).sum(), "seq-mean-token-sum": (loss * mask).sum(-1).mean()}
    for mode, ref in verl.items():
        got = aggregate_loss(loss, mask, loss_agg=mode)
        wts = loss_weights(lengths, mode)
        explicit = sum(wts[i] * (loss[i] * mask[i]).sum() for i in range(4))
        assert float(got) == pytest.approx(float(ref), rel=1e-12)
        assert float(explicit) == pytest.approx(float(ref), rel=1e-12)


def test_mask_truncated_completions_weights():
    """TRL: truncated answers leave the loss and the token count; N (answers) is unchanged."""
    from gmts_analysis.core.advantages import loss_weights

    lengths = [3, 5, 2, 7]
    trunc = [False, True, False, False]
    w = loss_weights(lengths, "token-mean", truncated=trunc)
    assert w.tolist() == pytest.approx([1 / 12, 0.0, 1 / 12, 1 / 12])
    w = loss_weights(lengths, "seq-mean-token-mean", truncated=trunc)
    assert w.tolist() == pytest.approx([1 / 12, 0.0, 1 / 8, 1 / 28])
    w = loss_weights(lengths, "seq-mean-token-sum-norm", truncated=trunc, max_len=10)
    assert w.tolist() == pytest.approx([1 / 40, 0.0, 1 / 40, 1 / 40])


def test_alias_table_documented():
    from pathlib import Path

    from gmts_analysis.options import ALIASES

    doc = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    for a in ALIASES:
        assert re.search(rf"`--{a.name}`", doc), a.name


def test_api_takes_trl_names():
    from gmts_analysis.options.config import options_from_kwargs

    o = options_from_kwargs(dict(epsilon=0.3, scale_rewards=True, top_entropy_quantile=0.1, kl_loss_coef=0.02))
    assert (o.clip_low, o.clip_high, o.advantage, o.rho, o.kl_beta) == (0.3, 0.3, "group", 0.1, 0.02)
    assert options_from_kwargs(dict(epsilon=0.3, epsilon_high=0.4)).clip_high == 0.4
    with pytest.raises(GmtsError, match="same setting"):
        options_from_kwargs(dict(beta=0.1, kl_beta=0.2))
    with pytest.raises(GmtsError, match="scale_rewards"):
        options_from_kwargs(dict(scale_rewards="sometimes"))


def test_mark_unterminated_as_trl():
    """TRL: a completion is truncated when its last id is neither an EOS id nor the pad id."""
    from types import SimpleNamespace

    from gmts_analysis.options.config import ProbeOptions
    from gmts_analysis.probing.kernel import answer_coefficients, mark_unterminated
    from gmts_analysis.probing.settings import KernelSettings
    from gmts_analysis.readers.rollouts import Answer

    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7], pad_token_id=None))
    ans = [Answer(answer_id=i, group_id="g", prompt_ids=[1], response_ids=r, reward=float(i % 2))
           for i, r in enumerate([[5, 6, 2], [5, 6, 9], [5, 7], [4, 0], [8, 8, 8, 8]])]
    assert mark_unterminated(ans, tok, model) == 2
    assert [a.extra["unterminated"] for a in ans] == [False, True, False, False, True]
    opts = ProbeOptions(mask_truncated_completions=True)
    w = [c.loss_weight for c in answer_coefficients(ans, KernelSettings.of(opts))]
    assert w == pytest.approx([1 / 7, 0.0, 1 / 7, 1 / 7, 0.0])  # token-mean over the 7 kept tokens
    with pytest.raises(GmtsError, match="no EOS"):
        mark_unterminated(ans, SimpleNamespace(), None)


def test_figures_report_max_answers(tmp_path):
    """The report's note on answers it leaves out names a command that exists."""
    from _synthetic import make_run_dir

    run = make_run_dir(tmp_path / "run", n_groups=3, figures=False, report=False, n_boot=0)
    assert main(["figures", str(run), "--report", "--max-answers", "5", "-q"]) == 0
    text = (run / "report.html").read_text(encoding="utf-8")
    assert len(re.findall(r'<div class="answer" ', text)) == 5
    assert "gmts figures RUN_DIR --report --max-answers N" in text
    assert main(["figures", str(run), "--report", "--max-answers", "0"]) == 2
