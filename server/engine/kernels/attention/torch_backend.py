"""Attention as torch's SDPA per document: exact and portable (CPU, and the CUDA fallback)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DocumentSpans:
    bounds: list[tuple[int, int]]


class TorchAttention:
    """SDPA per document: exact, portable (CPU and CUDA fallback), no S x S mask."""

    name = "torch"

    def __init__(self, scale: float):
        self.scale = scale

    def plan(self, doc_lens: list[int]) -> DocumentSpans:
        bounds, start = [], 0
        for n in doc_lens:
            bounds.append((start, start + n))
            start += n
        return DocumentSpans(bounds)

    def attend(self, plan: DocumentSpans, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        n_rep = q.shape[1] // k.shape[1]
        for start, end in plan.bounds:
            qd = q[start:end].transpose(0, 1).unsqueeze(0)  # (1, Hq, L, D)
            kd = k[start:end].transpose(0, 1)
            vd = v[start:end].transpose(0, 1)
            if n_rep > 1:
                kd = kd.repeat_interleave(n_rep, dim=0)
                vd = vd.repeat_interleave(n_rep, dim=0)
            o = F.scaled_dot_product_attention(qd, kd.unsqueeze(0), vd.unsqueeze(0), scale=self.scale)
            out[start:end] = o[0].transpose(0, 1)
        return out
