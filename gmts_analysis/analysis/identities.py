"""Identities, not findings: statistics fixed or equal to another by construction (``by_construction``
of stats.json), checked on the table and the values, never assumed; such a statistic carries no CI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stat_inputs import informative_mask
from gmts_analysis.core.rank import n_keep


def _constant_abs_omega_within_answers(df: pd.DataFrame) -> bool:
    """Whether |omega| takes one value inside every answer (on-policy token-mean: |w A| per answer)."""
    if "omega" not in df.columns or len(df) == 0:
        return False
    a = df["omega"].abs()
    g = a.groupby(df["answer_id"], sort=False)
    return bool(((g.max() - g.min()).fillna(0) <= 1e-12 * g.max().abs().fillna(0).clip(lower=1e-300)).all()
                and a.notna().all())


def by_construction(block: Mapping[str, Any], df: pd.DataFrame, prefix: str = "") -> list[dict]:
    """Entries ``{key, equals, why}`` for the statistics of ``block`` fixed or equal to another by
    construction (checked on the table and the values, never assumed). Such a statistic is no
    finding: the words never state it, and a fixed value carries no CI (set to null by the caller).
    """
    out = _zero_waste_identities(block, prefix)
    if "group_id" in df.columns and "group" in (block.get("selection_waste") or {}):
        out += _group_waste_identities(block, df, prefix)
    out += _masked_identities(block, prefix)
    if _constant_abs_omega_within_answers(df):
        out += _within_identities(block, prefix)
    return out


def _zero_waste_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """A score that is 0 where omega = 0 wastes nothing when every resample agrees (waste 0, CI 0)."""
    from gmts_analysis.core.estimators import ZERO_WHERE_OMEGA_ZERO

    out: list[dict] = []
    for scope, per_s in (block.get("selection_waste") or {}).items():
        for s_ in ZERO_WHERE_OMEGA_ZERO:
            for rk, v in (per_s.get(s_) or {}).items():
                ci = (block.get("selection_waste_ci") or {}).get(scope, {}).get(s_, {}).get(rk, {})
                # 0 on the table and in every resample (else it measures the share without signal)
                if v == 0.0 and all(ci.get(k) in (0.0, None) or ci.get(k) != ci.get(k) for k in ("ci_low", "ci_high")):
                    out.append({"key": f"{prefix}selection_waste.{scope}.{s_}.{rk}", "equals": 0,
                                "_ci": ("selection_waste_ci", scope, s_, rk),
                                "why": f"{s_} is 0 where omega = 0, and each scope has more tokens with a "
                                "positive score than picks, in the table and in every resample: the selection never reaches a "
                                "token without gradient"})
    return out


def _group_waste_identities(block: Mapping[str, Any], df: pd.DataFrame, prefix: str) -> list[dict]:
    """Group-scope waste equal for every score: when a group has signal in every token or in none,
    the picks in its zero-advantage groups are all waste, whatever the score."""
    inf = informative_mask(df)
    ests = list(block.get("within_answer", {}))
    grp_inf = pd.Series(inf).groupby(df["group_id"].to_numpy(), sort=False)
    if not bool((grp_inf.all() | ~grp_inf.any()).all()):
        return []
    from gmts_analysis.core.selection import scope_codes

    out: list[dict] = []
    sc = scope_codes(df, "group")
    n = np.bincount(sc)
    zero_scope = np.bincount(sc, weights=(~inf).astype(float)) == n
    for rk in block["selection_waste"]["group"].get(ests[0] if ests else "", {}):
        k = n_keep(float(rk), n)
        share = float(k[zero_scope].sum() / k.sum()) if k.sum() else float("nan")
        vals = [block["selection_waste"]["group"][s_][rk] for s_ in ests]
        if vals and all(v is not None and abs(v - share) < 1e-12 for v in vals):
            for s_ in ests:
                out.append({"key": f"{prefix}selection_waste.group.{s_}.{rk}",
                            "equals": f"the share of group-scope picks in groups without signal ({share:.6g})",
                            "why": "a group has signal in every token or in none, so at group scope the "
                            "waste of every score is the picks of its zero-advantage groups"})
    return out


def _masked_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """A masked score equals its score on every informative token (and their paired difference is 0)."""
    from gmts_analysis.core.estimators import MASKED

    out: list[dict] = []
    cai = block.get("cross_answer_informative") or {}
    pdc = (block.get("paired_difference") or {}).get("cross_answer_informative", {})
    for s_, ref in MASKED.items():
        if s_ in cai and ref in cai and cai[s_].get("spearman") == cai[ref].get("spearman"):
            out.append({"key": f"{prefix}cross_answer_informative.{s_}", "equals": f"{prefix}cross_answer_informative.{ref}",
                        "why": f"{s_} is {ref} times 1[omega != 0]: the same score on every informative token"})
            for a, b in ((s_, ref), (ref, s_)):
                if b in (pdc.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.cross_answer_informative.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "cross_answer_informative", a, b),
                                "why": f"{a} and {b} are the same score on informative tokens"})
    return out


def _within_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """With |omega| constant inside every answer: scores that rank an answer's tokens alike
    (:data:`SAME_WITHIN_ANSWER`), their paired differences, and abs_omega's rho of 0."""
    from gmts_analysis.core.estimators import SAME_WITHIN_ANSWER

    out: list[dict] = []
    wa = block.get("within_answer") or {}
    for s_, ref in SAME_WITHIN_ANSWER.items():
        if s_ in wa and ref in wa and wa[s_].get("mean") == wa[ref].get("mean"):
            out.append({"key": f"{prefix}within_answer.{s_}", "equals": f"{prefix}within_answer.{ref}",
                        "why": "|omega| is one positive constant inside an informative answer, so "
                        f"{s_} ranks its tokens exactly as {ref}"})
    # every pair inside a class of scores that rank answers alike has a paired difference of 0
    classes: dict[str, set[str]] = {}
    for e in out:
        ref = e["equals"].rsplit(".", 1)[1]
        classes.setdefault(ref, {ref}).add(e["key"].rsplit(".", 1)[1])
    pd_ = (block.get("paired_difference") or {}).get("within_answer", {})
    for members in classes.values():
        for a in sorted(members):
            for b in sorted(members):
                if a != b and b in (pd_.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.within_answer.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "within_answer", a, b),
                                "why": f"{a} and {b} rank the tokens of an answer alike (see within_answer)"})
    if "abs_omega" in wa and wa["abs_omega"].get("mean") == 0.0:
        out.append({"key": f"{prefix}within_answer.abs_omega", "equals": 0,
                    "_ci": ("within_answer", "abs_omega"),
                    "why": "|omega| is constant inside an answer: it cannot rank the answer's tokens (rho 0)"})
    return out


def null_fixed_cis(block: dict, entries: list[dict]) -> list[dict]:
    """A statistic fixed by construction carries no CI: null the CI (and p_le_0) of each entry of
    ``entries`` in ``block``; returns the entries without their internal ``_ci`` path."""
    out = []
    for e in entries:
        path = e.get("_ci")
        node: Any = block
        for k in path or ():
            node = node.get(k) if isinstance(node, Mapping) else None
        if isinstance(node, dict):
            for k in ("ci_low", "ci_high", "p_le_0"):
                if k in node:
                    node[k] = float("nan")  # written as null
        out.append({k: v for k, v in e.items() if k != "_ci"})
    return out
