"""The narrow projections of a small step split along their inner dimension (CUDA).

`split_linear` runs the O and down projections as one strided-batched GEMM over `splits` slices
(float32 partials); `split_add_rmsnorm`, the residual add + RMSNorm that follows each, sums the
slices in a fixed order and rounds as the unsplit GEMM would. `splits_for` picks the slices by
step size; `check()` is their start-up gate (docs/architecture.md, "Kernels").
"""

from __future__ import annotations

import torch

from server.engine.kernels.triton_env import kernels_can_run

try:  # Triton is optional: CPU installs keep the unsplit path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None


# Slices by packed rows, as the sweep against cuBLAS + FlashInfer's `fused_add_rmsnorm` chose
# them: the fewer the rows, the more slices; past the last bound the unsplit GEMM has tiles
# enough and splitting loses.
SPLITS_BY_ROWS = ((192, 4), (1024, 2))


def splits_for(rows: int, inner_dims: tuple[int, ...] = ()) -> int:
    """How many inner-dimension slices the narrow projections of a `rows`-row step take (1:
    none): the table's count, halved until it divides every one of `inner_dims`."""
    for most_rows, splits in SPLITS_BY_ROWS:
        if rows <= most_rows:
            while splits > 1 and any(k % splits for k in inner_dims):
                splits //= 2
            return splits
    return 1


if triton is not None:

    # the row count changes every step: not specialised on (one build serves every step)
    @triton.jit(do_not_specialize=["rows"])
    def _split_add_rmsnorm_kernel(partials, residual, weight, out, rows, eps,
                                  SPLITS: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
        row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # this program's rows
        cols = tl.arange(0, BLOCK)[None, :]
        ok = (cols < N) & (row < rows)
        acc = tl.load(partials + row * N + cols, mask=ok, other=0.0)
        for s in tl.static_range(1, SPLITS):  # slice by slice, always in this order
            acc += tl.load(partials + (s * rows + row) * N + cols, mask=ok, other=0.0)
        y = acc.to(out.dtype.element_ty).to(tl.float32)  # the projection's output, rounded
        x = y + tl.load(residual + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(residual + row * N + cols, x.to(residual.dtype.element_ty), mask=ok)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(weight + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(out + row * N + cols, (x * r[:, None] * w).to(out.dtype.element_ty), mask=ok)


available = kernels_can_run  # whether this kernel can run on a device


def split_linear(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T as `splits` float32 partial products (splits, M, N), each
    over one contiguous slice of K (views of x and the weight: nothing is copied)."""
    m, k = x.shape
    n = weight.shape[0]
    if k % splits or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"cannot split an inner dimension of {k} into {splits} strided slices")
    ks = k // splits
    xs = x.as_strided((splits, m, ks), (ks, x.stride(0), 1))
    ws = weight.as_strided((splits, ks, n), (ks, 1, weight.stride(0)))
    if x.device.type == "cuda":
        return torch.bmm(xs, ws, out_dtype=torch.float32)
    return torch.bmm(xs.float(), ws.float())  # CPU: the same products (the fused path runs anywhere)


def norm_shape(rows: int) -> tuple[int, int]:
    """(rows a program, warps) of the norm for a `rows`-row step: a row a program throughout;
    eight warps where the step is split in four, four above (the sweep's choice)."""
    return (1, 8) if rows <= SPLITS_BY_ROWS[0][0] else (1, 4)


def split_add_rmsnorm(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      out: torch.Tensor | None = None, *, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """`residual += sum(partials)` (the sum rounded to the residual's dtype first), then
    `out = rmsnorm(residual) * weight` from the unrounded float32 sum, as FlashInfer's
    `fused_add_rmsnorm` normalises; returns `out` (new unless given). `shape`: (rows a
    program, warps), `norm_shape(rows)` by default."""
    splits, rows, n = partials.shape
    if out is None:
        out = residual.new_empty(rows, n)
    if rows == 0:
        return out
    assert partials.is_contiguous() and residual.is_contiguous() and out.is_contiguous()
    per_program, warps = shape or norm_shape(rows)
    _split_add_rmsnorm_kernel[(triton.cdiv(rows, per_program),)](
        partials, residual, weight, out, rows, float(eps), SPLITS=splits, N=n, BLOCK=triton.next_power_of_2(n),
        ROWS=per_program, num_warps=warps)
    return out


def reference(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same arithmetic in float32 torch: (new residual, normed output)."""
    y = partials[0]
    for part in partials[1:]:  # the kernel's order
        y = y + part
    y = y.to(residual.dtype).float()
    x = y + residual.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return x.to(residual.dtype), normed.to(residual.dtype)


def check(device, dtype: torch.dtype, hidden: int, eps: float, rows: int = 37) -> float:
    """Relative error of the split GEMM + norm against one float32 GEMM and the unfused
    add + norm on random data; raises when either cannot run."""
    gen = torch.Generator(device="cpu").manual_seed(3)
    x = torch.randn(rows, 2 * hidden, generator=gen)
    w = torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5
    res = torch.randn(rows, hidden, generator=gen)
    ln = 1 + 0.1 * torch.randn(hidden, generator=gen)
    want = res + x @ w.T
    want = want * torch.rsqrt(want.pow(2).mean(-1, keepdim=True) + eps) * ln
    dev = [t.to(device, dtype) for t in (x, w, res, ln)]
    got = split_add_rmsnorm(split_linear(dev[0], dev[1], 4), dev[2], dev[3], eps).float().cpu()
    return float((got - want).norm() / want.norm())
