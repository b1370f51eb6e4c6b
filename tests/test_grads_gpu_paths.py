"""What ``benchmarks/gpu.sh`` needs, checked on CPU: the CUDA branch of the peak-memory
accounting (against a fake device), bfloat16 models through both engines, the benchmark
case runner, and the script's refusal without a CUDA device."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import plain_loop_grad_norms

from gmts_analysis.engine import grad_norms
from gmts_analysis.run.bench import PeakMemory
from gmts_analysis.toy.testing import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


class FakeCuda:
    """Stands in for ``torch.cuda``'s allocator statistics: 100 MiB resident, a call that
    allocates 30 MiB at its peak."""

    def __init__(self):
        self.allocated = 100 << 20
        self.peak = self.allocated
        self.calls = []

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def memory_allocated(self, device=None):
        return self.allocated

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset")
        self.peak = self.allocated

    def max_memory_allocated(self, device=None):
        return self.peak


def test_peak_memory_cuda_branch_with_a_fake_device(monkeypatch):
    fake = FakeCuda()
    for name in ("synchronize", "empty_cache", "memory_allocated", "reset_peak_memory_stats", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    mem = PeakMemory(torch.device("cuda", 0))
    assert mem.method == "torch.cuda.max_memory_allocated"
    fake.peak = 500 << 20  # a peak left over from before: must be reset, not reported

    def work():
        fake.peak = max(fake.peak, fake.allocated + (30 << 20))
        return "done"

    out, peak = mem.run(work)
    assert out == "done" and peak == 30 << 20
    assert fake.calls.index("reset") < len(fake.calls) - 1 and fake.calls[-1] == "synchronize"


@pytest.mark.parametrize("method", ["exact", "sketch"])
def test_bfloat16_model_both_engines(method):
    """bfloat16 weights: accumulation in float32, norms close to the float32 model's loop
    (bfloat16 has 8 bits of mantissa: a few percent)."""
    m16 = build_tiny_model("qwen2", dtype=torch.bfloat16)
    m32 = build_tiny_model("qwen2", dtype=torch.float32)
    ids = torch.randint(3, 64, (24,), generator=torch.Generator().manual_seed(0))
    ref = plain_loop_grad_norms(m32, ids, 6)
    got = grad_norms(m16, ids, 6, method=method, probes=64)
    assert got.norms.dtype == torch.float64 and bool(torch.isfinite(got.norms).all())
    assert got.quantities.logprob.dtype == torch.float32
    rel = float(((got.norms - ref).abs() / ref).max())
    assert rel < (0.1 if method == "exact" else 0.6), rel
    if method == "exact":
        assert float(((got.norms - ref).abs() / ref).median()) < 0.03


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_bench_case_runner_on_cpu(tmp_path):
    gb = _gpu_bench()
    model = gb.build("tiny", torch.float32, torch.device("cpu"), 64)
    ids = torch.randint(3, model.config.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
    full = gb.run_case(model, ids, 8, "exact", 4, budget_s=60.0, calib=4, device=torch.device("cpu"))
    assert full["scope"] == "full answer" and full["tokens_per_s"] > 0 and full["peak_mib"] >= 0
    part = gb.run_case(model, ids, 8, "exact", 4, budget_s=0.0, calib=4, device=torch.device("cpu"))
    assert part["scope"].startswith("last 4 tokens") and part["predicted_full_s"] > 0
    # the CLI refuses a CUDA device that is not there, with one line
    if not torch.cuda.is_available():
        assert gb.main(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_gpu_sh_refuses_without_cuda():
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpu.sh: no CUDA device (torch.cuda.is_available() is False); nothing was run. "
        "On CPU: benchmarks/gpu.sh --dry-run"
    ]


def test_gpu_sh_goes_on_past_a_failing_part_and_reports_it(tmp_path):
    """Every part runs under its own timeout whatever the one before did; the table and the exit
    status say which failed (here a stand-in interpreter fails the smoke part and passes the rest)."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    'for a in "$@"; do [[ "$a" == *smoke.json ]] && { echo boom >&2; exit 3; }; done\n'
                    f'[[ "$1" == -c ]] && exec {sys.executable} "$@"\n'
                    'echo "ran $*"\n')
    fake.chmod(0o755)
    out = tmp_path / "res" / "gpu.json"
    env = dict(os.environ, PYTHON=str(fake))
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run", "--parts", "smoke,probe,smollm2,qwen",
                        str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    rows = [line.split("\t") for line in (tmp_path / "res" / "gpu-parts.tsv").read_text().splitlines()[1:]]
    assert [(x[0], x[1]) for x in rows] == [("smoke", "failed (rc 3)"), ("probe", "passed"),
                                            ("smollm2-T24", "passed"), ("smollm2-T48", "passed"), ("qwen", "passed")]
    assert "boom" in (tmp_path / "res" / "gpu-smoke.log").read_text()
    assert "--strict" in (tmp_path / "res" / "gpu-probe.log").read_text()  # gmts probe --device cpu --strict
