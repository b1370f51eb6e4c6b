"""Whether sampled answers carry a learning signal: a group whose rewards are all equal has advantage 0 for
every answer, so omega and every gradient norm of its tokens are 0 (docs/definitions.md section 4).

``gmts sample``, ``gmts run`` and :func:`gmts_analysis.api.sample` warn (one line on stderr) when no group,
or at most a quarter of the groups (:data:`FLAT_SHARE_WARN`), has reward variance, and say what to change;
``gmts run``'s summary repeats it (:func:`gmts_analysis.analysis.summary.findings`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("gmts_analysis.sampling")

#: warn when more than this share of the groups has no reward variance
FLAT_SHARE_WARN = 0.75
#: what gives groups reward variance again (the end of the warning)
SIGNAL_ADVICE = ("sample more answers per prompt (--num-generations), more prompts (--num-prompts), at a higher "
                 "--temperature, on easier problems (gmts sample --difficulty, toy domains), or score the word problems "
                 "with --verifier math (math_boxed, the default, reads \\boxed{} only; math falls back to the last "
                 "expression)")


def flat_groups(rows: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """``(groups whose scorable rewards are all equal, groups)`` of rollout rows (``group_id``, ``reward``;
    an ``unscorable`` answer is left out of its group, as TRL leaves it out of the baseline)."""
    rewards: dict[Any, list[float]] = {}
    for r in rows:
        g = r.get("group_id")
        got = rewards.setdefault(g, [])
        x = r.get("reward")
        if r.get("unscorable") or not isinstance(x, (int, float)) or math.isnan(float(x)):
            continue
        got.append(float(x))
    flat = sum(1 for v in rewards.values() if len(v) < 2 or max(v) == min(v))
    return flat, len(rewards)


def signal_warning(flat: int, groups: int) -> str | None:
    """One line saying that ``flat`` of ``groups`` groups carry no gradient and what to do, or None when
    the share is at most :data:`FLAT_SHARE_WARN` (or there is no group)."""
    if groups <= 0 or flat / groups <= FLAT_SHARE_WARN:
        return None
    what = (f"none of the {groups} groups has reward variance" if flat == groups
            else f"{flat} of {groups} groups ({100 * flat / groups:.0f}%) have no reward variance")
    head = "no learning signal" if flat == groups else "little learning signal"
    return (f"{head}: {what} (all rewards of a group equal): every advantage there is 0, so "
            "omega and all gradient norms of those answers are 0; " + SIGNAL_ADVICE)


def warn_if_no_signal(rows: Iterable[Mapping[str, Any]], where: str = "") -> str | None:
    """Log :func:`signal_warning` of ``rows`` (prefixed with ``where``), and return it (None: no warning)."""
    msg = signal_warning(*flat_groups(rows))
    if msg is not None:
        log.warning("%s%s", f"{where}: " if where else "", msg)
    return msg
