"""Verifiers as reward functions shaped like TRL's: ``(prompts, completions, **kwargs) -> list[float]``.

``REWARD_FUNCTIONS[domain]`` scores every completion with that domain's verifier;
:func:`toy_reward` dispatches row by row on a ``domain`` keyword (a list, one name per
row, as TRL passes dataset columns). Completions may be plain text or TRL's
conversational form (a list of ``{"role", "content"}`` messages: the last message's
content is scored). Scores are 1.0 or 0.0; nothing here raises on a malformed answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gmts_analysis.toy.domains import DOMAINS

RewardFunction = Callable[..., list[float]]


def _text(x: Any) -> str:
    """Plain text of a prompt or completion (str, or a list of chat messages)."""
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)) and x and isinstance(x[-1], dict):
        content = x[-1].get("content", "")
        return content if isinstance(content, str) else ""
    return ""


def _check_lengths(prompts: Sequence[Any], completions: Sequence[Any]) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")


def make_reward_function(domain: str) -> RewardFunction:
    """The TRL-shaped reward function of one domain (named ``<domain>_reward``)."""
    dom = DOMAINS[domain]

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        _check_lengths(prompts, completions)
        return [dom.verify(_text(p), _text(c)) for p, c in zip(prompts, completions)]

    reward.__name__ = f"{domain}_reward"
    reward.__doc__ = f"1.0 where the completion's final answer to the {domain} prompt is correct, else 0.0."
    return reward


REWARD_FUNCTIONS: dict[str, RewardFunction] = {name: make_reward_function(name) for name in DOMAINS}


def toy_reward(prompts: Sequence[Any], completions: Sequence[Any], domain: Sequence[str] | str | None = None,
               **kwargs: Any) -> list[float]:
    """Dispatch each row to its domain's verifier by the ``domain`` keyword (list or one name).

    A row whose domain is missing or unknown scores 0.0 (nothing raises for a bad row).
    """
    _check_lengths(prompts, completions)
    names = [domain] * len(prompts) if isinstance(domain, str) or domain is None else list(domain)
    if len(names) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(names)} domain labels")
    out = []
    for p, c, d in zip(prompts, completions, names):
        dom = DOMAINS.get(d) if isinstance(d, str) else None
        out.append(dom.verify(_text(p), _text(c)) if dom is not None else 0.0)
    return out
