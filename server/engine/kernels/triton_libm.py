"""Float32 math for the engine's Triton kernels, as torch's CUDA kernels compute it.

Compiled for CUDA: libdevice's `expf` and `logf` (what torch's `exp` and `log` call) and IEEE
division (`div.rn`, as nvcc emits for `/`), so a kernel can match torch's operations bit for bit.
Under Triton's interpreter (`TRITON_INTERPRET`, the kernels' CPU tests) libdevice cannot be
called, so the same names take numpy's, which may differ in the last place.
"""

from __future__ import annotations

try:  # Triton is optional: CPU installs keep the torch paths
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

if triton is not None:
    from triton.language.extra import libdevice

    # `INTERPRET` is a compile-time constant: a compiled kernel holds only the libdevice call

    @triton.jit
    def libm_exp(x, INTERPRET: tl.constexpr):
        return tl.exp(x) if INTERPRET else libdevice.exp(x)

    @triton.jit
    def libm_log(x, INTERPRET: tl.constexpr):
        return tl.log(x) if INTERPRET else libdevice.log(x)

    @triton.jit
    def ieee_div(x, y, INTERPRET: tl.constexpr):
        return x / y if INTERPRET else tl.math.div_rn(x, y)
