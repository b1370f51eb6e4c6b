"""The engines' memory budget and out-of-memory back-off, on CPU with simulated allocation failures
(engine/memory.py, the retry of run/sharding/worker.py), and the sketch's random stream."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _sharding_helpers import probe_args, tokens

from gmts_analysis.cli import main
from gmts_analysis.engine import frozen_for_transforms, grad_norms, memory, sketch
from gmts_analysis.engine.exact import ExactEngine, default_budget, model_acc_dtype
from gmts_analysis.engine.plan import LinearRule
from gmts_analysis.toy.testing import build_tiny_model


def _rollouts(path, lengths, seed=0):
    """One group per answer (advantage 0 is fine: the norms do not depend on it)."""
    rnd = np.random.default_rng(seed)
    rows = [{"prompt_ids": [1, 5, 6, 7], "response_ids": rnd.integers(4, 90, n).tolist(), "reward": 1.0,
             "answer_id": f"a{i}", "group_id": f"g{i}"} for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _oom(msg="CUDA out of memory. Tried to allocate 2.00 GiB (simulated)"):
    return torch.OutOfMemoryError(msg)

def _oom_above(monkeypatch, limit: int) -> list[int]:
    """Make the exact engine run out of memory on any chunk of more than ``limit`` tokens; returns the list
    of chunk sizes tried (filled as the probe runs)."""
    real = ExactEngine.chunk
    seen: list[int] = []

    def chunk(self, input_ids, P, s, e, temperature, sub=None):
        used = min(sub or e - s, e - s)
        seen.append(used)
        if used > limit:
            raise _oom()
        return real(self, input_ids, P, s, e, temperature, sub)

    monkeypatch.setattr(ExactEngine, "chunk", chunk)
    return seen



def test_exact_retries_halve_the_chunk_used_last(tmp_path, monkeypatch):
    """A chunk of more than 64 tokens runs out of memory: 256 -> 128 -> 64, then the answer is
    probed at 64 tokens per VJP with the norms of an undisturbed run."""
    from gmts_analysis.toy.testing import save_tiny_model

    model = save_tiny_model("qwen2", tmp_path / "m", seed=1, max_len=512)
    r = _rollouts(tmp_path / "r.jsonl", [300])
    ref = tmp_path / "ref"
    assert main(probe_args(model, r, ref, "--chunk-size", "64")) == 0
    seen = _oom_above(monkeypatch, 64)
    out = tmp_path / "run"
    assert main(probe_args(model, r, out, "--chunk-size", "256")) == 0
    assert seen == [256, 128, 64, 64, 64, 64, 44]
    got, want = tokens(out), tokens(ref)
    assert set(got.grad_norm_method) == {"exact"}
    np.testing.assert_allclose(got.grad_norm_logp, want.grad_norm_logp, rtol=1e-5)
    assert json.loads((out / "manifest.json").read_text())["n_out_of_memory"] == 0


def test_sketch_retries_halve_the_directions_per_batch(tiny_model_dirs, tmp_path, monkeypatch):
    """The sketch's retry halves its directions per JVP (the chunk size does not bound it):
    32 -> 16 -> 8, then four batches of 8; the run records its stream's device."""
    model = tiny_model_dirs["qwen2"]
    r = _rollouts(tmp_path / "r.jsonl", [12])
    real = sketch._directions
    seen = []

    def directions(gen, k, *a, **kw):
        seen.append(k)
        if k > 8:
            raise _oom()
        return real(gen, k, *a, **kw)

    monkeypatch.setattr(sketch, "_directions", directions)
    out = tmp_path / "run"
    assert main(probe_args(model, r, out, "--grad-norm", "sketch", "--probes", "32")) == 0
    assert seen == [32, 16, 8, 8, 8, 8]
    t = tokens(out)
    assert set(t.grad_norm_method) == {"sketch"} and t.grad_norm_logp.notna().all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["sketch_stream_device"] == "cpu" and m["probes"] == 32


def test_batch_limit_halves_to_a_floor():
    lim = memory.BatchLimit()
    assert lim.halved("tokens", 256) == memory.BatchLimit(tokens=128)
    assert lim.halved("directions", 3) == memory.BatchLimit(directions=1)
    assert lim.halved("tokens", 1) is None and lim.halved("directions", 1) is None
    assert memory.current_limit() == memory.BatchLimit()
    with memory.batch_limit(memory.BatchLimit(tokens=64)):
        assert memory.limited_chunking("auto", None) == ("auto", 64)  # blocks of at most 64 (GPU auto)
        assert memory.limited_chunking("auto", 16) == ("auto", 16)  # CPU blocks are smaller already
        assert memory.limited_chunking(256, None) == (64, None)
        assert memory.limited_chunking(32, None) == (32, None)
    assert memory.limited_chunking(256, None) == (256, None)


def test_noting_batch_keeps_the_innermost_and_ignores_other_errors():
    with pytest.raises(torch.OutOfMemoryError) as ei:
        with memory.noting_batch("tokens", 128):
            with memory.noting_batch("directions", 4):
                raise _oom()
    assert memory.batch_of(ei.value) == ("directions", 4)
    with pytest.raises(ValueError) as ei:
        with memory.noting_batch("tokens", 128):
            raise ValueError("not memory")
    assert memory.batch_of(ei.value) is None
    assert memory.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"))
    assert not memory.is_out_of_memory(RuntimeError("shape mismatch"))


def _engine(model, ids):
    engine = ExactEngine(model, model_acc_dtype(model))
    with frozen_for_transforms(model):
        engine.install(ids[:8])
        engine.remove()
    return engine


def test_exact_budget_follows_free_device_memory(monkeypatch):
    model = build_tiny_model("qwen2")
    ids = torch.randint(3, 64, (40,), generator=torch.Generator().manual_seed(0))
    engine = _engine(model, ids)
    base = default_budget(engine, 40)
    assert memory.exact_budget(engine, 40, "cpu") == base  # no GPU: the estimate alone, as before
    monkeypatch.setattr(memory, "free_device_memory", lambda device: 1 << 40)
    assert memory.exact_budget(engine, 40, "cuda") == base
    free = 64 << 20
    monkeypatch.setattr(memory, "free_device_memory", lambda device: free)
    want = int(memory.HEADROOM * free) - memory.kept_bytes(engine, 40)
    assert 0 < want < base and memory.exact_budget(engine, 40, "cuda") == want
    monkeypatch.setattr(memory, "free_device_memory", lambda device: 1000)
    assert memory.exact_budget(engine, 40, "cuda") == 1  # nothing free: one token per VJP


def test_kept_bytes_counts_float32_copies_of_linear_inputs_for_bf16():
    ids = torch.randint(3, 64, (40,), generator=torch.Generator().manual_seed(0))
    e16 = _engine(build_tiny_model("qwen2", dtype=torch.bfloat16), ids)
    e32 = _engine(build_tiny_model("qwen2"), ids)
    L = 40
    copies = 4 * L * sum(e16.plan.widths[t.name][0] for t in e16.plan.taps if isinstance(t.rule, LinearRule))
    assert copies > 0
    # the same model in bfloat16: the model-dtype parts halve, the float32 copies come on top
    k16, k32 = memory.kept_bytes(e16, L), memory.kept_bytes(e32, L)
    assert k16 >= copies and k16 - copies < k32


def test_small_free_memory_shrinks_both_engines_batches(monkeypatch):
    """With (simulated) almost no free device memory the exact engine takes one token per VJP and
    the sketch one direction per JVP: same exact norms, a sketch with the same directions count."""
    model = build_tiny_model("llama")
    ids = torch.randint(3, 64, (30,), generator=torch.Generator().manual_seed(1))
    ref = grad_norms(model, ids, 6)
    subs, ks = [], []
    real_chunk, real_dirs = ExactEngine.chunk, sketch._directions

    def chunk(self, input_ids, P, s, e, temperature, sub=None):
        subs.append(sub)
        return real_chunk(self, input_ids, P, s, e, temperature, sub)

    def directions(gen, k, *a, **kw):
        ks.append(k)
        return real_dirs(gen, k, *a, **kw)

    monkeypatch.setattr(ExactEngine, "chunk", chunk)
    monkeypatch.setattr(sketch, "_directions", directions)
    monkeypatch.setattr(memory, "free_device_memory", lambda device: 1000)
    got = grad_norms(model, ids, 6)
    assert set(subs) == {1}
    torch.testing.assert_close(got.norms, ref.norms, rtol=1e-5, atol=0)
    sk = grad_norms(model, ids, 6, method="sketch", probes=6)
    assert ks == [1] * 6 and bool(torch.isfinite(sk.norms).all())


def test_directions_on_cpu_are_the_stream_drawn_before():
    """On the CPU the device generator draws exactly what the CPU generator drew before (one
    randn per parameter in the accumulation dtype, then cast): CPU results are unchanged."""
    model = build_tiny_model("gpt2", dtype=torch.bfloat16)
    prim = {n: p.detach() for n, p in model.named_parameters() if "wte" not in n}
    emb = {"wte": model.transformer.wte}
    uniq = {"wte": torch.arange(7)}
    acc = torch.float32
    tr, te = sketch._directions(sketch.stream_generator("cpu", 5), 3, prim, emb, uniq, acc)
    old = torch.Generator(device="cpu").manual_seed(5)
    for n, p in prim.items():
        want = torch.randn((3,) + tuple(p.shape), generator=old, dtype=acc).to(p.dtype)
        assert torch.equal(tr[n], want), n
    assert torch.equal(te["wte"], torch.randn((3, 7, model.config.n_embd), generator=old, dtype=acc).to(torch.bfloat16))
    assert sketch.stream_generator("cpu", 5).device.type == "cpu"


def test_skipped_line_from_the_manifest(tmp_path):
    """The summary line is built from the manifest alone (gmts probe and gmts run print it)."""
    from gmts_analysis.run.sharding.merge import skipped_line

    (tmp_path / "manifest.json").write_text(json.dumps({"n_errors": 2, "n_out_of_memory": 1, "n_answers": 8}))
    line = skipped_line(tmp_path)
    assert line.startswith("2 of 10 answers failed and were skipped, 1 still out of memory after the back-off "
                           "(exit status 3)")
    (tmp_path / "manifest.json").write_text(json.dumps({"n_answers": 8}))  # a run written before the counts
    assert skipped_line(tmp_path) is None


def test_the_api_backs_off_as_gmts_probe_does(tmp_path, monkeypatch):
    """Issue 46: ``gmts.probe`` (the API) had no out-of-memory retry: the first simulated OOM raised. It halves the
    chunk that failed as ``gmts probe`` does and gives the norms of an undisturbed run; an answer still out of
    memory at the floor raises, naming the sizes tried."""
    import gmts_analysis as gmts
    from gmts_analysis.run.sharding.worker import AnswerOutOfMemory
    from gmts_analysis.toy.testing import save_tiny_model

    model = save_tiny_model("qwen2", tmp_path / "m", seed=1, max_len=512)
    r = _rollouts(tmp_path / "r.jsonl", [300])
    want = gmts.probe(str(model), str(r), chunk_size=64, device="cpu", progress=False, threads=1).tokens
    seen = _oom_above(monkeypatch, 64)
    got = gmts.probe(str(model), str(r), chunk_size=256, device="cpu", progress=False, threads=1).tokens
    assert seen == [256, 128, 64, 64, 64, 64, 44]
    np.testing.assert_allclose(got.grad_norm_logp, want.grad_norm_logp, rtol=1e-5)

    def never(self, *a, **k):
        raise _oom()

    monkeypatch.setattr(ExactEngine, "chunk", never)
    monkeypatch.setattr(memory, "OOM_RETRIES", 2)
    with pytest.raises(AnswerOutOfMemory, match=r"out of memory after 3 tries at 256, 128, 64 tokens per batched VJP"):
        gmts.probe(str(model), str(r), chunk_size=256, device="cpu", progress=False, threads=1)
