"""Resolve ``--verifier NAME`` into a TRL-shaped reward function."""

from __future__ import annotations

from gmts_analysis.errors import GmtsError


def resolve_verifier(name: str | None):
    """A TRL-shaped reward function: a toy domain's verifier, or ``domain`` (per-row dispatch)."""
    if not name:
        return None
    from gmts_analysis.toy.verifiers import REWARD_FUNCTIONS, toy_reward

    if name == "domain":
        return toy_reward
    if name not in REWARD_FUNCTIONS:
        raise GmtsError(f"--verifier: unknown verifier '{name}' (choose from domain, {', '.join(REWARD_FUNCTIONS)})")
    return REWARD_FUNCTIONS[name]

