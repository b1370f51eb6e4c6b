"""Update fidelity: how well the update of the selected tokens reproduces the full update.

For a selection S of response tokens the policy-gradient update restricted to S is

    g_S = sum_{(i,t) in S} omega_{i,t} * grad_theta logprob_{i,t}

(one flat float32 vector over :func:`gmts_analysis.engine.params.trainable_parameters`, every tied
tensor once). The full policy gradient is g_all (every token selected). For each selection
we report ``cosine(g_S, g_all)`` and ``norm_ratio = ||g_S|| / ||g_all||``.

Selections (top-``rho`` in ``scope``, docs/definitions.md section 5) are made from the tokens table:
one per estimator, plus the references ``all`` (every token; cosine and ratio 1 by
construction), ``oracle`` (top by grad_norm) and ``random`` (uniform scores; the mean of
``n_random`` draws, their standard deviations under ``random_std``).

Cost: one forward per answer, then one backward per distinct selection of the answer's
tokens (``retain_graph``; selections keeping the same tokens of an answer share it); memory: ``n_selections * n_params * 4`` bytes for the accumulators,
checked against ``memory_budget_bytes`` before any work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from gmts_analysis.core.estimators import add_estimator_columns, available
from gmts_analysis.core.seeding import numpy_rng
from gmts_analysis.core.selection import select_top
from gmts_analysis.core.tokens import sequence_logprobs
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.progress import tqdm

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 2 * 1024**3  # bytes for the per-selection gradient accumulators


def fidelity_selections(
    tokens: pd.DataFrame,
    estimators: Iterable[str],
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    n_random: int = 5,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """``{name: boolean mask over tokens rows}`` for ``all``, ``oracle``, each estimator and
    ``random_0..random_{n_random-1}`` (uniform random scores from
    ``gmts_analysis.core.seeding.numpy_rng(seed, "fidelity", "random")``)."""
    df = add_estimator_columns(tokens.copy())
    sels: dict[str, np.ndarray] = {"all": np.ones(len(df), dtype=bool)}
    if "grad_norm" in df.columns and df["grad_norm"].notna().any():
        sels["oracle"] = select_top(df, "grad_norm", rho, scope)
    for s in estimators:
        if s not in df.columns:
            raise GmtsError(f"update fidelity: estimator column '{s}' not in the tokens table")
        sels[s] = select_top(df, s, rho, scope)
    rng = numpy_rng(int(seed), "fidelity", "random")
    for j in range(n_random):
        sels[f"random_{j}"] = select_top(df, rng.random(len(df)), rho, scope)
    return sels


def selection_gradients(
    model: torch.nn.Module,
    batches: Iterable[tuple[object, torch.Tensor, int]],
    tokens: pd.DataFrame,
    masks: dict[str, np.ndarray],
    temperature: float = 1.0,
    memory_budget_bytes: int = DEFAULT_BUDGET,
    progress: bool = False,
    max_batch_tokens: int = 512,
) -> dict[str, torch.Tensor]:
    """``{name: g_S}``: flat float32 gradients of ``sum_{t in S} omega_t * logprob_t``.

    Answers are packed into right-padded micro-batches of at most ``max_batch_tokens``
    tokens (fewer for large vocabularies); each micro-batch takes one forward and one
    backward per distinct selection of its tokens.

    batches: ``(answer_id, input_ids (S,), prompt_len)`` per answer, on the model's device;
    every answer of ``tokens`` must appear once, with ``S - prompt_len`` equal to its number
    of rows. tokens: the tokens table (``answer_id``, ``position``, ``omega``). masks: boolean
    row masks over ``tokens`` (see :func:`fidelity_selections`). The model is left as given
    (no ``.grad`` is written; gradients come from ``torch.autograd.grad``).
    """
    params = [p for _, p in trainable_parameters(model)]
    n_params = sum(p.numel() for p in params)
    need = len(masks) * n_params * 4
    if need > memory_budget_bytes:
        raise GmtsError(
            f"update fidelity needs {need / 1e9:.2f} GB for {len(masks)} gradients of {n_params:,} parameters "
            f"(budget {memory_budget_bytes / 1e9:.2f} GB): skip it (--fidelity off) or use fewer estimators"
        )
    if "omega" not in tokens.columns:
        raise GmtsError("update fidelity needs the 'omega' column of the tokens table")
    device = params[0].device
    names = list(masks)
    acc = {k: torch.zeros(n_params, dtype=torch.float32, device=device) for k in names}
    rows_of = tokens.groupby("answer_id", sort=False).indices
    positions = tokens["position"].to_numpy()
    omegas = tokens["omega"].to_numpy(dtype=np.float64)
    mask_matrix = np.stack([np.asarray(masks[k], dtype=bool) for k in names], axis=1)  # (rows, K)
    vocab = int(model.get_input_embeddings().weight.shape[0]) if hasattr(model, "get_input_embeddings") else 50_000
    token_budget = max(1, min(max_batch_tokens, int(2e8 // (4 * max(vocab, 1)))))
    seen: set = set()
    it = batches
    if progress:
        it = tqdm(batches, desc="update fidelity", unit="answer", leave=False)
    pending: list[tuple[torch.Tensor, int, np.ndarray]] = []
    pending_tokens = 0
    for answer_id, input_ids, prompt_len in it:
        if answer_id not in rows_of:
            raise GmtsError(f"update fidelity: answer {answer_id!r} is not in the tokens table")
        if answer_id in seen:
            raise GmtsError(f"update fidelity: answer {answer_id!r} given twice")
        seen.add(answer_id)
        rows = rows_of[answer_id]
        pos = positions[rows]
        order = np.argsort(pos, kind="stable")
        rows = rows[order]
        T = int(input_ids.shape[-1]) - int(prompt_len)
        if T != len(rows) or not np.array_equal(pos[order], np.arange(T)):
            raise GmtsError(
                f"update fidelity: answer {answer_id!r} has {T} response tokens but {len(rows)} rows "
                "(positions 0..T-1 expected)"
            )
        if not (omegas[rows] != 0).any():
            continue  # no selection of this answer contributes
        if pending and pending_tokens + int(input_ids.shape[-1]) > token_budget:
            _accumulate(model, params, pending, omegas, mask_matrix, names, acc, temperature)
            pending, pending_tokens = [], 0
        pending.append((input_ids, int(prompt_len), rows))
        pending_tokens += int(input_ids.shape[-1])
    if pending:
        _accumulate(model, params, pending, omegas, mask_matrix, names, acc, temperature)
    missing = set(rows_of) - seen
    if missing:
        raise GmtsError(f"update fidelity: {len(missing)} answer(s) of the tokens table were not given, e.g. {next(iter(missing))!r}")
    return acc


def _accumulate(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    pending: list[tuple[torch.Tensor, int, np.ndarray]],
    omegas: np.ndarray,
    mask_matrix: np.ndarray,
    names: list[str],
    acc: dict[str, torch.Tensor],
    temperature: float,
) -> None:
    """One right-padded forward of the answers in ``pending``, then one backward per distinct
    selection restricted to them; adds each g_S into ``acc``. Right padding leaves every real
    position's logits as they are (causal attention, positions counted from 0)."""
    device = params[0].device
    lengths = [int(ids.shape[-1]) for ids, _, _ in pending]
    S = max(lengths)
    batch = torch.zeros((len(pending), S), dtype=torch.long, device=device)
    attn = torch.zeros((len(pending), S), dtype=torch.long, device=device)
    for b, (ids, _, _) in enumerate(pending):
        batch[b, : lengths[b]] = ids
        attn[b, : lengths[b]] = 1
    rows = np.concatenate([r for _, _, r in pending])
    omega = torch.as_tensor(omegas[rows], device=device)
    sub = mask_matrix[rows] & (omegas[rows] != 0)[:, None]  # (n_rows, K)
    same: dict[bytes, list[str]] = {}
    for j, k in enumerate(names):
        col = sub[:, j]
        if col.any():
            same.setdefault(col.tobytes(), []).append(k)
    if not same:
        return
    with torch.enable_grad():
        logits = model(input_ids=batch, attention_mask=attn, use_cache=False).logits
        logp = torch.cat([
            sequence_logprobs(logits[b, : lengths[b]], batch[b, : lengths[b]], P, temperature)
            for b, (_, P, _) in enumerate(pending)
        ])  # (n_rows,), rows in the order of ``rows``
        todo = list(same.items())
        for j, (mbytes, keys) in enumerate(todo):
            m = torch.as_tensor(np.frombuffer(mbytes, dtype=bool).copy(), device=device)
            c = torch.where(m, omega, torch.zeros_like(omega)).to(logp.dtype)
            grads = torch.autograd.grad((c * logp).sum(), params, retain_graph=j < len(todo) - 1, allow_unused=True)
            flat = torch.cat(
                [(g if g is not None else torch.zeros_like(p)).reshape(-1).float() for g, p in zip(grads, params)]
            )
            for k in keys:
                acc[k] += flat


def _nanmean(v: list[float]) -> float:
    a = np.asarray(v, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if len(a) else math.nan


def _nanstd(v: list[float]) -> float:
    a = np.asarray(v, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.std(ddof=1)) if len(a) > 1 else math.nan


def compare(g: torch.Tensor, g_all: torch.Tensor) -> dict[str, float]:
    """``{cosine, norm_ratio}`` of g against g_all (float64 reductions; NaN when undefined)."""
    a, b = g.double(), g_all.double()
    na, nb = float(a.norm()), float(b.norm())
    cos = float(a @ b) / (na * nb) if na > 0 and nb > 0 else float("nan")
    ratio = na / nb if nb > 0 else float("nan")
    return {"cosine": cos, "norm_ratio": ratio}


def update_fidelity(
    model: torch.nn.Module,
    batches: Iterable[tuple[object, torch.Tensor, int]],
    tokens: pd.DataFrame,
    estimators: Iterable[str],
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    temperature: float = 1.0,
    n_random: int = 5,
    seed: int = 0,
    memory_budget_bytes: int = DEFAULT_BUDGET,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """The ``update_fidelity`` block of stats.json (docs/definitions.md section 6).

    model: the policy (any device/dtype; left unchanged). batches: iterable of
    ``(answer_id, input_ids (S,) LongTensor on the model's device, prompt_len)``, one per answer
    of ``tokens`` (it is consumed once). tokens: the tokens table of those answers (``omega``,
    ``grad_norm`` and the estimator columns). temperature: the tau of the probe.
    Returns ``{"all", "oracle", <estimators...>, "random": {cosine, norm_ratio}}`` plus
    ``"random_std"`` (every entry has exactly the keys ``cosine`` and ``norm_ratio``).
    Raises :class:`GmtsError` when the accumulators would exceed ``memory_budget_bytes``.
    """
    estimators = list(estimators)
    masks = fidelity_selections(tokens, estimators, rho, scope, n_random, seed)
    grads = selection_gradients(model, batches, tokens, masks, temperature, memory_budget_bytes, progress)
    return fidelity_block(grads, [k for k in masks if not k.startswith("random_")], n_random)


def fidelity_block(grads: dict[str, torch.Tensor], names: list[str], n_random: int, prefix: str = "") -> dict:
    """The ``update_fidelity`` block from the selections' gradients ``grads`` (keys ``prefix + name``):
    ``{name: compare(g_name, g_all)}`` for ``names``, and ``random`` / ``random_std`` (mean and
    standard deviation over the ``random_<j>`` draws)."""
    g_all = grads[prefix + "all"]
    out = {k: compare(grads[prefix + k], g_all) for k in names}
    if n_random > 0:
        rnd = [compare(grads[f"{prefix}random_{j}"], g_all) for j in range(n_random)]
        out["random"] = {m: _nanmean([r[m] for r in rnd]) for m in ("cosine", "norm_ratio")}
        out["random_std"] = {m: _nanstd([r[m] for r in rnd]) for m in ("cosine", "norm_ratio")}
    return out


def _slices(tokens: pd.DataFrame) -> dict[str, tuple[str, str, np.ndarray]]:
    """``{prefix: (section, value, row mask)}`` for the by_domain / by_step slices of a table."""
    out = {}
    for col, section in (("domain", "by_domain"), ("step", "by_step")):
        if col in tokens.columns and tokens[col].notna().any():
            for v in sorted(tokens[col].dropna().unique(), key=str):
                out[f"{col}={v}|"] = (section, str(v), (tokens[col] == v).to_numpy())
    return out


def fidelity_for_run(
    model: torch.nn.Module,
    answers: Iterable,
    tokens: pd.DataFrame,
    *,
    temperature: float,
    seed: int,
    progress: bool = False,
    slices: bool = True,
    estimators: Iterable[str] | None = None,
    rho: float = DEFAULT_RHO,
    n_random: int = 5,
    memory_budget_bytes: int = DEFAULT_BUDGET,
) -> dict:
    """Update fidelity of a probe run, as keyword arguments of
    :func:`gmts_analysis.analysis.stats.compute_stats` (which alone shapes stats.json):
    ``{"fidelity": block, "fidelity_by_domain": {domain: block}, "fidelity_by_step": {step: block}}``.

    answers: the probe's :class:`gmts_analysis.readers.rollouts.Answer` objects (answers missing from
    ``tokens``, e.g. failed or empty ones, are skipped); tokens: the probe's tokens table;
    temperature: the sampling temperature tau; seed: of the random selections; progress: the bar.
    estimators: default every estimator present. With ``slices``, the per-domain and per-step blocks
    too (for the table's ``domain`` and ``step`` values), in the same pass over the answers, when
    their accumulators fit the memory budget (else only the overall block, with a warning). Batch
    scope, ``rho`` (0.2 by default), ``n_random`` random draws.
    """
    df = add_estimator_columns(tokens.copy()).reset_index(drop=True)
    ests = list(estimators) if estimators is not None else available(df)
    seed = int(seed)
    masks = fidelity_selections(df, ests, rho, "batch", n_random, seed)
    keys_overall = list(masks)
    slices = _slices(df) if slices else {}
    if slices:
        n_params = sum(p.numel() for _, p in trainable_parameters(model))
        n_total = len(masks) * (1 + len(slices))
        if n_total * n_params * 4 > memory_budget_bytes:
            log.warning("update fidelity per domain/step skipped: %d gradients of %d parameters exceed the budget",
                        n_total, n_params)
            slices = {}
    for prefix, (_, _, rows) in slices.items():
        sub = df[rows].reset_index(drop=True)
        sub_masks = fidelity_selections(sub, ests, rho, "batch", n_random, seed)
        for k, m in sub_masks.items():
            full = np.zeros(len(df), dtype=bool)
            full[np.flatnonzero(rows)] = m
            masks[prefix + k] = full
    present = set(df["answer_id"].tolist())
    as_str = df["answer_id"].dtype == object and not any(isinstance(v, (int, np.integer)) for v in present)
    device = next(model.parameters()).device

    def batches():
        for a in answers:
            aid = a.answer_id
            if aid not in present and as_str and str(aid) in present:
                aid = str(aid)
            if aid not in present or a.length == 0:
                continue
            ids = torch.tensor(list(a.prompt_ids) + list(a.response_ids), dtype=torch.long, device=device)
            yield aid, ids, len(a.prompt_ids)

    grads = selection_gradients(model, batches(), df, masks, float(temperature),
                                memory_budget_bytes, progress=progress)

    def block(prefix: str) -> dict:
        return fidelity_block(grads, [k for k in keys_overall if not k.startswith("random_")], n_random, prefix)

    out: dict = {"fidelity": block(""), "fidelity_by_domain": {}, "fidelity_by_step": {}}
    for prefix, (section, value, _) in slices.items():
        out["fidelity_" + section][value] = block(prefix)
    return out
