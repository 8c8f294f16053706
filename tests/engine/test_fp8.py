"""FP8 mode: the quantisation arithmetic (any device), its refusal off Hopper, and on a GPU its
fused activation quantizers (through Triton's interpreter: tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

from server.engine.kernels import fp8
from server.engine.kernels.fp8 import (
    FP8_MAX,
    QuantizationUnsupported,
    check_fp8_device,
    dequantize,
    quantize_rows_torch,
    quantize_weight,
)

E4M3_RELATIVE_STEP = 2.0 ** -3  # 3 mantissa bits: neighbours differ by at most 1/8 of the value


def test_weight_quantisation_uses_each_rows_range_and_round_trips():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=gen) * torch.logspace(-3, 1, 64).unsqueeze(1)  # rows of many scales
    q = quantize_weight(w)
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight.shape == (64, 96) and q.scale.shape == (1, 64)
    # every row's largest entry lands on e4m3's largest value: the whole range is used
    assert torch.allclose(q.weight.float().abs().amax(dim=1), torch.full((64,), FP8_MAX))
    back = dequantize(q)
    err = (back - w).abs()
    row_scale = q.scale.view(-1, 1)
    assert bool((err <= E4M3_RELATIVE_STEP / 2 * w.abs() + row_scale * 2.0 ** -9).all())


def test_activation_rows_get_their_own_scales_and_zero_rows_stay_finite():
    x = torch.zeros(3, 32)
    x[0] = torch.linspace(-1, 1, 32)
    x[2] = torch.linspace(-1000, 1000, 32)
    q, scale = quantize_rows_torch(x)
    assert scale.shape == (3, 1) and bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
    assert torch.equal(q[1].float(), torch.zeros(32))
    back = q.float() * scale
    assert torch.allclose(back, x, rtol=E4M3_RELATIVE_STEP / 2, atol=scale.max().item() * 2.0 ** -9)


def test_fp8_is_refused_off_hopper_with_a_clear_message(reference_model):
    from server.engine.model.backbones import make_backbone

    with pytest.raises(QuantizationUnsupported, match="Hopper"):
        check_fp8_device(torch.device("cpu"))
    with pytest.raises(QuantizationUnsupported, match="Hopper"):
        make_backbone(reference_model, "auto", quantize="fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_fp8_linear_matches_bf16_within_fp8_error():
    from server.engine.kernels.fp8 import Fp8Linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(537, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    linear = Fp8Linear(torch.device("cuda"))
    q, s = linear.quantizers.quantize_rows(x)
    q_ref, s_ref = quantize_rows_torch(x)
    assert torch.allclose(s, s_ref) and torch.equal(q.float(), q_ref.float())
    out = linear(x, quantize_weight(w)).float()
    ref = torch.nn.functional.linear(x, w).float()
    assert ((out - ref).norm() / ref.norm()).item() < 0.05

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_fused_activation_quantizers_on_the_gpu_match_the_torch_references():
    triton_q = fp8.activation_quantizers()
    assert triton_q is not fp8.TORCH_QUANTIZERS
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows, k in ((1, 1024), (537, 1024), (4096, 3072)):
        h = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
        residual = (torch.randn(rows, k, device="cuda", generator=gen) * 4).bfloat16()
        weight = (torch.rand(k, device="cuda", generator=gen) + 0.5).bfloat16()
        r_kernel, r_torch = residual.clone(), residual.clone()
        got = triton_q.add_rmsnorm_quantize(h, r_kernel, weight, 1e-6)
        want = fp8.add_rmsnorm_quantize_torch(h, r_torch, weight, 1e-6)
        assert torch.equal(r_kernel, r_torch)
        assert torch.allclose(got.scale, want.scale, rtol=2 ** -7)
        # float32 rsqrt in another order may round a value to the neighbouring bf16, rarely
        assert (got.q.float() != want.q.float()).float().mean().item() < 2e-3

        gate_up = (torch.randn(rows, 2 * k, device="cuda", generator=gen) * 3).bfloat16()
        got, want = triton_q.silu_mul_quantize(gate_up), fp8.silu_mul_quantize_torch(gate_up)
        assert torch.allclose(got.scale, want.scale, rtol=2 ** -7)
        assert (got.q.float() != want.q.float()).float().mean().item() < 2e-3


def test_fused_torch_references_quantise_the_unfused_paths_rows():
    """`add_rmsnorm_quantize_torch` and `silu_mul_quantize_torch` give what the bf16 kernels'
    rows quantised by `quantize_rows_torch` give, and update the residual as the norm does."""
    from server.engine.kernels.fp8 import add_rmsnorm_quantize_torch, silu_mul_quantize_torch
    from server.engine.kernels.layer_ops import TorchOps

    gen = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(6, 384, generator=gen) * 3).bfloat16()
    fused = silu_mul_quantize_torch(gate_up)
    q, s = quantize_rows_torch(TorchOps.silu_and_mul(gate_up.float()).bfloat16())
    assert fused.dtype == torch.bfloat16 and torch.equal(fused.q.float(), q.float()) and torch.equal(fused.scale, s)

    h, residual = torch.randn(6, 192, generator=gen).bfloat16(), (torch.randn(6, 192, generator=gen) * 4).bfloat16()
    weight = (torch.rand(192, generator=gen) + 0.5).bfloat16()
    r_fused, r_plain, h_plain = residual.clone(), residual.clone(), h.clone()
    fused = add_rmsnorm_quantize_torch(h, r_fused, weight, 1e-6)
    TorchOps.fused_add_rmsnorm(h_plain, r_plain, weight, 1e-6)
    assert torch.equal(r_fused, r_plain)
    q, s = quantize_rows_torch(h_plain)
    # the norm of the float32 sum (as FlashInfer's kernel) or of its bf16 rounding (TorchOps)
    # may round a value to the neighbouring bf16, and so at times to the neighbouring e4m3 code
    assert torch.allclose(fused.scale, s, rtol=2 ** -7)
    differ = fused.q.float() != q.float()
    assert differ.float().mean().item() < 0.05
    assert bool(((fused.q.float() - q.float()).abs() <= q.float().abs() * E4M3_RELATIVE_STEP + 2 ** -6).all())
