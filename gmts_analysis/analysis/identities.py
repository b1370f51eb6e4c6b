"""Identities, not findings: statistics fixed or equal to another by construction (``by_construction``
of stats.json), checked on the table and the values, never assumed; such a statistic carries no CI.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stat_inputs import informative_mask
from gmts_analysis.analysis.stats_types import Block, Identity, NestedMap, Record
from gmts_analysis.core.estimators import MASKED, SAME_WITHIN_ANSWER, ZERO_WHERE_OMEGA_ZERO
from gmts_analysis.core.rank import n_keep
from gmts_analysis.core.selection import scope_codes


def _constant_abs_omega_within_answers(df: pd.DataFrame) -> bool:
    """Whether |omega| takes one value inside every answer (on-policy token-mean: |w A| per answer)."""
    if "omega" not in df.columns or len(df) == 0:
        return False
    a = df["omega"].abs()
    g = a.groupby(df["answer_id"], sort=False)
    return bool(((g.max() - g.min()).fillna(0) <= 1e-12 * g.max().abs().fillna(0).clip(lower=1e-300)).all()
                and a.notna().all())


def by_construction(block: Block, df: pd.DataFrame, prefix: str = "") -> list[dict]:
    """Entries ``{key, equals, why, _ci}`` for the statistics of ``block`` fixed or equal to another by
    construction (checked on the table and the values, never assumed). Such a statistic is no
    finding: the words never state it, and a fixed value carries no CI (``_ci``: the path of the
    record whose CI :func:`null_fixed_cis` sets to null, which also makes the entries :class:`Identity`).
    """
    out = _zero_waste_identities(block, prefix)
    if "group_id" in df.columns and "group" in block.selection_waste:
        out += _group_waste_identities(block, df, prefix)
    out += _masked_identities(block, prefix)
    if _constant_abs_omega_within_answers(df):
        out += _within_identities(block, prefix)
    return out


def _zero_waste_identities(block: Block, prefix: str) -> list[dict]:
    """A score that is 0 where omega = 0 wastes nothing when every resample agrees (waste 0, CI 0)."""
    out: list[dict] = []
    for scope, per_s in block.selection_waste.values.items():
        for s_ in ZERO_WHERE_OMEGA_ZERO:
            for rk, v in (per_s.get(s_) or {}).items():
                ci = block.selection_waste_ci.at(scope, s_, rk)
                # 0 on the table and in every resample (else it measures the share without signal)
                if v == 0.0 and all(b == 0.0 or b != b for b in (ci.ci_low, ci.ci_high)):
                    out.append({"key": f"{prefix}selection_waste.{scope}.{s_}.{rk}", "equals": 0,
                                "_ci": ("selection_waste_ci", scope, s_, rk),
                                "why": f"{s_} is 0 where omega = 0, and each scope has more tokens with a "
                                "positive score than picks, in the table and in every resample: the selection never reaches a "
                                "token without gradient"})
    return out


def _group_waste_identities(block: Block, df: pd.DataFrame, prefix: str) -> list[dict]:
    """Group-scope waste equal for every score: when a group has signal in every token or in none,
    the picks in its zero-advantage groups are all waste, whatever the score."""
    inf = informative_mask(df)
    ests = list(block.within_answer)
    grp_inf = pd.Series(inf).groupby(df["group_id"].to_numpy(), sort=False)
    if not bool((grp_inf.all() | ~grp_inf.any()).all()):
        return []
    out: list[dict] = []
    sc = scope_codes(df, "group")
    n = np.bincount(sc)
    zero_scope = np.bincount(sc, weights=(~inf).astype(float)) == n
    for rk in block.selection_waste.series("group", ests[0] if ests else ""):
        k = n_keep(float(rk), n)
        share = float(k[zero_scope].sum() / k.sum()) if k.sum() else float("nan")
        vals = [block.selection_waste.at("group", s_, rk) for s_ in ests]
        if vals and all(v is not None and abs(v - share) < 1e-12 for v in vals):
            for s_ in ests:
                out.append({"key": f"{prefix}selection_waste.group.{s_}.{rk}",
                            "equals": f"the share of group-scope picks in groups without signal ({share:.6g})",
                            "why": "a group has signal in every token or in none, so at group scope the "
                            "waste of every score is the picks of its zero-advantage groups"})
    return out


def _masked_identities(block: Block, prefix: str) -> list[dict]:
    """A masked score equals its score on every informative token (and their paired difference is 0)."""
    out: list[dict] = []
    cai = block.cross_answer_informative
    pdc = block.paired_difference.of("cross_answer_informative")
    for s_, ref in MASKED.items():
        if s_ in cai and ref in cai and cai[s_].spearman == cai[ref].spearman:
            out.append({"key": f"{prefix}cross_answer_informative.{s_}", "equals": f"{prefix}cross_answer_informative.{ref}",
                        "why": f"{s_} is {ref} times 1[omega != 0]: the same score on every informative token"})
            for a, b in ((s_, ref), (ref, s_)):
                if b in (pdc.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.cross_answer_informative.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "cross_answer_informative", a, b),
                                "why": f"{a} and {b} are the same score on informative tokens"})
    return out


def _within_identities(block: Block, prefix: str) -> list[dict]:
    """With |omega| constant inside every answer: scores that rank an answer's tokens alike
    (:data:`SAME_WITHIN_ANSWER`), their paired differences, and abs_omega's rho of 0."""
    out: list[dict] = []
    wa = block.within_answer
    for s_, ref in SAME_WITHIN_ANSWER.items():
        if s_ in wa and ref in wa and wa[s_].mean == wa[ref].mean:
            out.append({"key": f"{prefix}within_answer.{s_}", "equals": f"{prefix}within_answer.{ref}",
                        "why": "|omega| is one positive constant inside an informative answer, so "
                        f"{s_} ranks its tokens exactly as {ref}"})
    # every pair inside a class of scores that rank answers alike has a paired difference of 0
    classes: dict[str, set[str]] = {}
    for e in out:
        ref = e["equals"].rsplit(".", 1)[1]
        classes.setdefault(ref, {ref}).add(e["key"].rsplit(".", 1)[1])
    pd_ = block.paired_difference.of("within_answer")
    for members in classes.values():
        for a in sorted(members):
            for b in sorted(members):
                if a != b and b in (pd_.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.within_answer.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "within_answer", a, b),
                                "why": f"{a} and {b} rank the tokens of an answer alike (see within_answer)"})
    if "abs_omega" in wa and wa["abs_omega"].mean == 0.0:
        out.append({"key": f"{prefix}within_answer.abs_omega", "equals": 0,
                    "_ci": ("within_answer", "abs_omega"),
                    "why": "|omega| is constant inside an answer: it cannot rank the answer's tokens (rho 0)"})
    return out


def _node(block: Block, path: tuple[str, ...]) -> Any:
    """The record at ``path`` (a field name, then names down its maps), None when absent."""
    node: Any = getattr(block, path[0], None)
    for k in path[1:]:
        if isinstance(node, NestedMap):
            node = node.values
        node = node.get(k) if isinstance(node, dict) else None
    return node


def null_fixed_cis(block: Block, entries: list[dict]) -> list[Identity]:
    """A statistic fixed by construction carries no CI: null the CI (and p_le_0) of each entry of
    ``entries`` in ``block``; returns the entries as :class:`Identity` (without their ``_ci`` path)."""
    out = []
    for e in entries:
        node = _node(block, e["_ci"]) if e.get("_ci") else None
        if isinstance(node, Record):
            for k in ("ci_low", "ci_high", "p_le_0"):
                if node.has(k):
                    setattr(node, k, float("nan"))  # written as null
        out.append(Identity.make(key=e["key"], equals=e["equals"], why=e["why"]))
    return out
