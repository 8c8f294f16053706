"""FP8 linear layers for Hopper (`--quantize fp8`): faster GEMMs, not the same numbers.

Weights are e4m3 with one float32 scale per output channel (made once, at load); each
activation row is quantised on the fly with its own scale (per token, dynamic), and the
GEMM runs in torch's `_scaled_mm` with both scale vectors applied in its epilogue, writing
bf16. Where a projection's input comes out of a norm or the MLP gate, that kernel quantises
its own output (`fp8_activations.py`), so the row is never written in bf16 only to be read
back by a separate quantising pass (at 34k rows those passes moved about 0.5 GB a layer); it
rounds the row to bf16 first, so it quantises the row the unfused path would (to float32
rounding in the norm). Only the four projections of every layer change; attention, norms,
the embedding and the audio head stay in bf16. Hopper's FP8 tensor cores run about twice as
many FLOP/s as its bf16 ones; the cost is fidelity, which `chorus bench` reports beside the
speed (target-logit error and greedy token agreement against bf16 and against float32). The
default is bf16.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_SCALE = 1e-12  # an all-zero row still gets a finite, positive scale


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
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=MIN_SCALE) / FP8_MAX
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q.contiguous(), scale.view(1, -1).contiguous())


def dequantize(w: Fp8Weight) -> torch.Tensor:
    return w.weight.float() * w.scale.view(-1, 1)


@dataclass(frozen=True)
class QuantizedRows:
    """Activation rows in e4m3 with their scales (M, 1), and the dtype the GEMM writes."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: each row of x (M, K) scaled into e4m3's range; returns (q, scales (M, 1))."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=MIN_SCALE) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def add_rmsnorm_quantize_torch(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                               eps: float) -> QuantizedRows:
    """`residual += h`, then RMSNorm(residual) * weight in h's dtype, quantised per row."""
    x = h.float() + residual.float()
    residual.copy_(x)
    y = (x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps) * weight.float()).to(h.dtype)
    return QuantizedRows(*quantize_rows_torch(y), h.dtype)


def silu_mul_quantize_torch(gate_up: torch.Tensor) -> QuantizedRows:
    """SiLU(gate) * up in gate_up's dtype (gate the first half of each row), quantised per row."""
    gate, up = gate_up.float().chunk(2, dim=1)
    return QuantizedRows(*quantize_rows_torch((F.silu(gate) * up).to(gate_up.dtype)), gate_up.dtype)


@dataclass(frozen=True)
class ActivationQuantizers:
    """The three ways a projection's input gets to e4m3: plain rows, or fused into the kernel
    that makes them."""

    quantize_rows: object  # (x) -> (q, scale)
    add_rmsnorm_quantize: object  # (h, residual, weight, eps) -> QuantizedRows
    silu_mul_quantize: object  # (gate_up) -> QuantizedRows


TORCH_QUANTIZERS = ActivationQuantizers(quantize_rows_torch, add_rmsnorm_quantize_torch, silu_mul_quantize_torch)


def activation_quantizers() -> ActivationQuantizers:
    """Triton's kernels where Triton imports (always beside a Hopper GPU), else torch's."""
    from server.engine.kernels import fp8_activations
    return fp8_activations.QUANTIZERS if fp8_activations.triton is not None else TORCH_QUANTIZERS


class Fp8Linear:
    """`F.linear(x, w)` for e4m3 weights: x is bf16 rows (quantised here, one pass) or
    `QuantizedRows` a fused kernel made; one scaled GEMM."""

    def __init__(self, device: torch.device):
        check_fp8_device(device)
        self.quantizers = activation_quantizers()
        # CHORUS_FP8_FUSED_QUANT=0: norms and the gate write bf16, quantised by a separate pass
        self.fused = os.environ.get("CHORUS_FP8_FUSED_QUANT", "") != "0"

    def __call__(self, x, w: Fp8Weight) -> torch.Tensor:
        if isinstance(x, QuantizedRows):
            q, scale, dtype = x.q, x.scale, x.dtype
        else:
            (q, scale), dtype = self.quantizers.quantize_rows(x if x.stride(-1) == 1 else x.contiguous()), x.dtype
        return torch._scaled_mm(q, w.weight.t(), scale_a=scale, scale_b=w.scale, out_dtype=dtype)
