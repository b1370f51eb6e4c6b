"""What every toy domain provides, and the helpers they share.

A domain generates prompts at a difficulty level from a seeded ``random.Random``,
writes the reference chain-of-thought for a prompt (optionally with one injected,
self-consistently propagated slip, used as training noise), and verifies a
completion. Verification is a pure function of ``(prompt, completion)``: the domain
re-solves the prompt, so no answer key travels with the rollouts.

Every response has the form ``<trace> #<answer>``; the verifier reads the text after
the *last* ``#`` (whitespace stripped) and compares it exactly with the answer.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

ANSWER_MARKER = "#"
HELDOUT_PERCENT = 10  # share of the prompt space reserved for held-out evaluation


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer and solution (``solution`` ends in ``#answer``)."""

    domain: str
    difficulty: int
    prompt: str
    answer: str
    solution: str


@runtime_checkable
class Domain(Protocol):
    """A verifiable toy task. Implementations are plain modules-level singletons."""

    name: str
    difficulties: tuple[int, ...]
    charset: str  # every character a prompt or reference solution can contain

    def generate(self, rng: random.Random, difficulty: int) -> Problem:
        """A random problem at ``difficulty`` (one of ``difficulties``)."""
        ...

    def solve(self, prompt: str, slip_rng: random.Random | None = None) -> tuple[str, str]:
        """``(solution, answer)`` for ``prompt``; with ``slip_rng`` one step is off and the
        error propagates (the answer returned is then the slipped trace's answer).
        Raises ``ValueError`` on a malformed prompt."""
        ...

    def verify(self, prompt: str, completion: str) -> float:
        """1.0 when the completion's final answer is correct, else 0.0; never raises."""
        ...


def final_answer(completion: object) -> str | None:
    """The text after the last answer marker, stripped; ``None`` when there is none."""
    if not isinstance(completion, str) or ANSWER_MARKER not in completion:
        return None
    return completion.rsplit(ANSWER_MARKER, 1)[1].strip()


_INT = re.compile(r"-?[0-9]{1,30}")


def same_integer(got: str | None, want: str) -> bool:
    """Exact integer comparison that never raises (bounded digit count, ASCII digits only)."""
    if got is None or not _INT.fullmatch(got):
        return False
    return int(got) == int(want)


def split_of(domain: str, prompt: str) -> str:
    """``"heldout"`` for a fixed ~10% of the prompt space (by a stable hash), else ``"train"``.

    Training never sees a held-out prompt, whatever the seeds.
    """
    h = hashlib.sha256(f"{domain}\x00{prompt}".encode()).digest()
    return "heldout" if int.from_bytes(h[:4], "big") % 100 < HELDOUT_PERCENT else "train"


def slip(value: int, rng: random.Random, low: int = 0, high: int | None = None) -> int:
    """``value`` moved by one (up or down at random) and kept inside ``[low, high]``; never equal."""
    step = rng.choice((-1, 1))
    out = value + step
    if out < low or (high is not None and out > high):
        out = value - step
    return out


def verify_by_solving(domain: Domain, prompt: str, completion: object, same=lambda got, want: got == want) -> float:
    """1.0 when ``completion``'s final answer matches the domain's own solution of ``prompt``
    (compared with ``same(got, want)``), else 0.0; a malformed prompt or completion gives 0.0."""
    try:
        _, answer = domain.solve(prompt)
    except (ValueError, TypeError, RecursionError):
        return 0.0
    return 1.0 if same(final_answer(completion), answer) else 0.0
