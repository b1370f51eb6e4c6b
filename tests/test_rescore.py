"""Re-scoring a run without probing again (issue #28; SPEC section 6, ``meta.rescored_from``): new rewards or
truncated answers masked give the tables and statistics a probe with those rewards gives, without a model."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import make_rollouts

import gmts_analysis as gmts
from gmts_analysis.errors import GmtsError

FAST = {"fidelity": "off", "device": "cpu"}
COLS = ["advantage", "loss_weight", "omega", "grad_norm", "gmts", "reward", "entropy_inf", "abs_omega", "gmts_lgn"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from gmts_analysis.toy.testing import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("m") / "llama", seed=5)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = make_rollouts(tmp_path_factory.mktemp("r") / "r.jsonl", n_groups=4, group_size=3, seed=9)
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(llama, rows, tmp_path_factory):
    r = gmts.probe(str(llama), rows, progress=False, **FAST)
    r.save(tmp_path_factory.mktemp("run") / "run", figures=False)
    return r


def _new_rewards(rows):
    rng = np.random.default_rng(4)
    return {str(r["answer_id"]): float(rng.integers(0, 2)) for r in rows}


def test_rescored_rewards_equal_a_probe_with_those_rewards(llama, rows, run, tmp_path):
    new = _new_rewards(rows)
    f = tmp_path / "rewards.jsonl"
    f.write_text("".join(json.dumps({"answer_id": k, "reward": v}) + "\n" for k, v in new.items()))
    again = gmts.probe(str(llama), [{**r, "reward": new[str(r["answer_id"])]} for r in rows], progress=False, **FAST)
    got = run.rescore(rewards=f, n_boot=50)
    for c in COLS:
        np.testing.assert_allclose(got.tokens[c].to_numpy(float), again.tokens[c].to_numpy(float), rtol=1e-12,
                                   atol=1e-15, err_msg=c)
    np.testing.assert_array_equal(got.tokens["grad_norm_logp"], run.tokens["grad_norm_logp"])  # not probed again
    assert got.stats["zero_advantage"] == again.stats["zero_advantage"]
    assert got.stats["meta"]["rescored_from"]["rewards"].startswith(f"file {f}")
    assert got.manifest["rescored_from"] == got.stats["meta"]["rescored_from"]
    assert got.stats["meta"]["rescored_from"]["run_hash"] and got.manifest["run_hash"] != run.manifest.get("run_hash")


def test_rescoring_with_the_same_rewards_changes_nothing(run, rows, tmp_path):
    f = tmp_path / "same.csv"
    pd.DataFrame({"answer_id": [str(r["answer_id"]) for r in rows], "reward": [r["reward"] for r in rows]}).to_csv(f, index=False)
    got = run.rescore(rewards=f, n_boot=0)
    for c in COLS:
        np.testing.assert_array_equal(got.tokens[c].to_numpy(float), run.tokens[c].to_numpy(float), err_msg=c)


def test_mask_truncated_completions_zeroes_their_weight(run):
    r = gmts.load_run(run.path)
    r.answers["truncated"] = [i % 4 == 0 for i in range(len(r.answers))]
    got = r.rescore(mask_truncated_completions=True, n_boot=0)
    cut = set(r.answers.loc[r.answers["truncated"], "answer_id"])
    tok = got.tokens
    assert (tok.loc[tok["answer_id"].isin(cut), ["loss_weight", "omega", "grad_norm"]] == 0).all().all()
    kept = tok.loc[~tok["answer_id"].isin(cut)]
    assert (kept["loss_weight"] > 0).all()  # token-mean over the kept answers' tokens only (TRL)
    assert kept["loss_weight"].iloc[0] == pytest.approx(1.0 / len(kept))


@pytest.mark.parametrize("body, needle", [
    ("", "no reward for"),
    ('{"answer_id": "0-0", "reward": 1}\n{"answer_id": "0-0", "reward": 1}\n', "given twice"),
    ('{"answer_id": "0-0", "reward": NaN}\n', "not a finite number"),
    ('{"answer_id": "0-0", "reward": "1"}\n', "not a finite number"),
    ('{"answer_id": "0-0", "reward": true}\n', "not a finite number"),
    ('not json\n', "line 1: invalid JSON"),
    ('{"answer_id": "zz", "reward": 1}\n', "no reward for"),
])
def test_bad_reward_files_are_refused_by_line(run, tmp_path, body, needle):
    f = tmp_path / "r.jsonl"
    f.write_text(body)
    with pytest.raises(GmtsError, match=needle):
        run.rescore(rewards=f, n_boot=0)


def test_gmts_stats_rescore_cli_writes_a_new_run_and_never_touches_the_source(run, tmp_path):
    src = run.path
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    rewards = tmp_path / "r.jsonl"
    rewards.write_text("".join(json.dumps({"answer_id": str(a), "reward": float(i % 2)}) + "\n"
                               for i, a in enumerate(run.answers["answer_id"])))
    out = tmp_path / "new"
    cmd = [sys.executable, "-m", "gmts_analysis", "stats", str(src), "--rewards", str(rewards), "--out", str(out),
           "--no-figures", "--n-boot", "20", "--threads", "1", "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads((out / "manifest.json").read_text())
    st = json.loads((out / "stats.json").read_text())
    assert m["rescored_from"]["run"] == str(src) and st["meta"]["rescored_from"] == m["rescored_from"]
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before
    # the source as --out, a missing --out, and two reward sources: one line each, exit 2
    for extra, needle in ((["--out", str(src)], "is the source run"), ([], "give --out"),
                          (["--out", str(tmp_path / "x"), "--verifier", "math"], "not both")):
        q = subprocess.run([sys.executable, "-m", "gmts_analysis", "stats", str(src), "--rewards", str(rewards), *extra],
                           capture_output=True, text=True)
        assert q.returncode == 2 and needle in q.stderr and "Traceback" not in q.stderr, q.stderr


def test_one_group_gives_no_interval_and_no_verdict(llama, rows):
    from gmts_analysis.analysis.summary import summary_text

    one = [r for r in rows if r["group_id"] == rows[0]["group_id"]]
    r = gmts.probe(str(llama), [{**x, "reward": float(i)} for i, x in enumerate(one)], progress=False, **FAST)
    st = r.stats
    assert st["meta"]["min_groups"] == 10 and st["zero_advantage"]["informative_units"] == 1
    assert st["cross_answer"]["entropy"]["ci_low"] is None  # no interval below min_groups
    for block in st["paired_difference"].values():
        for per in block.values():
            assert all(v["ci_low"] is None for v in per.values())
    text = summary_text(st)
    assert "Too small to compare" in text and " beats " not in text and "[" not in text.split("\n\n", 1)[1]


def test_a_probe_at_another_temperature_than_the_sampling_is_warned(llama, rows, caplog):
    """gmts sample records each answer's sampling temperature; TRL's loss uses it, so a probe at another
    temperature measures another policy and says so (the SmolLM2 study's plan once missed it)."""
    hot = [{**r, "temperature": 0.7} for r in rows[:3]]
    with caplog.at_level("WARNING"):
        gmts.probe(str(llama), hot, progress=False, temperature=1.0, **FAST)
    assert "sampled at temperature 0.7" in caplog.text and "--temperature 0.7" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        gmts.probe(str(llama), hot, progress=False, temperature=0.7, **FAST)
    assert "sampled at temperature" not in caplog.text


def test_a_reward_for_an_answer_the_run_does_not_have_is_refused(run, rows, tmp_path):
    f = tmp_path / "extra.jsonl"
    f.write_text("".join(json.dumps({"answer_id": str(r["answer_id"]), "reward": 1.0}) + "\n" for r in rows)
                 + json.dumps({"answer_id": "not-in-run", "reward": 0.0}) + "\n")
    with pytest.raises(GmtsError, match="'not-in-run' is not in the run"):
        run.rescore(rewards=f, n_boot=0)


def test_a_copied_example_is_kept_whoever_scores_the_answers(run, rows, tmp_path):
    """copies_example is a fact of an answer and its prompt, not of the verifier: re-scoring with a verifier
    that cannot see the prompt's messages, or with a rewards file, keeps the recorded flags (and the audit's
    share), where it used to drop them (the SmolLM2 study's `math` sensitivity run lost its 1.6%)."""
    copies = [i % 5 == 0 for i in range(len(run.answers))]
    texts = ["3 + 4 = 7. \\boxed{7}"] * len(copies)  # text prompts: the verifier cannot tell a copy
    marked = gmts.Run(tokens=run.tokens, answers=run.answers.assign(copies_example=copies, response=texts,
                                                                    prompt="What is 3 + 4?", solution="7"),
                      stats=run.stats, manifest=run.manifest)
    want = float(np.mean(copies))
    by_verifier = marked.rescore(verifier="math_boxed", n_boot=0)
    assert by_verifier.answers["copies_example"].tolist() == copies
    assert by_verifier.stats["reward_audit"]["copies_prompt_example_share"] == pytest.approx(want)
    f = tmp_path / "r.csv"
    pd.DataFrame({"answer_id": [str(r["answer_id"]) for r in rows], "reward": [r["reward"] for r in rows]}).to_csv(f, index=False)
    by_file = marked.rescore(rewards=f, n_boot=0)
    assert by_file.stats["reward_audit"]["copies_prompt_example_share"] == pytest.approx(want)


def test_rescoring_records_final_answers_and_a_rewards_file_drops_them(run, rows, tmp_path):
    """A verifier's re-scoring records each answer's ``final_answer`` (never handed to the verifier as a column)
    and the audit's modal answer shares; a rewards file has no verifier, so the old extraction goes."""
    n = len(run.answers)
    texts = ["So \\boxed{8}" if i % 10 < 7 else f"So \\boxed{{{i}}}" for i in range(n)]
    sols = [str(i) for i in range(n)]
    marked = gmts.Run(tokens=run.tokens, answers=run.answers.assign(response=texts, prompt="How many?", solution=sols),
                      stats=run.stats, manifest=run.manifest)
    by_verifier = marked.rescore(verifier="math_boxed", n_boot=0)
    assert by_verifier.answers["final_answer"].tolist() == [t[len("So \\boxed{"):-1] for t in texts]
    audit = by_verifier.stats["reward_audit"]
    share = sum(t == "So \\boxed{8}" for t in texts) / n
    assert audit["modal_answer"] == "8" and audit["modal_answer_share"] == pytest.approx(share)
    assert audit["modal_solution_share"] == pytest.approx(1 / n)
    v = tmp_path / "strict.py"  # final_answer is the run's own column, never a verifier's input
    v.write_text("def f(prompts, completions, **kw):\n    assert 'final_answer' not in kw and 'solution' in kw\n"
                 "    return [0.0] * len(prompts)\n")
    assert by_verifier.rescore(verifier=f"{v}:f", n_boot=0).stats["reward_audit"]["positive_share"] == 0.0
    f = tmp_path / "r.csv"
    pd.DataFrame({"answer_id": [str(r["answer_id"]) for r in rows], "reward": [r["reward"] for r in rows]}).to_csv(f, index=False)
    by_file = by_verifier.rescore(rewards=f, n_boot=0)
    assert "final_answer" not in by_file.answers.columns and by_file.stats["reward_audit"]["modal_answer"] is None


def test_the_rollouts_file_a_probe_named_is_read_when_unchanged(run, rows, tmp_path):
    """A run made by `gmts probe --rollouts FILE` has no rollouts.jsonl of its own: re-scoring reads the file its
    manifest names (as given, or relative to the run) when its sha256 is the recorded one, never a changed file."""
    from gmts_analysis.analysis.runs import RunTables
    from gmts_analysis.run.rescore import _rollouts_file
    from gmts_analysis.util.io import file_sha256

    d = tmp_path / "study"
    (d / "run").mkdir(parents=True)
    src = d / "rollouts.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = {"path": "../rollouts.jsonl", "sha256": file_sha256(src)}
    tables = RunTables(tokens=run.tokens, answers=run.answers, stats={}, manifest={"rollouts": rec}, path=d / "run")
    assert _rollouts_file(tables) == d / "run" / "../rollouts.jsonl"
    src.write_text(src.read_text() + "\n")  # changed since the probe: not the run's file
    assert _rollouts_file(tables) is None
