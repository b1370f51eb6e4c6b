"""The toy domains, mirroring the paper's math / code / logic: a registry by name.

``DOMAINS[name]`` is a :class:`~gmts_analysis.toy.domains.base.Domain`;
:func:`generate_problems` draws a seeded, de-duplicated prompt set from one split.
"""

from __future__ import annotations

import random

from gmts_analysis.toy.domains.arithmetic import ARITHMETIC
from gmts_analysis.toy.domains.base import ANSWER_MARKER, Domain, Problem, final_answer, split_of
from gmts_analysis.toy.domains.logic import LOGIC
from gmts_analysis.toy.domains.program import PROGRAM

DOMAINS: dict[str, Domain] = {d.name: d for d in (ARITHMETIC, PROGRAM, LOGIC)}
SPLITS = ("train", "heldout")

__all__ = ["ANSWER_MARKER", "DOMAINS", "SPLITS", "Domain", "Problem", "final_answer", "generate_problems",
           "get_domain", "split_of"]


def get_domain(name: str) -> Domain:
    """The domain called ``name``; ``GmtsError`` naming the choices otherwise."""
    from gmts_analysis.errors import GmtsError

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
    from gmts_analysis.errors import GmtsError

    dom = get_domain(domain)
    if split not in SPLITS:
        raise GmtsError(f"split must be one of {SPLITS}, got '{split}'")
    if difficulty is not None and difficulty not in dom.difficulties:
        raise GmtsError(f"difficulty: {domain} has levels {dom.difficulties}, got {difficulty}")
    rng = random.Random(f"gmts-toy/{domain}/{split}/{seed}")
    out: list[Problem] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n + 10_000:
            raise GmtsError(f"{domain}: cannot draw {n} distinct {split} prompts at difficulty {difficulty}")
        level = difficulty if difficulty is not None else rng.choice(dom.difficulties)
        p = dom.generate(rng, level)
        if split_of(domain, p.prompt) != split or (unique and p.prompt in seen):
            continue
        seen.add(p.prompt)
        out.append(p)
    return out
