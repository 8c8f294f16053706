"""FP8 linear layers for Hopper (`--quantize fp8`): faster GEMMs, not the same numbers.

Weights are e4m3 with one float32 scale per output channel (made once, at load); each activation
row is quantised on the fly with its own scale, by the kernel that makes the row where it can (the
residual add + RMSNorm, the SiLU gate: one program a row, in Triton) so the row is never written in
bf16 only to be read back. The GEMM is torch's `_scaled_mm` with both scales in its epilogue.
The torch functions here are the references the Triton kernels are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # Triton is optional: without it `activation_quantizers` gives the torch references
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

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
    return QUANTIZERS if triton is not None else TORCH_QUANTIZERS



# ---- the Triton kernels: rows to e4m3 alone, or fused into the kernel that makes them ----
# The fused kernels round their row to bf16 before quantising, as the unfused path's bf16 output
# would be. The codes are cast to the output buffer's dtype: e4m3 in use; a float32 buffer keeps
# them before rounding (Triton's CPU interpreter does not round to e4m3 as the GPU does).

if triton is not None:
    # the bounds above, as compile-time constants of the kernels
    E4M3_MAX: tl.constexpr = tl.constexpr(FP8_MAX)
    SCALE_FLOOR: tl.constexpr = tl.constexpr(MIN_SCALE)

    @triton.jit
    def store_quantized(y, q_ptr, s_ptr, row, K, offs, keep):
        scale = tl.maximum(tl.max(tl.abs(y), axis=0), SCALE_FLOOR) / E4M3_MAX
        q = tl.minimum(tl.maximum(y / scale, -E4M3_MAX), E4M3_MAX)
        tl.store(q_ptr + row * K + offs, q.to(q_ptr.dtype.element_ty), mask=keep)  # the buffer's dtype: e4m3
        tl.store(s_ptr + row, scale)

    @triton.jit
    def row_lanes(K, BLOCK: tl.constexpr):
        """This program's row, its `BLOCK` lanes and which of them hold one of the row's `K` values."""
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        return row, offs, offs < K

    @triton.jit
    def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK: tl.constexpr):
        row, offs, keep = row_lanes(K, BLOCK)
        x = tl.load(x_ptr + row * stride_x + offs, mask=keep, other=0.0).to(tl.float32)
        store_quantized(x, q_ptr, s_ptr, row, K, offs, keep)

    @triton.jit
    def add_rmsnorm_quantize_kernel(h_ptr, r_ptr, w_ptr, q_ptr, s_ptr, K, stride_h, stride_r, eps,
                                    BLOCK: tl.constexpr):
        row, offs, keep = row_lanes(K, BLOCK)
        x = (tl.load(h_ptr + row * stride_h + offs, mask=keep, other=0.0).to(tl.float32)
             + tl.load(r_ptr + row * stride_r + offs, mask=keep, other=0.0).to(tl.float32))
        tl.store(r_ptr + row * stride_r + offs, x.to(r_ptr.dtype.element_ty), mask=keep)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
        y = (x * rstd * w).to(h_ptr.dtype.element_ty).to(tl.float32)  # the bf16 row the GEMM would read
        store_quantized(y, q_ptr, s_ptr, row, K, offs, keep)

    @triton.jit
    def silu_mul_quantize_kernel(gu_ptr, q_ptr, s_ptr, K, stride_gu, BLOCK: tl.constexpr):
        row, offs, keep = row_lanes(K, BLOCK)
        gate = tl.load(gu_ptr + row * stride_gu + offs, mask=keep, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + K + offs, mask=keep, other=0.0).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(gu_ptr.dtype.element_ty).to(tl.float32)
        store_quantized(y, q_ptr, s_ptr, row, K, offs, keep)


def _quantized_outputs(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((m, k), dtype=torch.float8_e4m3fn, device=device),
            torch.empty((m, 1), dtype=torch.float32, device=device))


def _launch(kernel, m: int, k: int, *args) -> None:
    if m:
        block = triton.next_power_of_2(k)
        kernel[(m,)](*args, BLOCK=block, num_warps=8 if block >= 4096 else 4)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x (M, K) in e4m3 with its own scale: (codes, scales (M, 1))."""
    m, k = x.shape
    q, s = _quantized_outputs(m, k, x.device)
    _launch(quantize_rows_kernel, m, k, x, q, s, k, x.stride(0))
    return q, s


def add_rmsnorm_quantize(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> QuantizedRows:
    """`residual += h` (in place), then RMSNorm(residual) * weight, quantised per row."""
    m, k = h.shape
    q, s = _quantized_outputs(m, k, h.device)
    _launch(add_rmsnorm_quantize_kernel, m, k, h, residual, weight, q, s, k, h.stride(0), residual.stride(0), eps)
    return QuantizedRows(q, s, h.dtype)


def silu_mul_quantize(gate_up: torch.Tensor) -> QuantizedRows:
    """SiLU(gate) * up of rows [gate | up] (M, 2I), quantised per row: (M, I) codes."""
    m, k = gate_up.shape[0], gate_up.shape[1] // 2
    q, s = _quantized_outputs(m, k, gate_up.device)
    _launch(silu_mul_quantize_kernel, m, k, gate_up, q, s, k, gate_up.stride(0))
    return QuantizedRows(q, s, gate_up.dtype)


QUANTIZERS = ActivationQuantizers(quantize_rows, add_rmsnorm_quantize, silu_mul_quantize)


class Fp8Linear:
    """`F.linear(x, w)` for e4m3 weights: x is bf16 rows (quantised here, one pass) or
    `QuantizedRows` a fused kernel made; one scaled GEMM."""

    def __init__(self, device: torch.device):
        check_fp8_device(device)
        self.quantizers = activation_quantizers()

    def __call__(self, x, w: Fp8Weight) -> torch.Tensor:
        if isinstance(x, QuantizedRows):
            q, scale, dtype = x.q, x.scale, x.dtype
        else:
            (q, scale), dtype = self.quantizers.quantize_rows(x if x.stride(-1) == 1 else x.contiguous()), x.dtype
        return torch._scaled_mm(q, w.weight.t(), scale_a=scale, scale_b=w.scale, out_dtype=dtype)
