"""FP8's fused activation quantizers against the values they stand for, on the CPU through
Triton's interpreter (this folder: marker `kernels`, a process started with
`TRITON_INTERPRET=1`)."""

from __future__ import annotations

import pytest
import torch

from server.engine.kernels import fp8
from server.engine.kernels.fp8 import FP8_MAX

BF16_STEP = 2.0 ** -7  # relative


def _codes(kernel, rows: int, k: int, inputs: tuple, strides: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantising kernel's float32 code buffers: the values right before the e4m3 cast."""
    q, s = torch.empty(rows, k), torch.empty(rows, 1)
    fp8._launch(kernel, rows, k, *inputs, q, s, k, *strides)
    return q, s


def _expected(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of y (the bf16 rows, as float32)."""
    scale = y.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (y / scale).clamp(-FP8_MAX, FP8_MAX), scale


def _close(got, want, rtol: float) -> None:
    (q, s), (q_ref, s_ref) = got, want
    assert torch.allclose(s, s_ref, rtol=rtol, atol=0)
    assert torch.allclose(q, q_ref, rtol=rtol, atol=1e-3)
    top = q.abs().amax(dim=1)  # each row's largest value on e4m3's largest code, all-zero rows 0
    assert torch.allclose(top[top > 0], torch.tensor(FP8_MAX)) and bool((s > 0).all())


@pytest.mark.parametrize(("rows", "k"), [(1, 96), (5, 1024), (3, 3072)])
def test_fused_activation_quantizers_compute_what_they_stand_for(rows, k):
    """The Triton kernels, run by Triton's interpreter on the CPU: scales and codes before
    the e4m3 cast, and the residual update. The interpreter's own casts to bf16 and e4m3 do
    not round as the GPU's do, so here a bf16 step is allowed; the GPU test below checks the
    codes and the residual bit for bit."""
    torch.manual_seed(rows)
    assert fp8.activation_quantizers() is fp8.QUANTIZERS
    # rows of very different magnitudes, and an all-zero row, as activations have
    x = torch.randn(rows, k).bfloat16() * torch.logspace(-2, 2, rows).unsqueeze(1).bfloat16()
    x[rows // 2] = 0
    wide = torch.cat([x, torch.ones(rows, 32).bfloat16()], 1)[:, :k]  # rows with a stride
    for rows_in in (x, wide):
        _close(_codes(fp8.quantize_rows_kernel, rows, k, (rows_in,), (rows_in.stride(0),)),
               _expected(rows_in.float()), rtol=1e-6)

    h, residual, weight = torch.randn(rows, k).bfloat16(), torch.randn(rows, k).bfloat16() * 4, torch.rand(k) + 0.5
    r_kernel = residual.clone()
    got = _codes(fp8.add_rmsnorm_quantize_kernel, rows, k, (h, r_kernel, weight.bfloat16()),
                 (h.stride(0), r_kernel.stride(0), 1e-6))
    total = h.float() + residual.float()
    assert torch.allclose(r_kernel.float(), total, rtol=BF16_STEP, atol=0)  # updated in place
    normed = total * torch.rsqrt(total.pow(2).mean(dim=1, keepdim=True) + 1e-6) * weight.bfloat16().float()
    _close(got, _expected(normed.bfloat16().float()), rtol=2 * BF16_STEP)

    gate_up = torch.randn(rows, 2 * k).bfloat16() * 3
    got = _codes(fp8.silu_mul_quantize_kernel, rows, k, (gate_up,), (gate_up.stride(0),))
    gate, up = gate_up.float().chunk(2, dim=1)
    _close(got, _expected((torch.nn.functional.silu(gate) * up).bfloat16().float()), rtol=2 * BF16_STEP)
