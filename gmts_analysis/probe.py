"""One probe run: rollouts in, per-token and per-answer tables out (SPEC sections 2, 8).

Library use::

    model, tok = load_model("small")
    answers = read_rollouts("rollouts.jsonl", tok)
    result = probe_rollouts(model, tok, answers, ProbeConfig(model="small", rollouts=..., out=...))
    result.tokens  # one row per response token, SPEC section 2 columns

``run_probe(cfg)`` does the whole job and writes the run directory atomically.
"""

from __future__ import annotations

import logging
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from gmts_analysis import advantages as adv_mod
from gmts_analysis.config import ProbeConfig
from gmts_analysis.errors import GmtsError
from gmts_analysis.estimators import add_estimator_columns
from gmts_analysis.rollouts import Answer

log = logging.getLogger("gmts_analysis.probe")

# contract columns of tokens.parquet, in order (SPEC section 2)
TOKEN_COLUMNS = (
    "answer_id", "group_id", "position", "token_id", "token", "logprob", "prob", "entropy",
    "logit_grad_norm", "advantage", "loss_weight", "omega", "grad_norm_logp", "grad_norm", "gmts",
)


@dataclass
class ProbeResult:
    """Tables of one probe: ``tokens`` (one row per response token), ``answers`` (one per answer),
    ``grad_groups`` (with ``--grad-groups``), and timings in seconds."""

    tokens: pd.DataFrame
    answers: pd.DataFrame
    grad_groups: pd.DataFrame | None = None
    timings: dict = field(default_factory=dict)


@dataclass
class AnswerCoefficients:
    """Batch-level quantities of one answer (computed before any sharding)."""

    advantage: float
    loss_weight: float


def answer_coefficients(answers: Sequence[Answer], cfg: ProbeConfig) -> list[AnswerCoefficients]:
    """Advantages and aggregation weights from the whole batch (SPEC section 3)."""
    steps = [a.step for a in answers]
    has_steps = any(s is not None for s in steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", adv_mod.SingletonGroupWarning)
        adv = adv_mod.compute_advantages(
            [a.reward for a in answers], [a.group_id for a in answers], cfg.advantage,
            steps if has_steps else None,
        )
    for w in caught:
        log.warning("%s", w.message)
    weights = adv_mod.loss_weights(
        [a.length for a in answers], cfg.loss_agg, steps if has_steps else None, cfg.max_len
    )
    return [AnswerCoefficients(float(a), float(w)) for a, w in zip(adv, weights)]


class _TokenText:
    """Decode single tokens for display, cached by id."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            s = self.cache.get(i)
            if s is None:
                s = self.tok.decode([i]) if self.tok is not None else str(i)
                self.cache[i] = s
            out.append(s)
        return out


def _chunk_size(cfg: ProbeConfig) -> int | str:
    cs = cfg.chunk_size
    if cs in (None, "auto"):
        return "auto"
    try:
        v = int(cs)
    except (TypeError, ValueError):
        raise GmtsError(f"--chunk-size: expected an integer or 'auto', got '{cs}'") from None
    if v < 1:
        raise GmtsError(f"--chunk-size: must be at least 1, got {v}")
    return v


def probe_answer(
    model: torch.nn.Module,
    answer: Answer,
    coef: AnswerCoefficients,
    cfg: ProbeConfig,
    token_text: _TokenText | None = None,
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Probe one answer: returns its token columns (dict of equal-length arrays) and group norms."""
    from gmts_analysis.tokens import response_logits, response_targets, token_quantities

    device = next(model.parameters()).device
    ids = torch.tensor(answer.prompt_ids + answer.response_ids, dtype=torch.long, device=device)
    P, T = len(answer.prompt_ids), len(answer.response_ids)
    tau = float(cfg.temperature)
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    logits = out.logits[0]
    if not torch.isfinite(logits).all():
        raise GmtsError(f"{answer.where}: answer '{answer.answer_id}': the model produced non-finite logits")
    q = token_quantities(response_logits(logits, P), response_targets(ids, P), tau)
    hidden = out.hidden_states[-1][0, P - 1 : -1].float()
    h_sq = (hidden * hidden).sum(-1)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "bias", None) is not None:
        h_sq = h_sq + 1.0  # d logprob / d bias = (e_y - p) / tau
    head_gn = q.logit_grad_norm.float() * h_sq.sqrt()

    logprob = q.logprob.double().cpu().numpy()
    om = adv_mod.omega(
        coef.loss_weight, coef.advantage, logprob,
        old_logprob=None if answer.old_logprobs is None else np.asarray(answer.old_logprobs),
        ref_logprob=None if answer.ref_logprobs is None else np.asarray(answer.ref_logprobs),
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_beta=cfg.kl_beta,
    )
    entropy = q.entropy.double().cpu().numpy()
    cols: dict[str, Any] = {
        "answer_id": [answer.answer_id] * T,
        "group_id": [answer.group_id] * T,
        "position": np.arange(T, dtype=np.int64),
        "token_id": np.asarray(answer.response_ids, dtype=np.int64),
        "token": (token_text or _TokenText(None))(answer.response_ids),
        "logprob": logprob,
        "prob": q.prob.double().cpu().numpy(),
        "entropy": entropy,
        "logit_grad_norm": q.logit_grad_norm.double().cpu().numpy(),
        "advantage": np.full(T, coef.advantage),
        "loss_weight": np.full(T, coef.loss_weight),
        "omega": om,
        "gmts": entropy * np.abs(om),
        "head_grad_norm": head_gn.double().cpu().numpy(),
        "reward": np.full(T, answer.reward),
    }
    if answer.old_logprobs is not None:
        cols["ratio"] = np.exp(logprob - np.asarray(answer.old_logprobs))
    groups_df = None
    if cfg.grad_norm == "none" or T == 0:
        cols["grad_norm_logp"] = np.full(T, np.nan)
    else:
        from gmts_analysis.grads import grad_norms

        gn = grad_norms(
            model, ids, P, temperature=tau, method=cfg.grad_norm, chunk_size=_chunk_size(cfg),
            max_memory=None if cfg.max_memory is None else int(cfg.max_memory) * 2**20,
            probes=int(cfg.probes), seed=int(cfg.seed), groups=cfg.grad_groups,
        )
        cols["grad_norm_logp"] = gn.norms.double().cpu().numpy()
        if gn.lo is not None:
            cols["grad_norm_logp_lo"] = gn.lo.double().cpu().numpy()
            cols["grad_norm_logp_hi"] = gn.hi.double().cpu().numpy()
        if gn.groups:
            names = list(gn.groups)
            sq = np.stack([gn.groups[n].double().cpu().numpy() for n in names], axis=1)  # (T, G)
            groups_df = pd.DataFrame({
                "answer_id": [answer.answer_id] * (T * len(names)),
                "position": np.repeat(np.arange(T), len(names)),
                "group": names * T,
                "grad_norm_logp": np.sqrt(sq).reshape(-1),
            })
    cols["grad_norm"] = np.abs(om) * cols["grad_norm_logp"]
    for k in ("domain", "step"):
        v = getattr(answer, k)
        if v is not None:
            cols[k] = [v] * T
    return cols, groups_df


def _id_column(values: list) -> list:
    """Keep ids as ints when all are ints, else strings (parquet needs one type)."""
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return [int(v) for v in values]
    return [str(v) for v in values]


def answers_table(answers: Sequence[Answer], coefs: Sequence[AnswerCoefficients]) -> pd.DataFrame:
    """One row per answer (SPEC section 8): ids, reward, advantage, length, texts, extras."""
    rows = []
    for a, c in zip(answers, coefs):
        row = {"answer_id": a.answer_id, "group_id": a.group_id, "reward": a.reward, "advantage": c.advantage,
               "length": a.length, "loss_weight": c.loss_weight, "prompt": a.prompt, "response": a.response}
        if a.domain is not None:
            row["domain"] = a.domain
        if a.step is not None:
            row["step"] = a.step
        for k, v in a.extra.items():
            row.setdefault(k, v)
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in ("answer_id", "group_id"):
        df[k] = _id_column(list(df[k]))
    return df


def probe_rollouts(
    model: torch.nn.Module,
    tokenizer: Any,
    answers: Sequence[Answer],
    cfg: ProbeConfig,
    coefs: Sequence[AnswerCoefficients] | None = None,
    progress: bool | None = None,
) -> ProbeResult:
    """Probe every answer; returns the tables (nothing is written).

    ``coefs`` (advantages and weights) default to those of ``answers`` as one batch; pass
    them to probe a subset with batch-wide values. Rows come in input order, by position.
    """
    from tqdm.auto import tqdm

    if coefs is None:
        coefs = answer_coefficients(answers, cfg)
    if progress is None:
        progress = not cfg.quiet
    token_text = _TokenText(tokenizer)
    parts: list[dict] = []
    gparts: list[pd.DataFrame] = []
    t0 = time.perf_counter()
    n_tok = 0
    bar = tqdm(total=len(answers), desc="probe", unit="answer", disable=not progress, dynamic_ncols=True)
    try:
        for a, c in zip(answers, coefs):
            cols, g = probe_answer(model, a, c, cfg, token_text)
            parts.append(cols)
            if g is not None:
                gparts.append(g)
            n_tok += a.length
            bar.update(1)
            bar.set_postfix(tok_s=f"{n_tok / max(time.perf_counter() - t0, 1e-9):.1f}")
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    tokens = _concat_columns(parts)
    add_estimator_columns(tokens)
    groups = pd.concat(gparts, ignore_index=True) if gparts else None
    if groups is not None:
        groups["answer_id"] = _id_column(list(groups["answer_id"]))
    return ProbeResult(
        tokens=tokens, answers=answers_table(answers, coefs), grad_groups=groups,
        timings={"probe_s": elapsed, "tokens_per_s": n_tok / elapsed if elapsed > 0 else float("nan")},
    )


def _concat_columns(parts: list[dict]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame({c: [] for c in TOKEN_COLUMNS})
    keys: list[str] = []
    for p in parts:
        for k in p:
            if k not in keys:
                keys.append(k)
    data = {}
    for k in keys:
        vals: list = []
        for p in parts:
            n = len(p["position"])
            v = p.get(k)
            vals.extend(list(v) if v is not None else [None] * n)
        data[k] = vals
    df = pd.DataFrame(data)
    for k in ("answer_id", "group_id"):
        df[k] = _id_column(list(df[k]))
    order = [c for c in TOKEN_COLUMNS if c in df.columns] + [c for c in df.columns if c not in TOKEN_COLUMNS]
    return df[order]


# ---------------------------------------------------------------- the whole job

def package_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("gmts_analysis", "torch", "transformers", "numpy", "pandas", "scipy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            if name == "gmts_analysis":
                from gmts_analysis import __version__

                out[name] = __version__
    return out


def build_manifest(cfg: ProbeConfig, model: torch.nn.Module, model_path: str, result: ProbeResult,
                   extra: dict | None = None) -> dict:
    """The run's metadata (SPEC section 8)."""
    from gmts_analysis.models import trainable_parameters

    dev = next(model.parameters()).device
    method = cfg.grad_norm
    m = {
        "config": asdict(cfg),
        "model_path": model_path,
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "n_parameters": int(sum(p.numel() for _, p in trainable_parameters(model))),
        "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "versions": package_versions(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "dtype": cfg.dtype,
        "grad_norm_method": method,
        "seed": cfg.seed,
        "n_answers": int(len(result.answers)),
        "n_tokens": int(len(result.tokens)),
        "n_groups": int(result.answers["group_id"].nunique()) if len(result.answers) else 0,
        "timings": result.timings,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if method == "sketch":
        m["probes"] = cfg.probes
    if extra:
        m.update(extra)
    return m


def _verifier(name: str | None):
    """A TRL-shaped reward function: a toy domain's verifier, or ``domain`` (per-row dispatch)."""
    if not name:
        return None
    from gmts_analysis.toy.verifiers import REWARD_FUNCTIONS, toy_reward

    if name == "domain":
        return toy_reward
    if name not in REWARD_FUNCTIONS:
        raise GmtsError(f"--verifier: unknown verifier '{name}' (choose from domain, {', '.join(REWARD_FUNCTIONS)})")
    return REWARD_FUNCTIONS[name]


def run_probe(cfg: ProbeConfig) -> Path:
    """Load, read, probe, compute statistics (and fidelity, figures, report); write ``cfg.out``.

    One process, or every rank of a torchrun job (each takes a share of whole groups; rank 0
    merges). Work is recorded chunk by chunk in ``cfg.out``: the same command run again
    after a crash resumes; the finished files appear only once everything is done (see
    :mod:`gmts_analysis.dist` and docs/scaling.md).
    """
    from gmts_analysis.dist import run_sharded

    return run_sharded(cfg)


def fidelity_enabled(cfg: ProbeConfig, n_tokens: int) -> bool:
    if cfg.fidelity == "on":
        return True
    if cfg.fidelity == "off" or cfg.grad_norm == "none":
        return False
    return n_tokens < 100_000


def write_run(cfg: ProbeConfig, model: torch.nn.Module, model_path: str, answers: Sequence[Answer],
              result: ProbeResult, extra: dict | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """Statistics, fidelity, manifest, figures and report; the directory appears complete or not at all.

    ``extra_files`` maps file names to text written into the run directory too (e.g. the
    sampled ``rollouts.jsonl`` of ``gmts run``).
    """
    from gmts_analysis import io
    from gmts_analysis.stats import compute_stats

    t0 = time.perf_counter()
    stats = compute_stats(result.tokens, result.answers, seed=cfg.seed)
    result.timings["stats_s"] = time.perf_counter() - t0
    if fidelity_enabled(cfg, len(result.tokens)):
        from gmts_analysis.fidelity import fidelity_for_run

        t0 = time.perf_counter()
        stats.update(fidelity_for_run(model, answers, result.tokens, cfg, stats=stats))
        result.timings["fidelity_s"] = time.perf_counter() - t0
    manifest = build_manifest(cfg, model, model_path, result, extra)
    with io.staged_directory(cfg.out, overwrite=cfg.overwrite) as tmp:
        io.atomic_write_parquet(tmp / "tokens.parquet", result.tokens)
        io.atomic_write_parquet(tmp / "answers.parquet", result.answers)
        if result.grad_groups is not None:
            io.atomic_write_parquet(tmp / "grad_groups.parquet", result.grad_groups)
        io.atomic_write_json(tmp / "stats.json", stats)
        io.atomic_write_json(tmp / "manifest.json", manifest)
        for name, text in (extra_files or {}).items():
            io.atomic_write_text(tmp / name, text)
        if cfg.figures:
            from gmts_analysis.plots import render_all
            from gmts_analysis.report import write_report

            t0 = time.perf_counter()
            render_all(tmp)
            write_report(tmp)
            manifest["timings"]["figures_s"] = time.perf_counter() - t0
            io.atomic_write_json(tmp / "manifest.json", manifest)
    return Path(cfg.out)

