"""#36: the data and the reward of training a real model are documented where a TRL user looks: every built-in
verifier in docs/real_runs.md (``math_boxed`` was left out), the word problems' docstring naming the verifier that
scores them (it said ``math`` where the default is ``math_boxed``), the training set and reward for TRL as a recipe
that runs, and TRL's default ``loss_type`` (``dapo``) that the probe must be given."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REAL_RUNS = ROOT / "docs" / "real_runs.md"


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading...`` section of a markdown text."""
    m = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert m, f"docs/real_runs.md has no section '## {heading}'"
    return m.group(1)


def test_every_builtin_verifier_is_documented():
    from gmts_analysis.readers.verifiers import BUILTIN

    body = _section(REAL_RUNS.read_text(encoding="utf-8"), "Verifiers")
    missing = [name for name in BUILTIN if f"`{name}`" not in body]
    assert not missing, f"docs/real_runs.md, Verifiers: built-in verifiers not named: {missing}"


def test_word_problems_docstring_names_their_verifier():
    import gmts_analysis.sampling.wordproblems as wp
    from gmts_analysis.sampling.domains import WORD_VERIFIER

    doc = wp.__doc__
    assert f"scored by the ``{WORD_VERIFIER}`` verifier" in doc
    assert "verifiers.math_boxed_reward" in doc
    assert "scored by the ``math`` verifier" not in doc
    assert "``math`` verifier" not in wp.word_problems.__doc__


def test_training_data_and_reward_for_trl_are_documented_and_run():
    text = REAL_RUNS.read_text(encoding="utf-8")
    body = _section(text, "Training a real model with token selection (TRL)")
    for name in ("examples/trl_grpo_word_problems.py", "word_problem_splits", "trl_dataset", "word_problem_reward",
                 "math_boxed_reward", "trainable_checkpoint", "SelectiveGRPOTrainer"):
        assert name in body, name
    assert (ROOT / "examples" / "trl_grpo_word_problems.py").is_file()
    if importlib.util.find_spec("datasets") is None or importlib.util.find_spec("math_verify") is None:
        pytest.skip("the recipe needs datasets and math-verify (pip install -e '.[trl,math]')")
    recipe = re.findall(r"```python\n(.*?)```", body, flags=re.S)[0]
    ns: dict = {}
    exec(compile(recipe, f"{REAL_RUNS}: the recipe", "exec"), ns)  # the documented lines, as written
    ds, reward = ns["train_dataset"], ns["reward"]
    assert len(ds) == 1000 and len(ns["heldout_rows"]) == 200 and {"prompt", "solution"} <= set(ds.column_names)
    row = ds[0]
    right = [{"role": "assistant", "content": f"so \\boxed{{{row['solution']}}}"}]
    unboxed = [{"role": "assistant", "content": f"so {row['solution']}"}]
    assert reward.__name__ == "math_boxed"
    assert reward(prompts=[row["prompt"]] * 2, completions=[right, unboxed], solution=[row["solution"]] * 2) == [1.0, 0.0]


def test_trained_loss_type_is_documented():
    body = _section(REAL_RUNS.read_text(encoding="utf-8"), "The loss that was trained")
    assert "default `loss_type` is `dapo`" in body and "`--loss_type dapo`" in body
    assert "training_args.bin" in body and "gmts series" in body
    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs trl to check TRL's default")
    import dataclasses

    import trl
    from trl import GRPOConfig

    default = next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == "loss_type")
    if not trl.__version__.startswith("1.16"):
        pytest.skip(f"the docs describe TRL 1.16, installed {trl.__version__}")
    assert default == "dapo"


def test_training_real_says_what_real_runs_says_of_a_run_folder():
    """docs/training_real.md agrees with docs/real_runs.md (issue 46): nothing in a run folder is unpickled (the
    JSON arguments first, training_args.bin only by the restricted reader), and a series' step folder is a run
    directory without figures, not a "full run directory"."""
    text = " ".join((ROOT / "docs" / "training_real.md").read_text(encoding="utf-8").split())
    assert "full run director" not in text
    assert "instead of unpickling" not in text
    assert "real_runs.md#what-is-read-from-a-run-folder-and-how" in text
    assert "run directory without figures" in text and "nothing in the file is unpickled" in text
    assert "`n_unscorable`" in text
    heads = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
             for h in re.findall(r"^#+ (.*)$", REAL_RUNS.read_text(encoding="utf-8"), flags=re.M)}
    for anchor in re.findall(r"real_runs\.md#([\w-]+)", text):
        assert anchor in heads, anchor
