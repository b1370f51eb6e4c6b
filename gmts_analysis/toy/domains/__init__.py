"""The toy domains, mirroring the paper's math / code / logic: a registry by name.

``DOMAINS[name]`` is a :class:`~gmts_analysis.toy.domains.base.Domain`;
:func:`generate_problems` draws a seeded, de-duplicated prompt set from one split.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains.arithmetic import ARITHMETIC
from gmts_analysis.toy.domains.base import ANSWER_MARKER, Domain, Problem, final_answer, split_of
from gmts_analysis.toy.domains.logic import LOGIC
from gmts_analysis.toy.domains.program import PROGRAM

T = TypeVar("T")

DOMAINS: dict[str, Domain] = {d.name: d for d in (ARITHMETIC, PROGRAM, LOGIC)}
SPLITS = ("train", "heldout")

__all__ = ["ANSWER_MARKER", "DOMAINS", "SPLITS", "Domain", "Problem", "final_answer", "generate_problems",
           "get_domain", "split_of"]


def get_domain(name: str) -> Domain:
    """The domain called ``name``; ``GmtsError`` naming the choices otherwise."""
    if name not in DOMAINS:
        raise GmtsError(f"domain: unknown domain '{name}' (choose from {', '.join(DOMAINS)})")
    return DOMAINS[name]


def generate_problems(
    domain: str,
    n: int,
    seed: int,
    difficulty: int | None = None,
    split: str = "heldout",
    unique: bool = True,
) -> list[Problem]:
    """``n`` problems of ``domain`` from ``split``, reproducible from ``seed``.

    ``difficulty=None`` draws each problem's level uniformly. The stream for
    ``(domain, split, seed)`` is independent of the others; with ``unique`` a prompt
    appears at most once.
    """
    dom = get_domain(domain)
    if split not in SPLITS:
        raise GmtsError(f"split must be one of {SPLITS}, got '{split}'")
    if difficulty is not None and difficulty not in dom.difficulties:
        raise GmtsError(f"difficulty: {domain} has levels {dom.difficulties}, got {difficulty}")
    rng = random.Random(f"gmts-toy/{domain}/{split}/{seed}")
    return draw_distinct(
        n, 200 * n + 10_000,
        draw=lambda i: dom.generate(rng, difficulty if difficulty is not None else rng.choice(dom.difficulties)),
        key=lambda p: p.prompt, keep=lambda p: split_of(domain, p.prompt) == split, unique=unique,
        error=f"{domain}: cannot draw {n} distinct {split} prompts at difficulty {difficulty}",
    )


def draw_distinct(
    n: int,
    max_tries: int,
    draw: Callable[[int], T],
    key: Callable[[T], str],
    error: str,
    keep: Callable[[T], bool] = lambda item: True,
    unique: bool = True,
) -> list[T]:
    """``n`` items from ``draw(i)`` (``i``: how many are kept so far), skipping those ``keep`` refuses and,
    with ``unique``, those whose ``key`` was kept before; a GmtsError ``error`` after ``max_tries`` draws.
    The one loop behind the toy domains' and the word problems' prompt streams (each draw consumes the
    caller's random stream in the same order as before)."""
    out: list[T] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > max_tries:
            raise GmtsError(error)
        item = draw(len(out))
        k = key(item)
        if not keep(item) or (unique and k in seen):
            continue
        seen.add(k)
        out.append(item)
    return out
