"""The engine's numerics are pinned: under a training loop's bf16 autocast (and TF32 / reduced matmul
precision) a float32 model's norms stay exact, and the caller's settings come back after the call, on an
exception too; the integrations unwrap the model without accelerate's mixed-precision wrapper and put it
back."""

from __future__ import annotations

import pytest
import torch

from gmts_analysis.engine import grad_norms
from gmts_analysis.engine.methods import GRAD_METHODS, GradMethod, register_method
from gmts_analysis.engine.numerics import numerics_state, preserved_matmul_settings
from gmts_analysis.engine.reference import loop_grad_norms
from gmts_analysis.toy.testing import build_tiny_model


def _ids(n: int = 20) -> torch.Tensor:
    return torch.randint(3, 64, (n,), generator=torch.Generator().manual_seed(1))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs()).max())


@pytest.fixture
def loose_matmuls():
    """TF32 and bfloat16 matmul passes allowed for the test (as a training config's ``tf32=True`` would),
    the process's settings restored after it."""
    with preserved_matmul_settings():
        torch.set_float32_matmul_precision("medium")
        yield


@pytest.mark.parametrize("method", ["exact", "sketch"])
def test_bf16_autocast_stays_exact(method, loose_matmuls):
    """Under ``torch.autocast("cpu", torch.bfloat16)`` with float32 weights the engine runs in float32:
    method ``exact`` (before: the head check refused, "off by 0.00206, past the rounding bound 8.94e-05",
    and the loop ran, itself under autocast: 2.9e-3 from the float64 loop), within 1e-4 of the float64
    loop; the sketch stays the sketch. The caller's autocast is on again after the call."""
    m64 = build_tiny_model("qwen2", dtype=torch.float64)
    m32 = build_tiny_model("qwen2")
    ids, P = _ids(), 6
    ref = loop_grad_norms(m64, ids, P)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grad_norms(m32, ids, P, method=method, probes=64, strict=True)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert got.method == method and got.fallback is None
    if method == "exact":
        assert _rel(got.norms, ref) < 1e-4, _rel(got.norms, ref)
        q_ref = grad_norms(m64, ids, P).quantities
        assert _rel(got.quantities.logit_grad_norm, q_ref.logit_grad_norm) < 1e-4  # closed forms in float32 too
    else:
        assert abs(float((got.norms**2 / ref**2).mean()) - 1.0) < 0.15


def test_numerics_pinned_inside_and_restored_after_even_on_error(loose_matmuls):
    """Inside the call: autocast off on cpu and cuda, float32 matmuls at "highest" (the backends' fp32
    precision "ieee" where the per-backend API exists); after it, every setting as the caller left it, when
    the method returns and when it raises."""
    model = build_tiny_model("llama")
    seen: list[dict] = []

    def record(model, input_ids, prompt_len, args):
        seen.append(numerics_state())
        if args.seed == 13:
            raise RuntimeError("boom")
        return GRAD_METHODS["exact"].run(model, input_ids, prompt_len, args)

    register_method(GradMethod("test_record", record))
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before = numerics_state()
            grad_norms(model, _ids(), 6, method="test_record")
            assert numerics_state() == before
            with pytest.raises(RuntimeError, match="boom"):
                grad_norms(model, _ids(), 6, method="test_record", seed=13)
            assert numerics_state() == before
    finally:
        del GRAD_METHODS["test_record"]
    assert before["autocast_cpu"] and before["float32_matmul_precision"] == "medium"
    for inside in seen:
        assert not inside["autocast_cpu"] and not inside["autocast_cuda"]
        assert inside["float32_matmul_precision"] == "highest" and inside["allow_tf32_cuda_matmul"] is False
        assert all(v == "ieee" for k, v in inside.items() if k.startswith("fp32_precision:") and k != "fp32_precision:global")


def test_integrations_unwrap_without_the_fp32_wrapper_and_put_it_back():
    """A bf16 ``Accelerator`` wraps the model's forward in autocast (the engine then meets bfloat16 logits and
    goes to the loop); inside :func:`unwrapped_without_amp` the model runs its own forward (the engine exact),
    and afterwards training's wrapper is back on the same object, also after an exception."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState, PartialState

    from gmts_analysis.integrations.diagnostics import unwrapped_without_amp

    model = build_tiny_model("qwen2")
    ids, P = _ids(), 6
    try:
        acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
        prepared = acc.prepare(model)
        wrapped_forward = prepared.__dict__.get("forward")
        assert wrapped_forward is not None and "_original_forward" in prepared.__dict__
        # the wrapper turns autocast on inside the forward, past the engine's pin: the head check refuses
        assert grad_norms(prepared, ids, P).method == "loop"
        with unwrapped_without_amp(acc, prepared) as inner:
            assert "_original_forward" not in inner.__dict__ and inner is prepared
            got = grad_norms(inner, ids, P, strict=True)
        assert got.method == "exact"
        assert prepared.__dict__.get("forward") is wrapped_forward and "_original_forward" in prepared.__dict__
        with pytest.raises(ValueError), unwrapped_without_amp(acc, prepared):
            raise ValueError("inside")
        assert prepared.__dict__.get("forward") is wrapped_forward
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()
