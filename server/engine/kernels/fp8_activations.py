"""FP8 activation quantisation in Triton: rows to e4m3 with one float32 scale each, alone or
fused into the kernel that makes them (residual add + RMSNorm, the SiLU gate).

One program per row: a row of at most a few thousand values fits in registers, so the scale
(the row's largest magnitude over 448) and the codes come from one read of the inputs. The
fused kernels round their row to bf16 before quantising, as the unfused path's bf16 output
would be; `fp8.py` holds the torch references these are tested against. The codes are cast
to the output buffer's dtype: e4m3 in use, float32 where a test reads them before rounding
(Triton's CPU interpreter does not round to e4m3 as the GPU does).
"""

from __future__ import annotations

import torch

from server.engine.kernels.fp8 import FP8_MAX, MIN_SCALE, ActivationQuantizers, QuantizedRows

try:  # Triton is optional: without it `fp8.activation_quantizers` gives the torch references
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

if triton is not None:
    # fp8.py's bounds, as compile-time constants of the kernels
    E4M3_MAX: tl.constexpr = tl.constexpr(FP8_MAX)
    SCALE_FLOOR: tl.constexpr = tl.constexpr(MIN_SCALE)

    @triton.jit
    def store_quantized(y, q_ptr, s_ptr, row, K, offs, keep):
        scale = tl.maximum(tl.max(tl.abs(y), axis=0), SCALE_FLOOR) / E4M3_MAX
        q = tl.minimum(tl.maximum(y / scale, -E4M3_MAX), E4M3_MAX)
        tl.store(q_ptr + row * K + offs, q.to(q_ptr.dtype.element_ty), mask=keep)  # e4m3 (float32: tests)
        tl.store(s_ptr + row, scale)

    @triton.jit
    def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < K
        x = tl.load(x_ptr + row * stride_x + offs, mask=keep, other=0.0).to(tl.float32)
        store_quantized(x, q_ptr, s_ptr, row, K, offs, keep)

    @triton.jit
    def add_rmsnorm_quantize_kernel(h_ptr, r_ptr, w_ptr, q_ptr, s_ptr, K, stride_h, stride_r, eps,
                                    BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < K
        x = (tl.load(h_ptr + row * stride_h + offs, mask=keep, other=0.0).to(tl.float32)
             + tl.load(r_ptr + row * stride_r + offs, mask=keep, other=0.0).to(tl.float32))
        tl.store(r_ptr + row * stride_r + offs, x.to(r_ptr.dtype.element_ty), mask=keep)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
        y = (x * rstd * w).to(h_ptr.dtype.element_ty).to(tl.float32)  # the bf16 row the GEMM would read
        store_quantized(y, q_ptr, s_ptr, row, K, offs, keep)

    @triton.jit
    def silu_mul_quantize_kernel(gu_ptr, q_ptr, s_ptr, K, stride_gu, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < K
        gate = tl.load(gu_ptr + row * stride_gu + offs, mask=keep, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + K + offs, mask=keep, other=0.0).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(gu_ptr.dtype.element_ty).to(tl.float32)
        store_quantized(y, q_ptr, s_ptr, row, K, offs, keep)


def _outputs(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((m, k), dtype=torch.float8_e4m3fn, device=device),
            torch.empty((m, 1), dtype=torch.float32, device=device))


def _launch(kernel, m: int, k: int, *args) -> None:
    if m:
        block = triton.next_power_of_2(k)
        kernel[(m,)](*args, BLOCK=block, num_warps=8 if block >= 4096 else 4)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x (M, K) in e4m3 with its own scale: (codes, scales (M, 1))."""
    m, k = x.shape
    q, s = _outputs(m, k, x.device)
    _launch(quantize_rows_kernel, m, k, x, q, s, k, x.stride(0))
    return q, s


def add_rmsnorm_quantize(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> QuantizedRows:
    """`residual += h` (in place), then RMSNorm(residual) * weight, quantised per row."""
    m, k = h.shape
    q, s = _outputs(m, k, h.device)
    _launch(add_rmsnorm_quantize_kernel, m, k, h, residual, weight, q, s, k, h.stride(0), residual.stride(0), eps)
    return QuantizedRows(q, s, h.dtype)


def silu_mul_quantize(gate_up: torch.Tensor) -> QuantizedRows:
    """SiLU(gate) * up of rows [gate | up] (M, 2I), quantised per row: (M, I) codes."""
    m, k = gate_up.shape[0], gate_up.shape[1] // 2
    q, s = _outputs(m, k, gate_up.device)
    _launch(silu_mul_quantize_kernel, m, k, gate_up, q, s, k, gate_up.stride(0))
    return QuantizedRows(q, s, gate_up.dtype)


QUANTIZERS = ActivationQuantizers(quantize_rows, add_rmsnorm_quantize, silu_mul_quantize)
