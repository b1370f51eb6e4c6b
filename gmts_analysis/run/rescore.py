"""Re-score a finished run without probing again: new rewards, or truncated answers masked.

The gradient norm of ``log p`` (``grad_norm_logp``), the entropy, the probabilities and every other probed
quantity do not depend on the rewards; only the advantage, the loss weight, omega and what scales with
them (``grad_norm = |omega| * grad_norm_logp``, ``gmts``, the masked scores) do. :func:`rescore` recomputes
those from the stored tables with the same functions the probe uses (:mod:`gmts_analysis.core.advantages`,
:func:`gmts_analysis.core.advantages.omega`, the score registry), then every statistic, and returns a new
in-memory run whose manifest and ``stats.json`` record where it came from (``rescored_from``). ``gmts stats
RUN --verifier NAME | --rewards FILE | --mask-truncated-completions --out NEW_RUN`` and ``Run.rescore`` call it.

What it cannot redo is refused with one line: an off-policy run (its clipping depends on the advantages'
signs and the old log-probs, which the tables do not keep), vLLM importance sampling, logged advantages.
``update_fidelity`` needs the model: it is left empty, and the log says so.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.runs import RunTables, json_normalise, manifest_rho, manifest_uncertain_below
from gmts_analysis.analysis.stats import DEFAULT_N_BOOT, compute_stats
from gmts_analysis.core import advantages as adv_mod
from gmts_analysis.core.estimators import ESTIMATORS, add_estimator_columns, times_abs_omega
from gmts_analysis.core.objective import LossSettings
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.audit import audit_fields
from gmts_analysis.readers.verifiers import resolve_verifier, score
from gmts_analysis.util.io import check_regular_file, file_sha256, jsonl_objects

log = logging.getLogger("gmts_analysis.run.rescore")


def _rollouts_file(run: RunTables) -> Path | None:
    """The rollouts file the run probed: its own ``rollouts.jsonl`` (``gmts run``), else the file its manifest
    names (``gmts probe --rollouts``; as given, or relative to the run's folder) when its sha256 is the one
    recorded, so a file changed since is never read as the run's."""
    own = Path(run.path) / "rollouts.jsonl" if run.path is not None else None
    if own is not None and own.is_file():
        return own
    rec = run.manifest.get("rollouts") if isinstance(run.manifest, dict) else None
    if not (isinstance(rec, dict) and isinstance(rec.get("path"), str) and rec.get("sha256")):
        return None
    given = Path(rec["path"])
    places = [given] + ([Path(run.path) / given] if run.path is not None and not given.is_absolute() else [])
    return next((p for p in places if p.is_file() and file_sha256(p) == rec["sha256"]), None)


def _responses(run: RunTables) -> tuple[list[Any], list[Any]]:
    """``(prompts, responses)`` of each answer for a verifier: the run's ``rollouts.jsonl`` when it has one
    (message-list prompts as sampled), else the answers table's text columns."""
    ans = run.answers
    by_id: dict[str, dict] = {}
    src = _rollouts_file(run)
    if src is not None:
        by_id = {str(r["answer_id"]): r for _, r in jsonl_objects(src) if r.get("answer_id") is not None}
    prompts, responses = [], []
    for _, a in ans.iterrows():
        r = by_id.get(str(a["answer_id"]), {})
        prompts.append(r.get("prompt", a.get("prompt")))
        resp = r.get("response", a.get("response"))
        if resp is None or (isinstance(resp, float) and math.isnan(resp)):
            raise GmtsError(f"{run.path}: answer '{a['answer_id']}' has no response text to verify "
                            "(answers.parquet has none and no rollouts.jsonl names it)")
        responses.append(resp)
    return prompts, responses


#: answer columns that are the run's own, never a verifier's input
_OWN = {"answer_id", "group_id", "reward", "advantage", "length", "loss_weight", "prompt_ids", "response_ids",
        "prompt", "response", "grad_norm_method", "verifier", "boxed", "fallback", "copies_example",
        "final_answer"}


def _keep_recorded_copies(ans: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """``copies_example`` where the new verifier could not tell (a prompt without its messages) is the one the
    run recorded: whether an answer copies a worked example of its prompt does not depend on who scores it."""
    if "copies_example" not in old.columns or "copies_example" not in ans.columns:
        return ans
    new = ans["copies_example"].astype(object)
    unknown = new.isna().to_numpy()
    if unknown.any():
        ans = ans.copy()
        ans["copies_example"] = np.where(unknown, old["copies_example"].astype(object).to_numpy(), new.to_numpy())
    return ans


def verifier_rewards(run: RunTables, name: str) -> tuple[np.ndarray, list[dict]]:
    """``(rewards, audit fields)`` of every answer of ``run`` scored by the verifier ``name``."""
    fn = resolve_verifier(name)
    prompts, responses = _responses(run)
    ans = run.answers
    cols = {c: [None if isinstance(v, float) and math.isnan(v) else v for v in ans[c]]
            for c in ans.columns if c not in _OWN}
    ids = [list(x) for x in ans["response_ids"]] if "response_ids" in ans.columns else [[]] * len(ans)
    r = np.asarray(score(fn, prompts, responses, ids, cols), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(r))
    if len(bad):
        raise GmtsError(f"--verifier {name}: skipped answer '{ans['answer_id'].iloc[int(bad[0])]}' (returned None); "
                        "an unscorable answer is not modelled")
    return r, audit_fields(name, prompts, responses)


def file_rewards(run: RunTables, path: str | Path) -> np.ndarray:
    """Rewards of every answer of ``run`` from a JSONL (``{"answer_id": ..., "reward": ...}`` per line) or CSV
    file (columns ``answer_id``, ``reward``); each answer exactly once, each reward a finite number."""
    path = check_regular_file(path, "--rewards")
    rows: list[tuple[str, Any, str]] = []
    if path.suffix.lower() == ".csv":
        try:
            df = pd.read_csv(path, dtype={"answer_id": str})
        except (ValueError, pd.errors.ParserError) as e:
            raise GmtsError(f"--rewards {path}: not a CSV file ({str(e).splitlines()[0][:120]})") from None
        for c in ("answer_id", "reward"):
            if c not in df.columns:
                raise GmtsError(f"--rewards {path}: no column '{c}' (expected answer_id, reward)")
        rows = [(str(a), v, f"{path}: line {i + 2}") for i, (a, v) in enumerate(zip(df["answer_id"], df["reward"]))]
    else:
        for n, r in jsonl_objects(path, f"--rewards {path}"):
            if "answer_id" not in r or "reward" not in r:
                raise GmtsError(f"--rewards {path}: line {n}: expected an object with answer_id and reward")
            rows.append((str(r["answer_id"]), r["reward"], f"{path}: line {n}"))
    got: dict[str, float] = {}
    for aid, v, where in rows:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise GmtsError(f"--rewards {where}: reward {v!r} is not a finite number")
        if aid in got:
            raise GmtsError(f"--rewards {where}: answer '{aid}' given twice")
        got[aid] = float(v)
    ids = [str(a) for a in run.answers["answer_id"]]
    missing = [a for a in ids if a not in got]
    unknown = sorted(set(got) - set(ids))
    if missing:
        raise GmtsError(f"--rewards {path}: no reward for {len(missing)} answer(s) of the run (first: '{missing[0]}')")
    if unknown:
        raise GmtsError(f"--rewards {path}: answer '{unknown[0]}' is not in the run ({len(unknown)} unknown)")
    return np.asarray([got[a] for a in ids], dtype=np.float64)


def _truncated(answers: pd.DataFrame) -> np.ndarray:
    for col in ("truncated", "unterminated"):
        if col in answers.columns and answers[col].map(lambda x: isinstance(x, (bool, np.bool_))).all():
            return answers[col].to_numpy(dtype=bool)
    raise GmtsError("--mask-truncated-completions: the run does not record which answers were truncated "
                    "(no 'truncated' column in answers.parquet)")


def _check_rescorable(run: RunTables) -> Any:
    """The run's loss settings, when its omega can be recomputed from its tables; else a one-line error."""
    if run.answers is None:
        raise GmtsError(f"{run.path}: no answers.parquet (re-scoring needs the answers table)")
    cfg = run.manifest.get("config") if isinstance(run.manifest.get("config"), dict) else {}
    if cfg.get("advantage") == "logged":
        raise GmtsError("re-scoring: this run used logged advantages (--advantage logged), which new rewards "
                        "do not change")
    obj = run.manifest.get("objective") if isinstance(run.manifest.get("objective"), dict) else {}
    try:
        settings = LossSettings(**{k: v for k, v in obj.items() if k in LossSettings.__dataclass_fields__})
    except TypeError as e:
        raise GmtsError(f"{run.path}/manifest.json: objective: {e}") from None
    if "ratio" in run.tokens.columns:
        raise GmtsError("re-scoring: an off-policy run (old_logprobs: clipping depends on the advantages' signs "
                        "and the old log-probs, which the tables do not keep) must be probed again")
    if settings.vllm_is_mode is not None:
        raise GmtsError("re-scoring: vLLM importance sampling needs the sampling log-probs, which the tables do "
                        "not keep; probe again")
    return settings, cfg.get("advantage") or "group"


def _omega_columns(tokens: pd.DataFrame, adv: dict, w: dict, settings: LossSettings) -> np.ndarray:
    """Per-token omega of every answer (tokens in the table's order), by the probe's formula."""
    om = np.empty(len(tokens), dtype=np.float64)
    ref = tokens["ref_logprob"].to_numpy(np.float64) if "ref_logprob" in tokens.columns else None
    lp = tokens["logprob"].to_numpy(np.float64)
    for aid, idx in tokens.groupby("answer_id", sort=False).indices.items():
        om[idx] = adv_mod.omega(w[aid], adv[aid], lp[idx], ref_logprob=None if ref is None else ref[idx],
                                settings=settings)
    return om


def _tables_hash(run: RunTables) -> str:
    """The sha256 of a run's tokens table (a run made by the API has no ``run_hash``)."""
    import hashlib

    cols = [c for c in ("answer_id", "position", "token_id", "grad_norm_logp", "reward") if c in run.tokens.columns]
    h = pd.util.hash_pandas_object(run.tokens[cols].astype(str), index=False).to_numpy()
    return hashlib.sha256(h.tobytes()).hexdigest()


def rescore(run: RunTables, *, verifier: str | None = None, rewards: str | Path | None = None,
            mask_truncated_completions: bool = False, seed: int = 0, n_boot: int | None = None,
            source: str | None = None, rho: float | None = None) -> RunTables:
    """A new run: ``run`` with rewards from ``verifier`` (a name) or the file ``rewards``, and/or its truncated
    answers masked (TRL's ``mask_truncated_completions``), every reward-dependent column and statistic
    recomputed. ``source``: how the run was named (recorded in ``rescored_from``; default its path)."""
    if verifier is not None and rewards is not None:
        raise GmtsError("re-scoring: give --verifier or --rewards, not both")
    if verifier is None and rewards is None and not mask_truncated_completions:
        raise GmtsError("re-scoring: give --verifier NAME, --rewards FILE or --mask-truncated-completions")
    settings, mode = _check_rescorable(run)
    t0 = time.perf_counter()
    ans = run.answers.copy()
    tok = run.tokens.copy()
    if verifier is not None:
        r, audit = verifier_rewards(run, verifier)
        for k in audit[0] if audit else ():
            ans[k] = [a[k] for a in audit]
        ans = _keep_recorded_copies(ans, run.answers)
        how = f"verifier {verifier}"
    elif rewards is not None:
        r = file_rewards(run, rewards)
        # the old verifier's facts no longer apply (a copied example is a fact of the answer and its prompt,
        # whoever scores it: copies_example stays)
        for k in ("verifier", "boxed", "fallback", "final_answer"):
            if k in ans.columns:
                ans = ans.drop(columns=k)
        how = f"file {rewards} (sha256 {file_sha256(rewards)})"
    else:
        r = ans["reward"].to_numpy(np.float64)
        how = "rewards as recorded"
    trunc = _truncated(ans) if mask_truncated_completions else None
    steps = ans["step"].tolist() if "step" in ans.columns else None
    A = adv_mod.compute_advantages(r, ans["group_id"].tolist(), mode, steps)
    W = adv_mod.loss_weights(ans["length"].astype(int).tolist(), settings.loss_agg, steps, settings.max_len,
                             truncated=trunc)
    ids = ans["answer_id"].tolist()
    ans["reward"], ans["advantage"], ans["loss_weight"] = r, A, W
    by = dict(zip(ids, r)), dict(zip(ids, A)), dict(zip(ids, W))
    tok["reward"] = tok["answer_id"].map(by[0]).astype(np.float64)
    tok["advantage"] = tok["answer_id"].map(by[1]).astype(np.float64)
    tok["loss_weight"] = tok["answer_id"].map(by[2]).astype(np.float64)
    tok["omega"] = _omega_columns(tok, by[1], by[2], settings)
    tok["grad_norm"] = times_abs_omega(tok["grad_norm_logp"].to_numpy(np.float64), tok["omega"].to_numpy())
    derived = [n for n, (needs, _) in ESTIMATORS.items() if "omega" in needs and n in tok.columns]
    order = list(tok.columns)
    tok = add_estimator_columns(tok.drop(columns=derived))[order]
    src_hash = run.manifest.get("run_hash") or _tables_hash(run)
    rescored = {"run": source if source is not None else (str(run.path) if run.path is not None else None),
                "run_hash": src_hash, "rewards": how, "mask_truncated_completions": bool(mask_truncated_completions)}
    nb = DEFAULT_N_BOOT if n_boot is None else n_boot
    stats = compute_stats(tok, ans, seed=seed, n_boot=nb, rho=manifest_rho(run.manifest) if rho is None else rho,
                          uncertain_below=manifest_uncertain_below(run.manifest), rescored_from=rescored)
    log.info("re-scored %d answers (%s%s) in %.1f s; update_fidelity needs the model: left empty", len(ans), how,
             ", truncated answers masked" if mask_truncated_completions else "", time.perf_counter() - t0)
    manifest = json.loads(json.dumps(run.manifest, default=str))
    for k in ("run_fingerprint", "distributed", "errors", "n_errors"):
        manifest.pop(k, None)
    manifest["rescored_from"] = rescored
    manifest["job"] = "gmts stats (re-scored)"
    manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cfg = manifest.setdefault("config", {})
    if isinstance(cfg, dict):
        cfg["mask_truncated_completions"] = bool(mask_truncated_completions) or bool(cfg.get("mask_truncated_completions"))
        if verifier is not None:
            cfg["verifier"] = verifier
    import hashlib

    manifest["run_hash"] = hashlib.sha256(json.dumps([src_hash, how, bool(mask_truncated_completions)])
                                          .encode()).hexdigest()
    return RunTables(tokens=tok, answers=ans, stats=json_normalise(stats), manifest=json_normalise(manifest),
                     grad_groups=run.grad_groups)
