"""Supervised training of the shipped toy policies on reference traces of all three domains.

A policy is a Qwen2-architecture causal LM with tied embeddings (like Qwen2.5-0.5B)
over the 100-token character vocabulary. Training examples are ``<bos> prompt
response <eos>`` with the loss on response tokens and ``<eos>`` only; domains and
difficulty levels are drawn uniformly, prompts come from the ``train`` split only.

Mixed rewards by design: a fraction ``slip_rate`` of the training traces carries one
slipped step (a digit, value or truth value off by one, propagated consistently to the
final answer). A policy that fits this data samples such slips at temperature 1.0 with
about that rate, at the step where the reference slipped, so pass@1 stays well below 1
even where the task is mastered, and the wrong answers differ from the right ones at a
few genuinely uncertain tokens. Early stopping (``steps``) sets competence on top.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gmts_analysis.core.seeding import seeded_global_rng
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import DOMAINS, split_of
from gmts_analysis.toy.tokenizer import SPECIALS, build_char_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicySpec:
    """Architecture and training recipe of one shipped policy size."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    # per-domain share of training traces with one slipped step (a logic slip flips the
    # answer about half the time, a program slip about 70%, an arithmetic slip always)
    slip_rate: dict[str, float] = field(default_factory=lambda: {"arithmetic": 0.2, "program": 0.28, "logic": 0.4})
    max_position_embeddings: int = 256
    # steps at which AdamW restarts (fresh moments, warm-up again): a warm restart, with
    # the peak learning rate from then on (``restart_lrs``, aligned; default ``lr``)
    restart_steps: tuple[int, ...] = ()
    restart_lrs: tuple[float, ...] = ()
    # domain mixture from each restart on (aligned with restart_steps; None keeps the previous one)
    restart_weights: tuple[dict[str, float] | None, ...] = ()
    # per-domain sampling weights of the training mixture (uniform by default)
    domain_weights: dict[str, float] = field(default_factory=lambda: {"arithmetic": 1.0, "program": 1.0, "logic": 1.0})


SIZES: dict[str, PolicySpec] = {
    "tiny": PolicySpec("tiny", hidden_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
                       intermediate_size=288, steps=3000, lr=3e-3),
    "small": PolicySpec("small", hidden_size=192, num_layers=4, num_heads=6, num_kv_heads=3,
                        intermediate_size=704, steps=2800, lr=2.5e-3, restart_steps=(1050, 1650, 2100),
                        restart_lrs=(2.5e-3, 6e-4, 1.2e-3),
                        restart_weights=(None, None, {"arithmetic": 1.0, "program": 2.5, "logic": 0.5})),
}


def build_policy(spec: PolicySpec, vocab_size: int, seed: int = 0):
    """A freshly initialised ``Qwen2ForCausalLM`` for ``spec`` (float32, seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        use_sliding_window=False,
        rope_theta=10000.0,
        pad_token_id=SPECIALS.index("<pad>"),
        bos_token_id=SPECIALS.index("<bos>"),
        eos_token_id=SPECIALS.index("<eos>"),
    )

    with seeded_global_rng(seed):  # the constructor initialises from the global generator
        model = Qwen2ForCausalLM(config)
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError("expected tied input/output embeddings")
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (a tied tensor counted once)."""
    return sum(p.numel() for p in model.parameters())  # parameters() skips duplicates


def training_examples(
    seed: int,
    slip_rate: dict[str, float],
    weights: dict[str, float],
    switches: tuple[tuple[int, dict[str, float]], ...] = (),
) -> Iterator[tuple[str, str, str]]:
    """Endless ``(domain, prompt, response)`` stream from the ``train`` split; seeded.

    ``switches`` are ``(example index, weights)``: the mixture used from that example on.
    """
    rng = random.Random(f"gmts-toy-train/{seed}")
    pending = sorted(switches, key=lambda x: x[0])
    index = 0
    while True:
        while pending and pending[0][0] <= index:
            weights = pending.pop(0)[1]
        names = list(weights)
        name = rng.choices(names, [weights[n] for n in names])[0]
        dom = DOMAINS[name]
        p = dom.generate(rng, rng.choice(dom.difficulties))
        if split_of(name, p.prompt) != "train":
            continue
        response = p.solution
        if rng.random() < slip_rate.get(name, 0.0):
            try:
                response, _ = dom.solve(p.prompt, slip_rng=rng)
            except ValueError:  # a slip pushed a later value out of range: keep the clean trace
                pass
        index += 1
        yield name, p.prompt, response


def encode_batch(tokenizer: Any, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 outside responses + eos)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs, labels = [], []
    for prompt, response in pairs:
        p = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(lb)] = torch.tensor(lb)
        mask[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": lab}


def lr_at(step: int, spec: PolicySpec) -> float:
    """Linear warm-up (after the start and after each warm restart), then constant.

    No decay on purpose: the schedule does not depend on the total number of steps, so a
    run stopped early at step ``k`` is exactly the run with ``steps=k`` (early stopping is
    how competence is set, and snapshots of one run calibrate it).
    """
    peak, start = spec.lr, 0
    for i, r in enumerate(spec.restart_steps):
        if r <= step and r >= start:
            start = r
            peak = spec.restart_lrs[i] if i < len(spec.restart_lrs) else spec.lr
    since = step - start
    if since < spec.warmup_steps:
        return peak * (since + 1) / spec.warmup_steps
    return peak


def _optimizer(model: torch.nn.Module, spec: PolicySpec) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr, betas=(0.9, 0.98), eps=1e-8,
    )


def train_policy(
    size: str | PolicySpec,
    seed: int = 0,
    steps: int | None = None,
    threads: int | None = None,
    progress: bool = True,
    log_every: int = 50,
    callback: Callable[[int, torch.nn.Module, float], None] | None = None,
    callback_every: int = 0,
    init_model: torch.nn.Module | None = None,
    start_step: int = 0,
) -> tuple[torch.nn.Module, Any, dict]:
    """Train the ``size`` policy (a name in :data:`SIZES` or a spec) from scratch; returns
    ``(model, tokenizer, info)``.

    ``info`` holds the spec, parameter count, loss curve (mean per ``log_every`` steps)
    and training wall time in seconds. ``callback(step, model, train_seconds)``, e.g. an
    evaluation or a snapshot, runs in eval mode every ``callback_every`` steps; its time is
    not counted, and it does not change the training trajectory. ``init_model`` with
    ``start_step`` continues a run from its weights at ``start_step``, which must be a warm
    restart of the spec (no optimizer state to carry): the result equals the uninterrupted run. Deterministic for a seed on a given machine and thread count.
    """
    spec = _policy_spec(size)
    total = spec.steps if steps is None else int(steps)
    if threads:  # only when asked (gmts toy-train asks for 2, as the shipped runs)
        torch.set_num_threads(threads)
    tokenizer = build_char_tokenizer()
    model = _start_model(spec, len(tokenizer), seed, init_model, start_step)
    model.train()
    opt = _optimizer(model, spec)
    switches = tuple((r * spec.batch_size, w) for r, w in zip(spec.restart_steps, spec.restart_weights) if w)
    stream = training_examples(seed, spec.slip_rate, spec.domain_weights, switches)
    for _ in range(start_step * spec.batch_size):  # the data of the steps already taken
        next(stream)
    curve: list[dict] = []
    running, t0, t_callback = 0.0, time.perf_counter(), 0.0
    it = range(start_step, total)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc=f"toy-train {spec.name}", unit="step")
    for step in it:
        if step in spec.restart_steps and step > start_step:
            opt = _optimizer(model, spec)
        running += _sgd_step(model, opt, tokenizer, [next(stream) for _ in range(spec.batch_size)], lr_at(step, spec))
        if (step + 1) % log_every == 0 or step + 1 == total:
            n = min(step - start_step, step % log_every) + 1
            elapsed = time.perf_counter() - t0 - t_callback
            curve.append({"step": step + 1, "loss": running / n, "seconds": elapsed})
            log.info("step %d loss %.4f (%.0f s)", step + 1, running / n, elapsed)
            running = 0.0
        if callback is not None and callback_every and (step + 1) % callback_every == 0 and step + 1 < total:
            tc = time.perf_counter()
            model.eval()
            callback(step + 1, model, tc - t0 - t_callback)
            model.train()
            t_callback += time.perf_counter() - tc
    model.eval()
    info = {
        "spec": asdict(spec),
        "steps": total,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(model),
        "loss_curve": curve,
        "train_seconds": time.perf_counter() - t0 - t_callback,
        "examples_seen": total * spec.batch_size,
        "start_step": start_step,
    }
    return model, tokenizer, info


def _policy_spec(size: str | PolicySpec) -> PolicySpec:
    """The spec of ``size``: a name in :data:`SIZES`, or a spec itself."""
    if isinstance(size, PolicySpec):
        return size
    if size in SIZES:
        return SIZES[size]
    raise GmtsError(f"size: unknown size '{size}' (choose from {', '.join(SIZES)})")


def _start_model(spec: PolicySpec, vocab_size: int, seed: int, init_model: torch.nn.Module | None,
                 start_step: int) -> torch.nn.Module:
    """A fresh seeded policy, or ``init_model`` when continuing at the warm restart ``start_step``."""
    if init_model is None:
        if start_step:
            raise ValueError("start_step needs init_model")
        return build_policy(spec, vocab_size, seed)
    if start_step not in spec.restart_steps:
        raise ValueError(f"can only continue at a warm restart {spec.restart_steps}, not {start_step}")
    return init_model


def _sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokenizer: Any,
              batch: list[tuple[str, str, str]], lr: float) -> float:
    """One AdamW step at learning rate ``lr`` on ``(domain, prompt, response)`` examples (gradient clipped
    to norm 1); returns the batch's loss."""
    enc = encode_batch(tokenizer, [(p, r) for _, p, r in batch])
    for g in opt.param_groups:
        g["lr"] = lr
    loss = model(**enc).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach().item()
