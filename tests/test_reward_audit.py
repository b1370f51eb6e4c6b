"""Rewards a referee can trust (issue #28): the boxed-only verifier, worked examples that never share the
answer asked for, the per-answer audit facts and stats.json's ``reward_audit`` (SPEC section 6, version 4)."""

import math

import numpy as np
import pandas as pd
import pytest

from gmts_analysis.analysis.reward_audit import audit_sentence, reward_audit
from gmts_analysis.readers.audit import audit_fields, copies_example, last_boxed
from gmts_analysis.sampling import wordproblems as wp

pytest.importorskip("math_verify")

PROMPT = [{"role": "user", "content": "Kim has 4 books ..."}, {"role": "assistant", "content": "4 + 3 = 7. 7 - 2 = 5. \\boxed{5}"},
          {"role": "user", "content": "Ben has 2 apples and buys 3 more. How many?"}]


def test_last_boxed_takes_the_last_complete_box_with_nested_braces():
    assert last_boxed("x \\boxed{6} then \\boxed{\\frac{10}{2}}") == "\\frac{10}{2}"
    assert last_boxed("7 - 2 = 5.") is None
    assert last_boxed("\\boxed{5") is None  # unclosed: no answer
    assert last_boxed("a \\boxed {12} b") == "12"


def test_math_boxed_never_scores_an_unboxed_answer_that_math_scores_by_its_fallback():
    from gmts_analysis.readers.verifiers import math_boxed_reward, math_reward, resolve_verifier, verifier_name

    comps = ["2 + 3 = 5. \\boxed{5}", "2 + 3 = 5.", "The answer is 5", "\\boxed{6} no, \\boxed{5}", "\\boxed{4}"]
    sol = ["5"] * len(comps)
    p = ["q"] * len(comps)
    assert math_reward(p, comps, sol)[:3] == [1.0, 1.0, 1.0]  # the fallback scores unboxed text
    assert math_boxed_reward(p, comps, sol) == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert resolve_verifier("math_boxed") is math_boxed_reward
    assert verifier_name(math_boxed_reward) == "math_boxed" and verifier_name(math_reward) == "math"


def test_audit_fields_flag_boxed_fallback_and_copied_examples():
    from gmts_analysis.readers.audit import AUDIT_FIELDS

    comps = [[{"role": "assistant", "content": "Sure: 4 + 3 = 7. 7 - 2 = 5. \\boxed{5}"}],
             [{"role": "assistant", "content": "2 + 3 = 5"}],
             [{"role": "assistant", "content": "2 + 3 = 5. \\boxed{5}"}]]
    got = audit_fields("math", [PROMPT] * 3, comps)
    assert [tuple(g) for g in got] == [AUDIT_FIELDS] * 3
    assert [g["boxed"] for g in got] == [True, False, True]
    assert [g["fallback"] for g in got] == [False, True, False]
    assert [g["copies_example"] for g in got] == [True, False, False]
    assert all(g["fallback"] is False for g in audit_fields("math_boxed", [PROMPT] * 3, comps))
    # a verifier whose rule is unknown: the fallback is not guessed; a text prompt has no worked example
    assert audit_fields("arithmetic", ["text"], ["x"])[0] == {"verifier": "arithmetic", "boxed": False,
                                                               "fallback": None, "copies_example": None}
    assert copies_example("text prompt", "4 + 3 = 7") is None


def test_reward_audit_shares_and_nulls():
    ans = pd.DataFrame({"answer_id": list("abcd"), "reward": [1.0, 0.0, 1.0, 0.0],
                        "truncated": [False, True, True, False], "verifier": ["math"] * 4,
                        "boxed": [True, False, False, True], "fallback": [False, True, True, False],
                        "copies_example": [False, False, True, False]})
    a = reward_audit(ans)
    assert a["n_answers"] == 4 and a["verifier"] == "math"
    assert a["truncated_share"] == 0.5 and a["boxed_share"] == 0.5 and a["fallback_share"] == 0.5
    assert a["copies_prompt_example_share"] == 0.25 and a["positive_share"] == 0.5
    assert a["fallback_positive_share"] == 0.25 and a["truncated_positive_share"] == 0.25
    bare = reward_audit(ans[["answer_id", "reward"]])
    assert bare["n_answers"] == 4 and all(bare[k] is None for k in
                                          ("verifier", "truncated_share", "boxed_share", "fallback_share",
                                           "copies_prompt_example_share"))  # absent: null, never guessed
    assert audit_sentence(bare) is None  # nothing recorded: no sentence
    s = audit_sentence(a)
    assert "verifier math" in s and "50% truncated" in s and "25% copying a worked example" in s
    assert reward_audit(None, 7)["n_answers"] == 7


def test_worked_examples_never_share_the_answer_asked_for():
    probs = wp.generate(240, seed=11)
    assert len({p.text for p in probs}) == 240  # no problem repeats
    answers = {a for _, _, a in wp.EXAMPLES}
    assert {p.answer for p in probs} & answers  # the premise: some problems have an example's answer
    for p in probs:
        shown = wp.examples_for(p)
        assert len(shown) == wp.N_EXAMPLES
        assert all(f"\\boxed{{{p.answer}}}" not in a for _, a in shown)
        msgs = wp.prompt_messages(p)
        assert len(msgs) == 2 * wp.N_EXAMPLES + 1 and msgs[-1]["content"].startswith(p.text)
    with pytest.raises(Exception, match="n_examples"):
        wp.examples_for(probs[0], len(wp.EXAMPLES))


def test_matched_examples_have_the_problems_number_of_steps_and_never_its_answer():
    probs = wp.generate(240, seed=11)
    assert {p.answer for p in probs if p.difficulty == 1} & {a for _, _, a in wp.ONE_STEP_EXAMPLES}
    for p in probs:
        shown = wp.examples_for(p, matched=True)
        assert len(shown) == wp.N_EXAMPLES
        assert all(f"\\boxed{{{p.answer}}}" not in a for _, a in shown)
        # a worked answer's steps are its "=" signs: one before a one-step problem, two before a two-step one
        assert all(a.count("=") == p.difficulty for _, a in shown), (p, shown)
        assert wp.prompt_messages(p, matched=True)[-1] == wp.prompt_messages(p)[-1]  # the problem is unchanged
    assert all(a.count("=") == 2 for p in probs for _, a in wp.examples_for(p))  # the default stays two-step


def test_stats_json_has_the_reward_audit_of_its_answers():
    from _synthetic import make_tables

    from gmts_analysis.analysis.stats import compute_stats

    tokens, answers = make_tables(n_groups=4, group_size=3, seed=2)
    answers = answers.copy()
    answers["truncated"] = [i % 3 == 0 for i in range(len(answers))]
    st = compute_stats(tokens, answers, n_boot=0)
    assert st["reward_audit"]["truncated_share"] == pytest.approx(np.mean(answers["truncated"]))
    assert st["meta"]["version"] == 4 and st["meta"]["min_groups"] == 10 and st["meta"]["rescored_from"] is None
    assert math.isnan(st["cross_answer"]["entropy"]["ci_low"])
