"""Shared fixtures: tiny models saved to disk (loaded the way a user's checkpoint is) and rollouts."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _one_thread_session():
    """Module- and session-scoped fixtures (reference runs computed once and compared with
    torchrun ranks or CLI runs later) also run on one thread: float32 reductions depend on
    the thread count, and a reference made on two threads differs from a one-thread
    subprocess in the last bits, enough to swap near-tied ranks."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread per test: tiny models run fastest so, and a shared 2-core machine
    (or CI next to a browser or torchrun subprocesses) is not oversubscribed (2 threads were
    measured 5-30x slower there)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def plain_loop_grad_norms(model, input_ids, prompt_len, temperature=1.0):
    """The independent reference: one forward, then autograd.grad per response token over all
    trainable parameters (tied tensors once)."""
    from gmts_analysis.core.tokens import sequence_logprobs

    params = []
    seen = set()
    for p in model.parameters():  # parameters() already yields a shared tensor once
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    with torch.enable_grad():
        logits = model(input_ids=input_ids[None], use_cache=False).logits[0]
        lp = sequence_logprobs(logits, input_ids, prompt_len, temperature)
        out = []
        for t in range(lp.shape[0]):
            grads = torch.autograd.grad(lp[t], params, retain_graph=True, allow_unused=True)
            sq = sum((g.double() ** 2).sum() for g in grads if g is not None)
            out.append(float(sq) ** 0.5)
    return torch.tensor(out, dtype=torch.float64)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """``{arch: path}`` for tiny gpt2 (tied), llama (untied) and qwen2 (GQA, tied) checkpoints."""
    from gmts_analysis.toy.testing import save_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {arch: save_tiny_model(arch, root / arch, seed=1) for arch in ("gpt2", "llama", "qwen2")}


def make_rollouts(path, n_groups=3, group_size=3, seed=0, vocab=100, with_text=False, steps=False):
    """Random id rollouts with mixed rewards, uneven lengths; returns the path."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi in range(n_groups):
        prompt = [1] + torch.randint(4, vocab, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for j in range(group_size):
            L = int(torch.randint(3, 12, (1,), generator=g))
            row = {"prompt_ids": prompt, "response_ids": torch.randint(4, vocab, (L,), generator=g).tolist(),
                   "reward": float((gi + j) % 2), "answer_id": f"g{gi}-a{j}", "group_id": f"g{gi}",
                   "domain": ["alpha", "beta"][gi % 2]}
            if steps:
                row["step"] = gi % 2
            rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
