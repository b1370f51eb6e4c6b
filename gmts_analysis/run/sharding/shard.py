"""Length-balanced shares of a batch: whole groups per rank.

A group (answers to one prompt) is never split across ranks, so whatever a rank computes
per group sees the whole group. Groups are assigned largest first to the least loaded
rank (the LPT rule: the heaviest rank carries at most 4/3 of the optimum), ties going to
the lower rank, so the shares depend only on the answers and the world size.
"""

from __future__ import annotations

from collections.abc import Sequence

from gmts_analysis.readers.rollouts import Answer


def answer_cost(answer: Answer) -> int:
    """Work of one answer, in tokens: prompt + response (one forward pass over both)."""
    return len(answer.prompt_ids) + len(answer.response_ids)


def group_key(answer: Answer) -> str:
    """Answers with equal keys stay on one rank (the group id, whatever the step)."""
    return str(answer.group_id)


def shard_answers(answers: Sequence[Answer], world_size: int) -> list[list[int]]:
    """Answer indices of each rank (``world_size`` lists, each in input order).

    Every index appears in exactly one list; answers of one group share a list; the
    lists' total :func:`answer_cost` are balanced greedily (largest group first).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    groups: dict[str, list[int]] = {}
    for i, a in enumerate(answers):
        groups.setdefault(group_key(a), []).append(i)
    cost = {k: sum(answer_cost(answers[i]) for i in idx) for k, idx in groups.items()}
    first = {k: idx[0] for k, idx in groups.items()}
    load = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for k in sorted(groups, key=lambda k: (-cost[k], first[k])):
        r = min(range(world_size), key=lambda j: (load[j], j))
        load[r] += cost[k]
        shares[r].extend(groups[k])
    return [sorted(s) for s in shares]
