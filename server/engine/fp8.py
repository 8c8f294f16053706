"""FP8 linear layers for Hopper (`--quantize fp8`): faster GEMMs, not the same numbers.

Weights are e4m3 with one float32 scale per output channel (made once, at load); each
activation row is quantised on the fly with its own scale (per token, dynamic), and the
GEMM runs in torch's `_scaled_mm` with both scale vectors applied in its epilogue, writing
bf16. Only the four projections of every layer change; attention, norms, the embedding and
the audio head stay in bf16. Hopper's FP8 tensor cores run about twice as many FLOP/s as its
bf16 ones; the cost is fidelity, which `chorus bench` reports beside the speed (target-logit
error and greedy token agreement against bf16 and against float32). The default is bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_MIN_SCALE = 1e-12  # an all-zero row still gets a finite, positive scale


class QuantizationUnsupported(RuntimeError):
    """`--quantize fp8` asked of a device without FP8 tensor cores."""


def check_fp8_device(device: torch.device) -> None:
    """Hopper only: Ada has FP8 too, but `_scaled_mm`'s row-wise scaling is measured on sm90."""
    if device.type != "cuda":
        raise QuantizationUnsupported(f"--quantize fp8 needs a Hopper GPU (H100/H200); the device is {device}")
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        name = torch.cuda.get_device_name(device)
        raise QuantizationUnsupported(
            f"--quantize fp8 needs a Hopper GPU (compute capability 9.x); {name} is {major}.{minor}")


@dataclass(frozen=True)
class Fp8Weight:
    """A linear layer's weight (N, K) in e4m3, and its per-output-channel scales (1, N)."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape


def quantize_weight(weight: torch.Tensor) -> Fp8Weight:
    """Per output channel: scale = max |w| of the row / 448, so every row uses the full range."""
    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_SCALE) / FP8_MAX
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q.contiguous(), scale.view(1, -1).contiguous())


def dequantize(w: Fp8Weight) -> torch.Tensor:
    return w.weight.float() * w.scale.view(-1, 1)


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: each row of x (M, K) scaled into e4m3's range; returns (q, scales (M, 1))."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_SCALE) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _triton_quantizer():
    import triton
    import triton.language as tl

    @triton.jit
    def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < K
        x = tl.load(x_ptr + row * stride_x + offs, mask=keep, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
        q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * K + offs, q.to(tl.float8e4nv), mask=keep)
        tl.store(s_ptr + row, scale)

    def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m, k = x.shape
        q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
        if m:
            quantize_rows_kernel[(m,)](x, q, s, k, x.stride(0), BLOCK=triton.next_power_of_2(k))
        return q, s

    return quantize_rows


class Fp8Linear:
    """`F.linear(x, w)` for e4m3 weights: one fused quantisation pass, one scaled GEMM."""

    def __init__(self, device: torch.device):
        check_fp8_device(device)
        try:
            self.quantize_rows = _triton_quantizer()
        except ImportError:  # no Triton: the same arithmetic in a few torch kernels
            self.quantize_rows = quantize_rows_torch

    def __call__(self, x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
        q, scale = self.quantize_rows(x if x.stride(-1) == 1 else x.contiguous())
        return torch._scaled_mm(q, w.weight.t(), scale_a=scale, scale_b=w.scale, out_dtype=x.dtype)
