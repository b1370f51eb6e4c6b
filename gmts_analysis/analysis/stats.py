"""Statistics of a probe: do estimators rank tokens like their policy-gradient norm?

Everything here is a function of the tokens table (docs/definitions.md, tokens table) and is
written to ``stats.json`` (version 4) by :func:`compute_statistics`. For every estimator column
``s`` (:func:`gmts_analysis.core.estimators.available`; ``abs_omega`` = |omega| is the baseline that
knows only each token's coefficient):

*Informative* tokens have omega != 0. A token with omega = 0 (every reward of its group equal,
so A = 0) contributes nothing to the update; the statistics keep such tokens apart so that a
result coming from them is visible.

- ``zero_advantage``: ``answers`` and ``groups`` without an informative token, ``tokens`` with
  omega = 0 and their ``token_share``.
- ``cross_answer.<s>``: rho(s, grad_norm) (:func:`gmts_analysis.core.rank.spearman`) and Kendall
  tau-b over all tokens pooled, ``n_tokens``, 95% CI of rho. ``cross_answer_informative.<s>``:
  the same over informative tokens only.
- ``within_answer.<s>``: rho(s, grad_norm_logp) inside each answer, over ONE answer set for
  every estimator: informative answers with at least ``MIN_TOKENS`` tokens with a target and a
  non-constant target. A score that cannot rank an answer's tokens (constant inside it, as
  ``abs_omega`` on-policy) counts as rho = 0 there, so ``n_answers`` is the same for every
  estimator. Summarised by median, mean, q25, q75, n_answers and the 95% CI of the mean.
- ``within_group.<s>``: rho(s, grad_norm) pooled inside each group, over informative groups
  with the same rules (``n_groups``).
- ``topk_overlap.<scope>.<s>.<rho>``: |S_s ∩ S_true| / |S_true|, S_s the top
  ``n_keep(rho, n)`` tokens of the scope by s, S_true the top ``n_keep(rho, n)`` by grad_norm
  among the scope's tokens with grad_norm > 0 (all of them when fewer). A scope without such a
  token has no S_true: it is left out and counted in ``topk_scopes_excluded.<scope>``. Several
  scopes (groups; batches when there is a ``step``) are pooled: sums of intersections over
  sums of |S_true|. ``topk_overlap_ci.<scope>.<s>.<rho>``: {ci_low, ci_high}.
- ``selection_waste.<scope>.<s>.<rho>``: the share of S_s (pooled over scopes, excluded ones
  included) made of tokens with omega = 0; ``selection_waste_ci`` its CIs.
- ``update_fidelity``: needs the model; computed by :func:`gmts_analysis.engine.fidelity.fidelity_for_run`
  during the probe and passed in (``fidelity=``); ``gmts stats`` keeps the one on disk.
- ``mass_capture.<scope>.<s>.<rho>``: sum of grad_norm over S_s / sum over S_true (S as in
  top-k, same exclusions); ``mass_capture_ci``.
- ``uncertain``: the within/cross/top-k/mass blocks again over the tokens with prob <
  ``uncertain_below`` (default ``DEFAULT_UNCERTAIN_BELOW``), on the same cluster resamples, with ``n_tokens``,
  ``token_share``, ``mass_share``.
- ``within_answer.<s>.weighted_tau`` / ``.top1`` (:func:`within_agreement`).
- ``paired_difference.<stat>.<s>.<ref>``: {diff, ci_low, ci_high, p_le_0} from the same resamples
  (:func:`paired_differences`), refs entropy, entropy_inf and ``paired_leader.<stat>``.
- ``by_construction``: statistics fixed or equal to another by construction (:func:`by_construction`).
- ``by_domain.<d>`` / ``by_step.<k>``: the same blocks on each slice.
- ``meta``: ``version`` 4, ``ci_unit`` (``group`` or ``answer``), counts and settings.

Confidence intervals: 95% percentile intervals of a seeded cluster bootstrap that resamples
**groups** (answers only when every group has one answer, ``meta.ci_unit``); never tokens, on one
matrix of cluster multiplicities per block shared by every statistic of the block
(:mod:`gmts_analysis.analysis.bootstrap`). Cost: a few seconds of one CPU core for 6k tokens,
11 estimators and 1000 resamples.

Undefined values (constant columns, too few tokens, no S_true) are NaN, written as null.

This module assembles the blocks into typed :class:`Statistics` and writes them; the blocks are
computed by :mod:`~gmts_analysis.analysis.correlations` (within / cross answer),
:mod:`~gmts_analysis.analysis.selections` (top-k, waste, mass capture),
:mod:`~gmts_analysis.analysis.identities` (``by_construction``) on the table of
:mod:`~gmts_analysis.analysis.stat_inputs`; :mod:`~gmts_analysis.analysis.estimator_table` gives
the tables. Their public names are importable from here too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.bootstrap import (  # noqa: F401
    CI_LEVEL,
    PAIRED_REFERENCES,
    block_rng,
    cluster_bootstrap_spearman,
    cluster_bootstrap_spearman_many,
    multiplicities,
    paired_differences,
    pooled_n_boot,
)
from gmts_analysis.analysis.correlations import cross_answer, within_agreement, within_block, within_values  # noqa: F401
from gmts_analysis.analysis.estimator_table import (  # noqa: F401
    ESTIMATOR_TABLE_COLUMNS,
    estimator_table,
    per_answer_table,
    stats_table,
    tied_ranks,
)
from gmts_analysis.analysis.identities import by_construction, null_fixed_cis
from gmts_analysis.analysis.reward_audit import reward_audit
from gmts_analysis.analysis.selections import topk_and_waste, topk_waste_ci  # noqa: F401
from gmts_analysis.analysis.stat_inputs import (  # noqa: F401
    TARGET,
    TARGET_WITHIN,
    cluster_unit,
    informative_mask,
    prepare_tokens,
    rho_grid,
    rho_key,
    run_rho_key,
    unit_codes,
)
from gmts_analysis.analysis.stats_types import (
    Block,
    CIGrid,
    Fidelity,
    Grid,
    Meta,
    RewardAudit,
    Slice,
    Statistics,
    Uncertain,
    ZeroAdvantage,
)
from gmts_analysis.core.estimators import available
from gmts_analysis.core.rank import MIN_TOKENS, kendall_tau_b, per_cluster_spearman, spearman  # noqa: F401
from gmts_analysis.core.selection import RHOS
from gmts_analysis.core.vocabulary import (
    DEFAULT_N_BOOT,
    DEFAULT_RHO,
    DEFAULT_UNCERTAIN_BELOW,
    MIN_GROUPS,
    check_rho,
    is_probability,
)
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import atomic_write_text

__all__ = [
    "MIN_TOKENS", "STATS_VERSION", "Statistics", "TARGET", "TARGET_WITHIN", "compute_statistics", "compute_stats",
    "cross_answer", "estimator_table", "informative_mask", "kendall_tau_b", "per_answer_table", "per_cluster_spearman",
    "prepare_tokens", "rho_key", "run_rho_key", "spearman", "stats_table", "within_values", "write_stats",
]

log = logging.getLogger(__name__)

STATS_VERSION = 4

def zero_advantage(df: pd.DataFrame, informative: np.ndarray) -> dict:
    """``{answers, groups, tokens, token_share}``: answers / groups without an informative token,
    tokens with omega = 0 (or without omega) and their share of all tokens."""
    n = len(df)
    z = ~informative
    ans = pd.Series(informative).groupby(df["answer_id"].to_numpy(), sort=False).any()
    out = {"answers": int((~ans).sum()), "groups": None, "tokens": int(z.sum()),
           "token_share": float(z.sum() / n) if n else float("nan"), "informative_units": None}
    if "group_id" in df.columns:
        grp = pd.Series(informative).groupby(df["group_id"].to_numpy(), sort=False).any()
        out["groups"] = int((~grp).sum())
    out["informative_units"] = informative_units(df, informative, cluster_unit(df))
    return out


def informative_units(df: pd.DataFrame, informative: np.ndarray, unit: str) -> int:
    """The bootstrap units (groups, or answers when every group has one) holding an informative token."""
    col = "group_id" if unit == "group" else "answer_id"
    return int(pd.Series(informative).groupby(df[col].to_numpy(), sort=False).any().sum()) if len(df) else 0


def _core(df: pd.DataFrame, estimators: list[str], informative: np.ndarray, codes: np.ndarray,
          unit_index: pd.Index, counts: np.ndarray, pooled: np.ndarray, unit: str, rhos: Iterable[float],
          run_rk: str, *, groups: bool = True, waste: bool = True) -> dict[str, Any]:
    """The statistics of one token set on given cluster resamples (``counts`` ``(B, C)``, ``pooled``
    its first rows for the pooled statistics), with the paired differences (:func:`paired_differences`):
    the typed values of a :class:`~gmts_analysis.analysis.stats_types.Block`'s fields, by name."""
    rhos = tuple(rhos)
    d_within: dict[str, np.ndarray] = {}
    d_cross: dict[str, np.ndarray] = {}
    d_topk: dict[tuple, np.ndarray] = {}
    out: dict[str, Any] = {}
    out["cross_answer"] = cross_answer(df, estimators, codes, pooled)
    out["cross_answer_informative"] = cross_answer(df, estimators, codes, pooled, rows=informative, draws=d_cross)
    out["within_answer"] = within_block(df, estimators, informative, unit_index, counts, "answer_id",
                                         TARGET_WITHIN, "n_answers", unit, draws=d_within, agreement=True)
    if groups:
        out["within_group"] = (within_block(df, estimators, informative, unit_index, counts, "group_id",
                                             TARGET, "n_groups", unit) if "group_id" in df.columns else {})
    orders: dict = {}
    tw = topk_and_waste(df, estimators, informative, rhos=rhos, orders=orders)
    cis = topk_waste_ci(df, estimators, informative, codes, pooled, rhos=rhos, draws=d_topk, orders=orders)
    out["topk_overlap"] = Grid.from_dict(tw["topk_overlap"], "topk_overlap")
    out["topk_overlap_ci"] = CIGrid.from_dict(cis["topk_overlap_ci"], "topk_overlap_ci")
    out["topk_scopes_excluded"] = tw["topk_scopes_excluded"]
    if waste:
        out["selection_waste"] = Grid.from_dict(tw["selection_waste"], "selection_waste")
        out["selection_waste_ci"] = CIGrid.from_dict(cis["selection_waste_ci"], "selection_waste_ci")
    out["mass_capture"] = Grid.from_dict(tw["mass_capture"], "mass_capture")
    out["mass_capture_ci"] = CIGrid.from_dict(cis["mass_capture_ci"], "mass_capture_ci")
    points = {
        "within_answer": {s: out["within_answer"][s].mean for s in estimators},
        "cross_answer_informative": {s: out["cross_answer_informative"][s].spearman for s in estimators},
        "topk_overlap": {s: tw["topk_overlap"].get("batch", {}).get(s, {}).get(run_rk) for s in estimators},
        "mass_capture": {s: tw["mass_capture"].get("batch", {}).get(s, {}).get(run_rk) for s in estimators},
    }
    draws = {
        "within_answer": d_within, "cross_answer_informative": d_cross,
        "topk_overlap": {s: d_topk[k] for s in estimators if (k := ("topk_overlap", "batch", s, run_rk)) in d_topk},
        "mass_capture": {s: d_topk[k] for s in estimators if (k := ("mass_capture", "batch", s, run_rk)) in d_topk},
    }
    out["paired_difference"], out["paired_leader"] = paired_differences(points, draws)
    return out


def _uncertain_block(df: pd.DataFrame, estimators: list[str], informative: np.ndarray, unit_col: str,
                     unit_index: pd.Index, counts: np.ndarray, pooled: np.ndarray, unit: str,
                     rhos: Iterable[float], run_rk: str, below: float) -> Uncertain:
    """The ``uncertain`` block: :func:`_core` over the tokens with prob < ``below``, on the same
    cluster resamples as the whole table (their columns for the clusters that keep a token);
    empty (``{}``) without a prob column."""
    if "prob" not in df.columns:
        return Uncertain.make()
    keep = (df["prob"].to_numpy(dtype=np.float64) < below)
    gn = df[TARGET].to_numpy(dtype=np.float64)
    gn0 = np.where(gn > 0, gn, 0.0)
    total = float(gn0.sum())
    sub = df[keep].reset_index(drop=True)
    out: dict[str, Any] = {"n_tokens": int(keep.sum()),
                           "token_share": float(keep.mean()) if len(df) else float("nan"),
                           "mass_share": float(gn0[keep].sum() / total) if total > 0 else float("nan")}
    if len(sub) == 0:
        return Uncertain.make(**out)
    sub_codes, sub_index = unit_codes(sub, unit)
    cols = unit_index.get_indexer(sub_index)
    out.update(_core(sub, estimators, informative[keep], sub_codes, sub_index, counts[:, cols], pooled[:, cols],
                     unit, rhos, run_rk, groups=False, waste=False))
    return Uncertain.make(**out)


def _block(df: pd.DataFrame, estimators: list[str], *, seed: int, n_boot: int, key: str, unit: str,
           fidelity: Mapping | None, rhos: Iterable[float] = RHOS, run_rk: str = rho_key(DEFAULT_RHO),
           uncertain_below: float = DEFAULT_UNCERTAIN_BELOW, min_groups: int = MIN_GROUPS) -> dict[str, Any]:
    """Every statistic of one table (the whole run, or one domain / step): the typed values of the
    fields of a :class:`~gmts_analysis.analysis.stats_types.Block`, by name."""
    informative = informative_mask(df)
    codes, unit_index = unit_codes(df, unit)
    n_units = len(unit_index)
    if informative_units(df, informative, unit) < min_groups:
        n_boot = 0  # too few informative clusters for a bootstrap: no interval, no paired verdict (meta.min_groups)
    counts = multiplicities(n_units, n_boot, block_rng(seed, key, "clusters")) if n_boot > 0 else np.zeros((0, n_units))
    nb_pooled = pooled_n_boot(n_boot, len(df), len(estimators))
    pooled = counts[:nb_pooled]
    out: dict[str, Any] = {"zero_advantage": ZeroAdvantage.make(**zero_advantage(df, informative))}
    out.update(_core(df, estimators, informative, codes, unit_index, counts, pooled, unit, rhos, run_rk))
    out["update_fidelity"] = {str(k): Fidelity.from_dict(v, f"update_fidelity.{k}") for k, v in (fidelity or {}).items()}
    unc = _uncertain_block(df, estimators, informative, "group_id" if unit == "group" else "answer_id",
                           unit_index, counts, pooled, unit, rhos, run_rk, uncertain_below)
    out["uncertain"] = unc
    whole = Block.make(**out)
    fixed = null_fixed_cis(whole, by_construction(whole, df))
    if "prob" in df.columns and unc.within_answer:
        sub = df[df["prob"].to_numpy(dtype=np.float64) < uncertain_below].reset_index(drop=True)
        fixed += null_fixed_cis(unc, by_construction(unc, sub, "uncertain."))
    out["by_construction"] = fixed
    return out


def _check_inputs(tokens: pd.DataFrame, n_boot: int, rho: float, uncertain_below: float) -> None:
    """One-line errors for a tokens table or settings :func:`compute_stats` cannot use."""
    missing = [c for c in ("answer_id", "position") if c not in tokens.columns]
    if missing:
        raise GmtsError(f"tokens table lacks column(s) {', '.join(missing)}")
    if n_boot < 0:
        raise GmtsError(f"n_boot must be >= 0, got {n_boot}")
    check_rho(rho, "--rho", error=GmtsError)
    if not is_probability(float(uncertain_below)):
        raise GmtsError(f"--uncertain-below must be in (0, 1], got {uncertain_below}")


def _estimators(df: pd.DataFrame, estimators: list[str] | None) -> list[str]:
    """The score columns to evaluate (default: every estimator present); an absent one is an error."""
    ests = list(estimators) if estimators is not None else available(df)
    bad = [s for s in ests if s not in df.columns]
    if bad:
        raise GmtsError(f"estimator column(s) not in the tokens table: {', '.join(bad)}")
    return ests


def _meta(df: pd.DataFrame, ests: list[str], unit: str, *, seed: int, n_boot: int, rhos: tuple[float, ...],
          rho: float, uncertain_below: float, min_groups: int = MIN_GROUPS,
          rescored_from: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meta`` block: counts, settings and what each block means."""
    return {
        "version": STATS_VERSION,
        "n_answers": int(df["answer_id"].nunique()),
        "n_tokens": len(df),
        "n_groups": int(df["group_id"].nunique()) if "group_id" in df.columns else None,
        "target": TARGET,
        "target_within_answer": TARGET_WITHIN,
        "estimators": ests,
        "informative": "omega != 0" if "omega" in df.columns else "every token (no omega column)",
        "n_boot": int(n_boot),
        "n_boot_pooled": pooled_n_boot(n_boot, len(df), len(ests)),
        "ci_level": CI_LEVEL,
        "ci_unit": unit,
        "n_ci_units": int(df["group_id" if unit == "group" else "answer_id"].nunique()),
        "ci_method": f"percentile cluster bootstrap resampling {unit}s (never tokens); one seeded "
        "resample matrix per block shared by every statistic",
        "seed": int(seed),
        "min_tokens": MIN_TOKENS,
        "within_set": "informative clusters with >= min_tokens tokens and a non-constant target, the same "
        "for every estimator; a score constant inside a cluster counts as rho 0",
        "rhos": [rho_key(r) for r in rhos],
        "rho": rho_key(rho),
        "topk_true": "top n_keep(rho, n) of the scope by grad_norm among tokens with grad_norm > 0; "
        "scopes without such a token excluded (topk_scopes_excluded)",
        "topk_pooling": "sum over scopes of |S_s ∩ S_true| / sum over scopes of |S_true|",
        "selection_waste": "share of S_s with omega = 0, pooled over every scope",
        "batch_scope": "per step" if "step" in df.columns else "all tokens",
        "update_fidelity": f"rho {float(rho):g}, batch scope, computed by the probe (needs the model); "
        "empty when not computed",
        "uncertain_below": float(uncertain_below),
        "uncertain": "tokens with prob < uncertain_below (the policy's own probability, not the target); "
        "the within/cross/top-k blocks again over them, on the same cluster resamples",
        "mass_capture": "sum of grad_norm over S_s / sum over S_true (S as in topk_overlap), pooled over scopes",
        "paired_difference": "value(s) - value(ref) on the same cluster resamples; statistics within_answer "
        "(mean), cross_answer_informative (spearman), topk_overlap and mass_capture (batch scope, meta.rho); "
        f"refs {', '.join(PAIRED_REFERENCES)} and the leader (paired_leader); p_le_0: share of resamples with "
        "diff <= 0",
        "by_construction": "statistics fixed or equal to another by construction: listed, no CI, not findings",
        "min_groups": int(min_groups),
        "rescored_from": dict(rescored_from) if rescored_from else None,
    }


def _slice_blocks(df: pd.DataFrame, col: str, ests: list[str], fidelity: Mapping[str, Mapping] | None, *,
                  seed: int, n_boot: int, unit: str, rhos: tuple[float, ...], run_rk: str,
                  uncertain_below: float, min_groups: int = MIN_GROUPS) -> dict[str, Slice]:
    """``{value: Slice}`` of each value of ``col`` (``by_domain`` / ``by_step``), with its counts."""
    out: dict[str, Slice] = {}
    for value, sub in df.groupby(col, sort=True):
        k = str(value)
        out[k] = Slice.make(**_block(
            sub.reset_index(drop=True), ests, seed=seed, n_boot=n_boot, key=f"{col}={k}", unit=unit,
            fidelity=(fidelity or {}).get(k), rhos=rhos, run_rk=run_rk, uncertain_below=uncertain_below,
            min_groups=min_groups,
        ), n_answers=int(sub["answer_id"].nunique()), n_tokens=len(sub))
    return out


def compute_statistics(
    tokens: pd.DataFrame,
    answers: pd.DataFrame | None = None,
    *,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
    estimators: list[str] | None = None,
    fidelity: Mapping[str, Any] | None = None,
    fidelity_by_domain: Mapping[str, Mapping] | None = None,
    fidelity_by_step: Mapping[str, Mapping] | None = None,
    rho: float = DEFAULT_RHO,
    uncertain_below: float = DEFAULT_UNCERTAIN_BELOW,
    min_groups: int = MIN_GROUPS,
    rescored_from: Mapping[str, Any] | None = None,
) -> Statistics:
    """Every statistic of stats.json (version 4) that needs no model, built as typed
    :class:`Statistics` (``to_json()`` is the stats.json text; :func:`compute_stats` gives its dict).

    uncertain_below: the ``uncertain`` block keeps the tokens with prob below it
    (``--uncertain-below``; recorded as ``meta.uncertain_below``).

    rho: the run's keep fraction (``--rho``, TRL's ``top_entropy_quantile``): added to the grid
    of top-k fractions and recorded as ``meta.rho``, the fraction the report and the headline quote.

    min_groups: a block with fewer informative groups gets no bootstrap interval and no paired
    verdict (``meta.min_groups``). rescored_from: the run re-scored (``meta.rescored_from``).

    tokens: the tokens table; answers: the answers table (optional; gives ``domain``/``step``
    when the tokens lack them, and the ``reward_audit``). estimators: score columns to evaluate
    (default: every estimator present, :func:`gmts_analysis.core.estimators.available`). fidelity:
    an ``update_fidelity`` block (``{name: {cosine, norm_ratio}}``); ``fidelity_by_domain`` /
    ``fidelity_by_step`` the same per slice. NaN marks undefined values.
    """
    _check_inputs(tokens, n_boot, rho, uncertain_below)
    df = prepare_tokens(tokens, answers).reset_index(drop=True)
    ests = _estimators(df, estimators)
    if df[TARGET].isna().all():
        log.warning("no grad_norm in the tokens table (probe run with --grad-norm none?): correlations are null")
    unit = cluster_unit(df)
    rhos = rho_grid(rho)
    if min_groups < 1:
        raise GmtsError(f"min_groups must be >= 1, got {min_groups}")
    meta = Meta.make(**_meta(df, ests, unit, seed=seed, n_boot=n_boot, rhos=rhos, rho=rho,
                             uncertain_below=uncertain_below, min_groups=min_groups, rescored_from=rescored_from))
    run_rk = rho_key(rho)
    fields: dict[str, Any] = _block(df, ests, seed=seed, n_boot=n_boot, key="all", unit=unit, fidelity=fidelity,
                                    rhos=rhos, run_rk=run_rk, uncertain_below=uncertain_below, min_groups=min_groups)
    for col, name, fid in (("domain", "by_domain", fidelity_by_domain), ("step", "by_step", fidelity_by_step)):
        if col in df.columns and not df[col].isna().all():
            fields[name] = _slice_blocks(df, col, ests, fid, seed=seed, n_boot=n_boot, unit=unit, rhos=rhos,
                                         run_rk=run_rk, uncertain_below=uncertain_below, min_groups=min_groups)
    audit = RewardAudit.make(**reward_audit(answers, int(df["answer_id"].nunique())))
    return Statistics.make(meta=meta, reward_audit=audit, **fields)


def compute_stats(tokens: pd.DataFrame, answers: pd.DataFrame | None = None, **options: Any) -> dict:
    """:func:`compute_statistics` as the JSON object of stats.json (a nested dict; same arguments;
    NaN marks undefined values): ``{"meta", "reward_audit", "zero_advantage", "cross_answer", ...,
    "by_construction", ["by_domain"], ["by_step"]}``."""
    return compute_statistics(tokens, answers, **options).to_dict()


def is_current(stats: Mapping[str, Any]) -> bool:
    """Whether a stats dict has this version's layout (older ones are rewritten by ``gmts stats``)."""
    meta = stats.get("meta") if isinstance(stats, Mapping) else None
    return isinstance(meta, Mapping) and meta.get("version") == STATS_VERSION


def kept_fidelity(old: Mapping[str, Any]) -> dict[str, Any]:
    """The ``update_fidelity`` blocks of a stats dict (any version), as keyword arguments of
    :func:`compute_stats`: they need the model, so a recomputation keeps them."""
    def section(name: str) -> dict:
        return {k: v.get("update_fidelity") for k, v in (old.get(name) or {}).items() if isinstance(v, Mapping)}

    return {"fidelity": old.get("update_fidelity") or None, "fidelity_by_domain": section("by_domain"),
            "fidelity_by_step": section("by_step")}


def write_stats(run_dir: str | Path, stats: Statistics | Mapping[str, Any],
                json_path: str | Path | None = None) -> list[Path]:
    """Write ``stats.json`` (from :class:`Statistics`: a stats dict is read into one first) and the
    estimator ranking ``estimators.csv`` (atomically) into ``run_dir``; with ``json_path`` only that
    file (no sibling the caller did not name). Returns the paths."""
    st = Statistics.coerce(stats)
    jp = Path(json_path) if json_path is not None else Path(run_dir) / "stats.json"
    out = [atomic_write_text(jp, st.to_json())]
    if json_path is not None:
        return out
    table = estimator_table(st)
    out.append(atomic_write_text(jp.parent / "estimators.csv", table.to_csv(index=False, float_format="%.6g")))
    return out
