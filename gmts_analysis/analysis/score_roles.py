"""Which registered scores the statistics and the summary single out, found in the registry by its flags
and relations (:mod:`gmts_analysis.core.scores`), never by name.

``entropy`` (a quantity and a score) and GMTS (the tokens table's ``gmts`` column) are the toolkit's own
words; every other score is reached through the registry: the masked baseline of a score (``scale
"informative"``, ``base``), a figure's estimator list (``figures``), the selection arms (``arm``), the
headline scores (``headline``). Each function reads the registry when called, in its order.
"""

from __future__ import annotations

from gmts_analysis.core.scores import (
    HEADLINE_SCORES,
    MASKED_SCORES,
    MASS,
    SELECTION_ARMS,
    WITHIN,
    figure_scores,
    get_score,
)

ENTROPY = "entropy"
GMTS = "gmts"


def masked_of(name: str) -> str | None:
    """The masked baseline of score ``name``: ``name`` times ``1[omega != 0]`` (None when none is registered)."""
    return next((m for m in MASKED_SCORES if get_score(m).base == name), None)


def paired_references() -> tuple[str, ...]:
    """The references of the paired differences (besides each statistic's leader): entropy and its masked
    baseline, so that GMTS = entropy * |omega| is compared with both of its ingredients."""
    return tuple(s for s in (ENTROPY, masked_of(ENTROPY)) if s is not None)


def cross_answer_names() -> list[str]:
    """The scores the within-vs-cross figure draws, masked baselines left out (on informative tokens a
    masked score is its base)."""
    return [s for s in figure_scores(WITHIN) if s not in MASKED_SCORES]


def within_answer_names() -> list[str]:
    """The bases of :func:`cross_answer_names` (inside an answer a score times ``|omega|`` ranks the tokens
    as its base does)."""
    out = [(get_score(s).base or s) if get_score(s).scale == "abs_omega" else s for s in cross_answer_names()]
    return list(dict.fromkeys(out))


def mass_capture_names() -> list[str]:
    """The selection arms the mass-capture figure draws."""
    return [s for s in figure_scores(MASS) if s in SELECTION_ARMS]


def waste_names() -> list[str]:
    """The bases of the masked baselines (a masked baseline wastes nothing by construction; its base shows
    what masking removes)."""
    return [b for b in (get_score(m).base for m in MASKED_SCORES) if b is not None]


def topk_names() -> list[str]:
    """The headline scores."""
    return list(HEADLINE_SCORES)
