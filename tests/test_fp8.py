"""FP8 mode: the quantisation arithmetic (any device) and its refusal off Hopper."""

from __future__ import annotations

import pytest
import torch

from server.engine.fp8 import (
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
    from server.engine.fused_backbone import make_backbone

    with pytest.raises(QuantizationUnsupported, match="Hopper"):
        check_fp8_device(torch.device("cpu"))
    with pytest.raises(QuantizationUnsupported, match="Hopper"):
        make_backbone(reference_model, "auto", quantize="fp8")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_fp8_linear_matches_bf16_within_fp8_error():
    from server.engine.fp8 import Fp8Linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(537, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) / 32
    linear = Fp8Linear(torch.device("cuda"))
    q, s = linear.quantize_rows(x)
    q_ref, s_ref = quantize_rows_torch(x)
    assert torch.allclose(s, s_ref) and torch.equal(q.float(), q_ref.float())
    out = linear(x, quantize_weight(w)).float()
    ref = torch.nn.functional.linear(x, w).float()
    assert ((out - ref).norm() / ref.norm()).item() < 0.05
