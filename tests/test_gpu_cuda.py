"""The engines on a CUDA device: skipped (but collected) without one.

What only a GPU can confirm (docs/scaling.md, "What a GPU must confirm"): the exact engine against
the float64 per-token loop on tiny models, bfloat16 within its bounds, the sketch drawing its
directions on the device (unbiased, ranking tokens as exact norms do), the allocator's numbers
the memory budget reads, ``gmts probe --device cuda --strict`` on the shipped example, and a
2-rank torchrun on 2 GPUs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from _sharding_helpers import gmts_cmd, probe_args, run, tokens, torchrun_cmd, write_rollouts
from conftest import plain_loop_grad_norms

from gmts_analysis.engine import grad_norms, memory, sketch
from gmts_analysis.toy.testing import ARCHS, build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda", 0)


def _ids(n: int, seed: int = 0, vocab: int = 64) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_on_cuda_matches_the_float64_loop(arch):
    """float32 on the GPU within 1e-4 of the float64 loop on the CPU; float64 on the GPU within 1e-9."""
    ids = _ids(40)
    ref = plain_loop_grad_norms(build_tiny_model(arch, dtype=torch.float64), ids, 8)
    for dtype, rtol in ((torch.float32, 1e-4), (torch.float64, 1e-9)):
        model = build_tiny_model(arch, dtype=dtype).to(CUDA)
        got = grad_norms(model, ids.to(CUDA), 8)
        assert got.method == "exact" and got.fallback is None
        rel = float(((got.norms - ref).abs() / ref).max())
        assert rel < rtol, (arch, dtype, rel)


@pytest.mark.parametrize("method", ["exact", "sketch"])
def test_bfloat16_on_cuda_within_its_bounds(method):
    """bfloat16 weights on the GPU: accumulation in float32, as on the CPU (tests/test_grads_gpu_paths.py)."""
    ids = _ids(24)
    ref = plain_loop_grad_norms(build_tiny_model("qwen2", dtype=torch.float64), ids, 6)
    model = build_tiny_model("qwen2", dtype=torch.bfloat16).to(CUDA)
    got = grad_norms(model, ids.to(CUDA), 6, method=method, probes=64)
    assert got.method == method and got.norms.dtype == torch.float64 and bool(torch.isfinite(got.norms).all())
    rel = ((got.norms - ref).abs() / ref)
    assert float(rel.max()) < (0.1 if method == "exact" else 0.6), float(rel.max())
    if method == "exact":
        assert float(rel.median()) < 0.03


def test_sketch_on_cuda_draws_on_the_device_unbiased_and_ranking_like_exact(monkeypatch):
    from scipy.stats import spearmanr

    model = build_tiny_model("llama").to(CUDA)
    ids = _ids(48, seed=2).to(CUDA)
    exact = grad_norms(model, ids, 8).norms
    devices = []
    real = sketch.stream_generator

    def spy(device, seed):
        g = real(device, seed)
        devices.append(g.device.type)
        return g

    monkeypatch.setattr(sketch, "stream_generator", spy)
    runs = [grad_norms(model, ids, 8, method="sketch", probes=32, seed=s) for s in range(16)]
    assert set(devices) == {"cuda"}  # the directions are drawn on the model's device
    sq = torch.stack([r.norms for r in runs]).pow(2).mean(0)
    ratio = float(sq.sum() / exact.pow(2).sum())
    assert 0.9 < ratio < 1.1, ratio  # unbiased for the squared norm (512 directions in all)
    rho = spearmanr(runs[0].norms.numpy(), exact.numpy()).statistic
    assert rho > 0.8, rho
    cover = float(torch.cat([((r.lo <= exact) & (exact <= r.hi)).double() for r in runs]).mean())
    assert cover > 0.85, cover  # 95% intervals per token
    # the stream depends on the device: the CPU draws other directions for the same seed
    cpu = grad_norms(model.cpu(), ids.cpu(), 8, method="sketch", probes=32, seed=0)
    assert not torch.equal(cpu.norms, runs[0].norms)


def test_the_budget_reads_the_allocator():
    free = memory.free_device_memory(CUDA)
    total = torch.cuda.get_device_properties(CUDA).total_memory
    assert free is not None and 0 < free <= total
    try:
        torch.empty(total * 4, dtype=torch.uint8, device=CUDA)
    except Exception as e:  # noqa: BLE001 - the point: what torch raises is recognised
        assert memory.is_out_of_memory(e), repr(e)
    else:  # pragma: no cover
        pytest.fail("allocating 4x the device's memory did not fail")
    torch.cuda.empty_cache()


def _example_subset(path, n_groups: int = 6):
    """The shipped example's rollouts, its first ``n_groups`` groups (whole groups: same advantages)."""
    from gmts_analysis.util.resources import example_run_dir

    rows = [json.loads(x) for x in (example_run_dir() / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    keep = list(dict.fromkeys(r["group_id"] for r in rows))[:n_groups]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["group_id"] in keep))
    return path, set(keep)


def test_gmts_probe_device_cuda_strict_on_the_shipped_example(tmp_path):
    """``gmts probe --device cuda --strict`` on the shipped example (the small policy): every answer
    by the exact engine, the norms of the shipped CPU run."""
    from gmts_analysis.cli import main
    from gmts_analysis.util.resources import example_run_dir

    r, groups = _example_subset(tmp_path / "r.jsonl")
    out = tmp_path / "run"
    rc = main(["probe", "--model", "small", "--rollouts", str(r), "--out", str(out), "--device", "cuda", "--strict",
               "--quiet", "--no-figures", "--fidelity", "off"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["device"].startswith("cuda") and m["grad_norm_methods"] == {"exact": m["n_answers"]}
    assert m["n_errors"] == 0 and m["n_out_of_memory"] == 0
    got = tokens(out)
    ship = pd.read_parquet(example_run_dir() / "tokens.parquet")
    ship = ship[ship.group_id.isin(groups)]
    key = ["answer_id", "position"]
    both = got.merge(ship, on=key, suffixes=("", "_cpu"))
    assert len(both) == len(got) == len(ship)
    for col in ("logprob", "entropy", "grad_norm_logp"):
        np.testing.assert_allclose(both[col], both[f"{col}_cpu"], rtol=1e-3, atol=1e-6, err_msg=col)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_ranks_on_two_gpus_give_the_rows_of_one(tiny_model_dirs, tmp_path):
    """torchrun with 2 ranks, one GPU each (tests/test_sharding_torchrun.py does it on CPU ranks)."""
    model = tiny_model_dirs["qwen2"]
    r = write_rollouts(tmp_path / "r.jsonl", seed=1)
    one, two = tmp_path / "one", tmp_path / "two"
    args = ("--answers-per-chunk", "2", "--device", "cuda")  # the last --device wins over probe_args' cpu
    p = run(gmts_cmd(*probe_args(model, r, one, *args)))
    assert p.returncode == 0, p.stderr[-3000:]
    p = run(torchrun_cmd(2, *probe_args(model, r, two, *args)))
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((two / "manifest.json").read_text())
    assert m["distributed"]["world_size"] == 2
    assert {x["device"] for x in m["distributed"]["ranks"]} == {"cuda:0", "cuda:1"}
    a, b = tokens(one), tokens(two)
    assert a[["answer_id", "position"]].values.tolist() == b[["answer_id", "position"]].values.tolist()
    np.testing.assert_allclose(a.grad_norm_logp, b.grad_norm_logp, rtol=1e-5)
