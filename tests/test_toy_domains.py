"""Toy domains: generators, reference solutions, verifiers, reward functions, tokenizer coverage."""

from __future__ import annotations

import random

import pytest

from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import DOMAINS, Domain, final_answer, generate_problems, split_of
from gmts_analysis.toy.domains.logic import parse, render
from gmts_analysis.toy.verifiers import REWARD_FUNCTIONS, toy_reward

NAMES = sorted(DOMAINS)

# (prompt, correct completion, wrong completion) written by hand, independent of the solvers
HAND = {
    "arithmetic": [("347+85=", "7+5=12,4+8+1=13,3+0+1=4 #432", "#433"),
                   ("342-85=", "12-5=7,14-8-1=5,3-0-1=2 #257", "#247"),
                   ("347*6=", "7*6=42,4*6+4=28,3*6+2=20 #2082", "#2081"),
                   ("100-99=", "#1", "#0"),
                   ("99+1=", "#100", "#10")],
    "program": [("a=7;b=a+5;a=b*2;c=a-b;c?", "a=7;b=7+5=12;a=12*2=24;c=24-12=12 #12", "#24"),
                ("a=3;b=a*3;a=b-a;a?", "#6", "#9")],
    "logic": [("(T&~F)|~(F|T)=", "(T&T)|~T,T|F #T", "#F"),
              ("~(~T|(F&T))|F=", "~(F|F)|F,~F|F,T|F #T", "#F"),
              ("T&F=", "#F", "#T"),
              ("~(T|F)&(F|~F)=", "#F", "#T")],
}

MALFORMED = ["", "#", "# ", "no marker", "#\x00", "#" + "9" * 5000, "#1e3", "#٣", "#४३२", "#½", "#一",
             "#T F", "#432 #", "#-", "#+432", "#0x1b0", "# 4 3 2", "\ud800", "#" + "T" * 1000, "🙂#🙂"]


@pytest.mark.parametrize("name", NAMES)
def test_domain_protocol(name):
    assert isinstance(DOMAINS[name], Domain)
    assert DOMAINS[name].name == name


@pytest.mark.parametrize("name", NAMES)
def test_hand_written_cases(name):
    dom = DOMAINS[name]
    for prompt, right, wrong in HAND[name]:
        assert dom.verify(prompt, right) == 1.0, (prompt, right)
        assert dom.verify(prompt, wrong) == 0.0, (prompt, wrong)
        assert dom.solve(prompt)[1] == final_answer(right)


def test_hand_written_traces_match_reference():
    # the documented examples are exactly the reference traces
    for name in NAMES:
        for prompt, right, _ in HAND[name]:
            if right.split("#")[0]:  # a full trace was written
                assert DOMAINS[name].solve(prompt)[0] == right


@pytest.mark.parametrize("name", NAMES)
def test_every_reference_solution_verifies(name):
    dom = DOMAINS[name]
    for level in dom.difficulties:
        for seed in range(3):
            for split in ("train", "heldout"):
                for p in generate_problems(name, 60, seed, level, split=split):
                    assert p.difficulty == level and p.domain == name
                    assert split_of(name, p.prompt) == split
                    assert p.solution.endswith(f" #{p.answer}")
                    assert dom.verify(p.prompt, p.solution) == 1.0, p
                    assert dom.solve(p.prompt) == (p.solution, p.answer)


@pytest.mark.parametrize("name", NAMES)
def test_slipped_solutions_are_wrong_or_harmless(name):
    """A slipped trace differs from the reference in one step; its answer is mostly wrong."""
    dom = DOMAINS[name]
    rng = random.Random(0)
    wrong = total = 0
    for p in generate_problems(name, 300, 1, split="train"):
        try:
            sol, ans = dom.solve(p.prompt, slip_rng=rng)
        except ValueError:  # the slip drove a later program value out of range
            continue
        total += 1
        assert sol != p.solution
        assert dom.verify(p.prompt, sol) == (1.0 if ans == p.answer else 0.0)
        wrong += ans != p.answer
    assert wrong / total > {"arithmetic": 0.95, "program": 0.6, "logic": 0.4}[name]


@pytest.mark.parametrize("name", NAMES)
def test_wrong_answers_score_zero(name):
    dom = DOMAINS[name]
    for p in generate_problems(name, 100, 2):
        trace = p.solution.rsplit("#", 1)[0]
        bad = {"T": "F", "F": "T"}[p.answer] if name == "logic" else str(int(p.answer) + 1)
        assert dom.verify(p.prompt, trace + "#" + bad) == 0.0
        assert dom.verify(p.prompt, trace) == 0.0  # no final answer
        assert dom.verify(p.prompt, p.solution + " ") == 1.0  # surrounding whitespace is fine
        assert dom.verify(p.prompt, "#" + p.answer) == 1.0  # the answer alone counts


@pytest.mark.parametrize("name", NAMES)
def test_malformed_never_raises(name):
    dom = DOMAINS[name]
    prompts = [p.prompt for p in generate_problems(name, 5, 3)] + ["", "=", "garbage", "1" * 10_000 + "+1=",
                                                                   "(" * 5000 + "T=", "a=1;" * 100 + "a?", "\x00"]
    for prompt in prompts:
        for completion in MALFORMED + [None, 123, b"#1"]:
            assert dom.verify(prompt, completion) == 0.0


def test_huge_numbers_compare_exactly():
    dom = DOMAINS["arithmetic"]
    assert dom.verify("9999+1=", "#10000") == 1.0
    assert dom.verify("9999+1=", "#010000") == 1.0  # leading zeros: same integer
    assert dom.verify("9999+1=", "#" + "1" + "0" * 40) == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_generation_is_seeded_and_split_disjoint(name):
    a = generate_problems(name, 50, 5)
    assert a == generate_problems(name, 50, 5)
    assert [p.prompt for p in a] != [p.prompt for p in generate_problems(name, 50, 6)]
    train = {p.prompt for p in generate_problems(name, 400, 0, split="train")}
    held = {p.prompt for p in generate_problems(name, 200, 0, split="heldout")}
    assert not train & held
    assert len(held) == 200


def test_generate_problems_rejects_bad_input():
    with pytest.raises(GmtsError):
        generate_problems("nope", 1, 0)
    with pytest.raises(GmtsError):
        generate_problems("logic", 1, 0, difficulty=9)
    with pytest.raises(GmtsError):
        generate_problems("logic", 1, 0, split="test")


def test_logic_parser_round_trip_and_rejects_chains():
    rng = random.Random(0)
    dom = DOMAINS["logic"]
    for _ in range(200):
        p = dom.generate(rng, rng.choice(dom.difficulties))
        assert render(parse(p.prompt)) + "=" == p.prompt
    for bad in ["T&F|T=", "(T)=", "~~T=", "T&=", "(T&F=", "T&F)="]:
        with pytest.raises(ValueError):
            parse(bad)


def test_reward_functions_are_trl_shaped():
    probs = {n: generate_problems(n, 4, 0) for n in NAMES}
    for n in NAMES:
        prompts = [p.prompt for p in probs[n]]
        comps = [p.solution if i % 2 == 0 else "#?" for i, p in enumerate(probs[n])]
        assert REWARD_FUNCTIONS[n](prompts, comps) == [1.0, 0.0, 1.0, 0.0]
        assert REWARD_FUNCTIONS[n](prompts=prompts, completions=comps, extra=[1] * 4) == [1.0, 0.0, 1.0, 0.0]
        # conversational completions: the last message is scored
        chat = [[{"role": "assistant", "content": c}] for c in comps]
        assert REWARD_FUNCTIONS[n](prompts, chat) == [1.0, 0.0, 1.0, 0.0]
    prompts = [probs[n][0].prompt for n in NAMES] + ["x"]
    comps = [probs[n][0].solution for n in NAMES] + ["#1"]
    assert toy_reward(prompts, comps, domain=NAMES + ["unknown"]) == [1.0, 1.0, 1.0, 0.0]
    # a correct solution scored under another domain is wrong, never an exception
    assert toy_reward(prompts[:3], comps[:3], domain=NAMES[1:] + NAMES[:1]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        toy_reward(prompts, comps[:2], domain=NAMES)


def test_tokenizer_round_trip_on_every_domain_character():
    from gmts_analysis.toy.tokenizer import CHARS, build_char_tokenizer

    tok = build_char_tokenizer()
    unk = tok.unk_token_id
    chars: set[str] = set()
    for n in NAMES:
        declared = set(DOMAINS[n].charset)
        rng = random.Random(1)
        for p in generate_problems(n, 300, 0, split="train"):
            used = set(p.prompt + p.solution + DOMAINS[n].solve(p.prompt, slip_rng=rng)[0]
                       if n != "program" else p.prompt + p.solution)
            assert used <= declared, used - declared
            chars |= used
        chars |= declared
    assert chars <= set(CHARS)
    text = "".join(sorted(chars)) + CHARS
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and unk not in ids
    assert tok.decode(ids) == text
    with_bos = tok(text, add_special_tokens=True)["input_ids"]
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == ids
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
