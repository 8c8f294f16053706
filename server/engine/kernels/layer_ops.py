"""The element-wise kernels of the fused backbone, behind one small interface.

`TorchOps` is their reference semantics in plain torch (float32 math, one rounding), so the
fused path runs and is checked on any device; `FlashInferOps` are FlashInfer's CUDA kernels.
Both offer rmsnorm, fused add + rmsnorm, RoPE in place and the SiLU gate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchOps:
    """Reference semantics of the four fused kernels (float32 math, one rounding)."""

    name = "torch"

    @staticmethod
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
        if out is None:
            return y
        out.copy_(y)
        return out

    @classmethod
    def fused_add_rmsnorm(cls, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        residual.add_(x)
        x.copy_(cls.rmsnorm(residual, weight, eps))

    @staticmethod
    def rope_inplace(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, theta: float) -> None:
        d = q.shape[-1]
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=q.device) / d))
        freqs = pos.float()[:, None] * inv_freq[None, :]
        cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None, :]
        sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None, :]
        for t in (q, k):
            tf = t.float()
            rot = torch.cat([-tf[..., d // 2:], tf[..., : d // 2]], -1)
            t.copy_(tf * cos + rot * sin)

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]


class FlashInferOps:
    """FlashInfer's kernels (imported once; `check_flashinfer` has vouched for the names)."""

    name = "flashinfer"

    def __init__(self, pdl: bool | None = None):
        from flashinfer.activation import silu_and_mul  # lazy: optional, CUDA installs only
        from flashinfer.norm import fused_add_rmsnorm, rmsnorm
        from flashinfer.rope import apply_rope_pos_ids_inplace

        self._rmsnorm, self._fused_add_rmsnorm = rmsnorm, fused_add_rmsnorm
        self._rope, self._silu_and_mul = apply_rope_pos_ids_inplace, silu_and_mul
        self.pdl = pdl  # programmatic dependent launch: None lets FlashInfer decide (on for Hopper)

    def rmsnorm(self, x, weight, eps, out=None):
        return self._rmsnorm(x, weight, eps, out=out, enable_pdl=self.pdl)

    def fused_add_rmsnorm(self, x, residual, weight, eps):
        self._fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=self.pdl)

    def rope_inplace(self, q, k, pos, theta):
        self._rope(q, k, pos, interleave=False, rope_theta=theta)

    def silu_and_mul(self, x):
        return self._silu_and_mul(x, enable_pdl=self.pdl)
