"""Grade-school arithmetic word problems with known answers: the real-model world of ``gmts run``.

A real instruct LLM cannot answer the toy domains' ``#answer`` format, so ``gmts run --model smollm2``
(and ``--domains word``) samples these instead: short stories of one to three arithmetic steps
(shopping, ages, rates, sharing, change, seating), drawn from a seeded ``random.Random``, with small
numbers (a 135M model gets some of them right, so that groups have mixed rewards). Each problem is
asked through the model's chat template as the last user message, with a ``\\boxed{}`` instruction after
:data:`N_EXAMPLES` worked examples as earlier turns (:func:`prompt_messages`), and
scored by the ``math_boxed`` verifier (:func:`gmts_analysis.readers.verifiers.math_boxed_reward`: 1 when the last
``\\boxed{}`` holds the answer, the default of ``gmts run`` and ``gmts sample``; ``--verifier math``,
:func:`gmts_analysis.readers.verifiers.math_reward`, adds the fallback to the last expression of the text) against its
``solution`` column, the answer as an integer. To train on them through TRL:
:mod:`gmts_analysis.integrations.trl_train` (docs/real_runs.md).

``difficulty`` 1 is one arithmetic step, 2 two steps; every number is below 10 except sums of them. The
worked examples are two-step by default; ``matched_examples`` shows one-step examples before one-step
problems (:data:`ONE_STEP_EXAMPLES`), which lifts SmolLM2-135M-Instruct's pass@1 on level 1 from 0.10 to 0.29
(80 problems, one answer each at T 0.7): with two-step examples it adds a second, made-up step. :func:`word_problems` returns prompt rows in the shape of
a ``gmts sample --prompts`` file (``prompt`` as messages, ``solution``, ``difficulty``, ``template``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import draw_distinct

DOMAIN = "word"
DIFFICULTIES = (1, 2)
INSTRUCTION = "Show the steps briefly, then the final answer within \\boxed{}."
NAMES = ("Sam", "Mia", "Tom", "Ana", "Leo", "Zoe", "Ben", "Ivy")


@dataclass(frozen=True)
class WordProblem:
    """One problem: its text, the answer (an integer) and where it came from."""

    text: str
    answer: int
    template: str
    difficulty: int


def _shopping(r: random.Random, d: int) -> WordProblem:
    n, a, b = r.choice(NAMES), r.randint(2, 6), r.randint(1, 4)
    text = f"{n} has {a} apples and buys {b} more apples."
    ans = a + b
    if d == 2:
        c = r.randint(1, ans - 1)
        text += f" Then {n} eats {c} apples."
        ans -= c
    return WordProblem(text + f" How many apples does {n} have now?", ans, "shopping", d)


def _ages(r: random.Random, d: int) -> WordProblem:
    n, a, o = r.choice(NAMES), r.randint(3, 9), r.randint(1, 5)
    text = f"{n} is {a} years old. {n}'s brother is {o} years older than {n}."
    if d == 1:
        return WordProblem(text + " How old is the brother?", a + o, "ages", d)
    k = r.randint(1, 5)
    return WordProblem(text + f" How old will the brother be in {k} years?", a + o + k, "ages", d)


def _rates(r: random.Random, d: int) -> WordProblem:
    p, t = r.randint(2, 5), r.randint(2, 3)
    text = f"A printer prints {p} pages every minute. It runs for {t} minutes."
    ans = p * t
    if d == 2:
        x = r.randint(1, 5)
        text += f" Then it prints {x} more pages."
        ans += x
    return WordProblem(text + " How many pages did it print?", ans, "rates", d)


def _sharing(r: random.Random, d: int) -> WordProblem:
    f, k = r.randint(2, 3), r.randint(2, 4)
    text = f"{f} friends each have {k} cookies."
    ans = f * k
    if d == 2:
        e = r.randint(1, ans - 1)
        text += f" They eat {e} cookies."
        ans -= e
    return WordProblem(text + " How many cookies are there in total now?", ans, "sharing", d)


def _change(r: random.Random, d: int) -> WordProblem:
    n, m = r.choice(NAMES), r.randint(5, 9)
    s = r.randint(1, m - 1)
    text = f"{n} has {m} dollars and spends {s} dollars on a pencil."
    ans = m - s
    if d == 2:
        g = r.randint(1, 5)
        text += f" Then {n}'s aunt gives {n} {g} dollars."
        ans += g
    return WordProblem(text + f" How many dollars does {n} have now?", ans, "change", d)


def _seating(r: random.Random, d: int) -> WordProblem:
    rows, c = r.randint(2, 3), r.randint(2, 4)
    text = f"A classroom has {rows} rows of {c} desks."
    ans = rows * c
    if d == 2:
        e = r.randint(1, ans - 1)
        text += f" {e} desks are empty."
        ans -= e
        return WordProblem(text + " How many desks are taken?", ans, "seating", d)
    return WordProblem(text + " How many desks are there?", ans, "seating", d)


TEMPLATES: dict[str, Callable[[random.Random, int], WordProblem]] = {
    "shopping": _shopping, "ages": _ages, "rates": _rates, "sharing": _sharing, "change": _change,
    "seating": _seating,
}


def generate(n: int, seed: int = 0, difficulty: int | None = None) -> list[WordProblem]:
    """``n`` distinct problems, reproducible from ``seed``; templates in turn, the level uniform over
    :data:`DIFFICULTIES` unless ``difficulty`` is given."""
    if n < 1:
        raise GmtsError(f"word problems: need n >= 1, got {n}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise GmtsError(f"--difficulty: word problems have levels {DIFFICULTIES}, got {difficulty}")
    rng = random.Random(f"gmts-word/{seed}")
    names = list(TEMPLATES)
    return draw_distinct(
        n, 100 * n + 1000,
        draw=lambda i: TEMPLATES[names[i % len(names)]](rng, difficulty if difficulty is not None else rng.choice(DIFFICULTIES)),
        key=lambda p: p.text, error=f"word problems: cannot draw {n} distinct problems",
    )


#: worked examples, in the order they are offered; a prompt shows the first :data:`N_EXAMPLES` whose answer
#: differs from its problem's (a worked example never shares the answer asked for: a copied example then
#: scores 0, never 1). A 135M model follows the answer format only after seeing it.
EXAMPLES = (
    ("Kim has 4 books and buys 3 more books. Then Kim gives away 2 books. How many books does Kim have now?",
     "4 + 3 = 7. 7 - 2 = 5. \\boxed{5}", 5),
    ("A box holds 3 rows of 2 eggs, and 1 more egg is put on top. How many eggs are there?",
     "3 * 2 = 6. 6 + 1 = 7. \\boxed{7}", 7),
    ("A shelf has 4 rows of 3 cups. Then 3 cups break. How many cups are left?",
     "4 * 3 = 12. 12 - 3 = 9. \\boxed{9}", 9),
)
#: one-step worked examples, shown before a level-1 (one-step) problem when examples are matched to the
#: problem's steps (same rule: never the problem's answer)
ONE_STEP_EXAMPLES = (
    ("Kim has 4 books and buys 3 more books. How many books does Kim have now?", "4 + 3 = 7. \\boxed{7}", 7),
    ("A box holds 3 rows of 2 eggs. How many eggs are there?", "3 * 2 = 6. \\boxed{6}", 6),
    ("A shelf has 9 cups. Then 4 cups break. How many cups are left?", "9 - 4 = 5. \\boxed{5}", 5),
)
#: worked examples per prompt
N_EXAMPLES = 2


def examples_for(problem: WordProblem, n: int = N_EXAMPLES, matched: bool = False) -> list[tuple[str, str]]:
    """The ``n`` worked examples (question, answer text) shown before ``problem``: the first of
    :data:`EXAMPLES` (with ``matched``, of :data:`ONE_STEP_EXAMPLES` for a level-1 problem) whose answer is not
    the problem's."""
    pool = ONE_STEP_EXAMPLES if matched and problem.difficulty == 1 else EXAMPLES
    if not 0 <= n < len(pool):
        raise GmtsError(f"word problems: n_examples must be in 0..{len(pool) - 1}, got {n}")
    return [(q, a) for q, a, ans in pool if ans != problem.answer][:n]


def prompt_messages(problem: WordProblem, n_examples: int = N_EXAMPLES, matched: bool = False) -> list[dict]:
    """The chat prompt: the worked examples (:func:`examples_for`, ``matched`` to the problem's steps or the
    two-step ones) as earlier turns, then the problem with the ``\\boxed{}`` instruction as the last user message."""
    msgs: list[dict] = []
    for q, a in examples_for(problem, n_examples, matched):
        msgs += [{"role": "user", "content": f"{q}\n{INSTRUCTION}"}, {"role": "assistant", "content": a}]
    return msgs + [{"role": "user", "content": f"{problem.text}\n{INSTRUCTION}"}]


def word_problems(n: int, seed: int = 0, difficulty: int | None = None,
                  matched_examples: bool = False) -> list[dict]:
    """Prompt rows (``prompt`` messages, ``solution``, ``difficulty``, ``template``) for
    :func:`gmts_analysis.sampling.generate.sample_prompts`, scored by the ``math_boxed`` verifier (or ``math``);
    ``matched_examples``: worked examples with the problem's number of steps (:func:`prompt_messages`)."""
    return [{"prompt": prompt_messages(p, matched=matched_examples), "solution": str(p.answer), "difficulty": p.difficulty,
             "template": p.template} for p in generate(n, seed, difficulty)]
