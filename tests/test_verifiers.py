"""Verifiers: TRL-shaped reward functions resolved by --verifier, called with keywords."""

from __future__ import annotations

import math

import pytest

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.verifiers import math_reward, resolve_verifier, score


def test_toy_verifiers_keep_working():
    f = resolve_verifier("arithmetic")
    assert f.__name__ == "arithmetic_reward"
    assert resolve_verifier("domain").__name__ == "toy_reward"
    assert resolve_verifier(None) is None
    with pytest.raises(GmtsError, match="unknown verifier 'nope'"):
        resolve_verifier("nope")


def test_module_function_and_file(tmp_path):
    p = tmp_path / "rw.py"
    p.write_text(
        "def reward(prompts, completions, completion_ids, solution, **kw):\n"
        "    return [None if s is None else float(c.strip() == s) for c, s in zip(completions, solution)]\n"
    )
    f = resolve_verifier(f"{p}:reward")
    vals = score(f, ["a", "b", "c"], ["1", "2", "3"], [[1], [2], [3]], {"solution": ["1", "x", None]})
    assert vals[:2] == [1.0, 0.0] and math.isnan(vals[2])
    assert resolve_verifier("gmts_analysis.readers.verifiers:math_reward") is math_reward
    with pytest.raises(GmtsError, match="has no 'missing'"):
        resolve_verifier("gmts_analysis.readers.verifiers:missing")
    with pytest.raises(GmtsError, match="cannot import module"):
        resolve_verifier("no_such_module_xyz:f")
    with pytest.raises(GmtsError, match="no such file"):
        resolve_verifier(f"{tmp_path}/none.py:f")


def test_called_with_keywords_as_trl_does():
    seen = {}

    def f(*, prompts, completions, completion_ids, **columns):  # keyword-only: positional calls fail
        seen.update(columns)
        return [0.5] * len(prompts)

    assert score(f, ["p"], ["c"], [[7]], {"solution": ["s"], "extra": [1]}) == [0.5]
    assert seen == {"solution": ["s"], "extra": [1]}


def test_bad_outputs_are_refused():
    with pytest.raises(GmtsError, match="returned 1 rewards for 2"):
        score(lambda **k: [1.0], ["a", "b"], ["x", "y"], [[1], [2]])
    with pytest.raises(GmtsError, match="not a number"):
        score(lambda **k: ["high"], ["a"], ["x"], [[1]])
    with pytest.raises(GmtsError, match="failed"):
        score(lambda **k: 1 / 0, ["a"], ["x"], [[1]])


def test_math_verifier():
    pytest.importorskip("math_verify")  # optional extra: pip install 'gmts_analysis[math]'
    comps = ["so the answer is \\boxed{\\frac{1}{2}}", "The answer is 72.", [{"role": "assistant", "content": "$4$"}],
             "I think 5", "whatever"]
    sol = ["0.5", "Natalia sold 48/2 = 24 clips in May. #### 72", "\\boxed{3}", "5", ""]
    out = math_reward(prompts=["q"] * 5, completions=comps, completion_ids=[[1]] * 5, solution=sol)
    assert out[:4] == [1.0, 1.0, 0.0, 1.0]
    assert out[4] is None  # unparseable reference: skipped, as TRL's accuracy_reward
    gsm = math_reward(prompts=["q"], completions=["... 18 dollars"], answer=["16 - 3 - 4 = 9 ... #### 18"])
    assert gsm == [1.0]
    with pytest.raises(GmtsError, match="solution"):
        math_reward(prompts=["q"], completions=["1"])


def test_math_verifier_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_math_verify(name, *a, **k):
        if name.startswith("math_verify") or name.startswith("latex2sympy2"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_math_verify)
    with pytest.raises(GmtsError, match=r"pip install 'gmts_analysis\[math\]'"):
        math_reward(prompts=["q"], completions=["1"], solution=["1"])


def test_conversational_completions_passed_as_trl_passes_them():
    """With message-list prompts TRL hands each completion over as one assistant message, so a TRL
    reward function written for conversational data (``completion[0]["content"]``) works as is."""
    def accuracy(*, prompts, completions, **kw):
        return [float(c[0]["content"] == "4") for c in completions]

    msgs = [{"role": "user", "content": "2+2="}]
    assert score(accuracy, [msgs, msgs], ["4", "5"], [[1], [2]]) == [1.0, 0.0]
    assert score(resolve_verifier("math"), [msgs], ["\\boxed{4}"], [[1]], {"solution": ["4"]}) == [1.0]
