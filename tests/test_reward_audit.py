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
                                                               "fallback": None, "copies_example": None,
                                                               "final_answer": None}
    assert copies_example("text prompt", "4 + 3 = 7") is None


def test_final_answer_is_the_answer_the_verifier_scored():
    """``final_answer``: the last box's content (math_boxed), math-verify's extraction with its fallback (math),
    None where there is none (no box under math_boxed, no expression, no text, a verifier of unknown rule)."""
    from gmts_analysis.readers.audit import final_answer

    comps = ["2 + 3 = 5. \\boxed{ 5 }", "2 + 3 = 5.", "\\boxed{6} no, \\boxed{8}", "no number here",
             [{"role": "assistant", "content": "So \\boxed{12}"}]]
    boxed = audit_fields("math_boxed", [PROMPT] * len(comps), comps)
    assert [g["final_answer"] for g in boxed] == ["5", None, "8", None, "12"]
    fallback = audit_fields("math", [PROMPT] * len(comps), comps)
    assert [g["final_answer"] for g in fallback][:2] == ["5", "5"]  # the fallback's answer, not only a box's
    assert [g["fallback"] for g in fallback] == [False, True, False, False, False]
    assert fallback[3]["final_answer"] is None and fallback[4]["final_answer"] == "12"
    assert final_answer("math_boxed", None) is None and final_answer("arithmetic", "\\boxed{5}") is None
    assert final_answer("math", "The answer is 72") == "72" and final_answer(None, "\\boxed{5}") is None


def _collapsed(n=20, share=0.7):
    """``n`` answers to ``n`` problems (solutions 1..n: each 1/n of them); ``share`` of the answers say "8"."""
    k = round(n * share)
    finals = ["8"] * k + [str(100 + i) for i in range(n - k - 1)] + [None]
    return pd.DataFrame({"answer_id": [f"a{i}" for i in range(n)], "group_id": [f"g{i}" for i in range(n)],
                         "reward": [1.0 if f == str(i + 1) else 0.0 for i, f in enumerate(finals)],
                         "verifier": ["math_boxed"] * n, "boxed": [f is not None for f in finals],
                         "fallback": [False] * n, "final_answer": finals, "solution": [str(i + 1) for i in range(n)]})


def test_constant_answer_collapse_is_measured_and_warned():
    from gmts_analysis.analysis import reward_audit as ra

    a = reward_audit(_collapsed())
    assert a["modal_answer"] == "8" and a["modal_answer_share"] == 0.7 and a["modal_solution_share"] == 0.05
    assert a["boxed_share"] == 0.95  # every older share looks healthy
    s = audit_sentence(a)
    assert "Warning: 70% of answers give the same final answer '8' (the most common solution is 5% of problems)" in s
    assert "constant-answer collapse" in s
    assert ra.COLLAPSE_SHARE == 0.5 and ra.COLLAPSE_RATIO == 2.0
    # at the thresholds: half the answers, twice the most common solution's share, still warns
    edge = dict(a, modal_answer_share=0.5, modal_solution_share=0.25)
    assert "collapse" in audit_sentence(edge)
    assert "collapse" not in audit_sentence(dict(a, modal_answer_share=0.5, modal_solution_share=0.26))
    # GSM8K-style references (no solution column: 'answer', read after '####')
    gsm = _collapsed().drop(columns="solution").assign(answer=["work #### 3"] * 10 + ["x #### 4"] * 10)
    assert modal(gsm) == ("8", 0.7, 0.5)
    assert "collapse" not in audit_sentence(reward_audit(gsm))  # 70% is not twice 50%: one answer could earn half


def modal(df):
    from gmts_analysis.analysis.reward_audit import modal_answers

    m = modal_answers(df)
    return m["modal_answer"], m["modal_answer_share"], m["modal_solution_share"]


def test_healthy_answers_give_no_collapse_warning():
    healthy = _collapsed(share=0.2)
    a = reward_audit(healthy)
    assert (a["modal_answer"], a["modal_answer_share"], a["modal_solution_share"]) == ("8", 0.2, 0.05)
    assert "collapse" not in audit_sentence(a) and "Warning" not in audit_sentence(a)
    # the answers most often agree where the solutions do: no warning either
    agree = _collapsed().assign(solution=["8"] * 14 + [str(i) for i in range(6)])
    assert modal(agree) == ("8", 0.7, 0.7) and "collapse" not in audit_sentence(reward_audit(agree))
    # absent columns: null, never guessed; ties go to the smallest answer
    assert modal(healthy.drop(columns=["final_answer", "solution"])) == (None, None, None)
    assert modal(healthy.assign(final_answer=None)) == (None, None, 0.05)
    assert modal(pd.DataFrame({"final_answer": ["9", "10", None, "9", "10"]})) == ("10", 0.4, None)
    bare = reward_audit(healthy[["answer_id", "reward", "solution"]])
    assert bare["modal_solution_share"] == 0.05 and audit_sentence(bare) is None  # the problems alone say nothing


def test_an_old_audit_without_the_modal_keys_still_reads():
    from gmts_analysis.analysis.stats_types import RewardAudit

    old = {"n_answers": 10, "verifier": "math_boxed", "truncated_share": 0.01, "boxed_share": 0.98,
           "fallback_share": 0.0, "copies_prompt_example_share": 0.0, "positive_share": 0.1,
           "fallback_positive_share": 0.0, "truncated_positive_share": 0.0}
    s = audit_sentence(old)
    assert s.startswith("Reward audit (verifier math_boxed), 10 answers: 1% truncated") and "Warning" not in s
    rec = RewardAudit.from_dict(old)
    assert rec.modal_answer_share is None and not rec.has("modal_answer_share") and rec.to_dict() == old
    assert audit_sentence(rec.to_dict()) == s
    # an audit with the modal share but no reference answers: no base rate, no warning
    assert "Warning" not in audit_sentence(dict(old, modal_answer="8", modal_answer_share=0.9))


def test_heldout_pass1_carries_the_modal_answer_shares():
    """pass@1 of held-out answers (gmts series' series.json, the TRL study's evaluations) carries the modal
    answer shares computed by reward_audit.modal_answers; answers sampled before ``final_answer`` was recorded
    get the answer their verifier scores in the response."""
    from gmts_analysis.rl.trl_records import eval_entry
    from gmts_analysis.run.heldout import pass_at_1

    df = _collapsed()
    rows = [{k: v for k, v in r.items() if not (k == "final_answer" and v is None)}
            for r in df.assign(truncated=False).to_dict("records")]
    rows[-1]["final_answer"] = None
    got = pass_at_1(rows, n_boot=20)
    assert (got["modal_answer"], got["modal_answer_share"], got["modal_solution_share"]) == ("8", 0.7, 0.05)
    legacy = [{**{k: v for k, v in r.items() if k != "final_answer"},
               "response": [{"role": "assistant", "content": f"It is \\boxed{{{r['final_answer']}}}"}]
               if r["final_answer"] is not None else "no box"} for r in rows]
    assert pass_at_1(legacy, n_boot=20)["modal_answer_share"] == 0.7
    e = eval_entry(30, {**got, "mean_answer_tokens": 20.0})
    assert e["modal_answer_share"] == 0.7 and e["modal_answer"] == "8" and e["modal_solution_share"] == 0.05


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


def test_heldout_answer_shares_come_from_reward_audit():
    """pass@1's boxed and truncated shares are reward_audit's (one place computes them): the same numbers on the
    same answers, null where no answer records its field, and 0/1 shares exact."""
    from gmts_analysis.run.heldout import ANSWER_AUDIT_KEYS, answer_audit, pass_at_1

    df = _collapsed().assign(truncated=[i % 4 == 0 for i in range(len(_collapsed()))],
                             boxed=[i % 3 != 0 for i in range(len(_collapsed()))])
    rows = df.to_dict("records")
    got = pass_at_1(rows, n_boot=20)
    want = reward_audit(df)
    for k in ANSWER_AUDIT_KEYS:
        assert got[k] == want[k], k
    assert got["truncated_share"] == sum(r["truncated"] for r in rows) / len(rows)
    assert got["boxed_share"] == sum(r["boxed"] for r in rows) / len(rows)
    bare = [{k: v for k, v in r.items() if k not in ("boxed", "truncated")} for r in rows]
    shares = answer_audit(bare)
    assert shares["boxed_share"] is None and shares["truncated_share"] is None
    assert shares["modal_answer_share"] == got["modal_answer_share"]
    assert answer_audit([])["boxed_share"] is None
