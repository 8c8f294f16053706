"""Attention backends: bidirectional attention within each document of a packed row.

Every backend takes q/k/v in (S, H, D) layout (S = packed length) and the step's
`doc_lens`, and returns (S, Hq, D). A plan is made once per step and shared by all layers,
so per-step host work (index building, kernel planning) is not paid per layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


class AttentionBackend(Protocol):
    name: str

    def plan(self, doc_lens: list[int]) -> object:
        """Prepare for one step's documents; the result is passed to every `attend`."""

    def attend(self, plan: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Non-causal attention of q (S, Hq, D) over k, v (S, Hkv, D) within documents."""


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


def graph_layout(doc_lens: list[int], num_docs: int, max_rows: int) -> tuple[int, ...]:
    """`doc_lens` as the layout of a graph captured for exactly `num_docs` documents over
    `max_rows` rows (a CUDA graph planner's key); any other shape is refused."""
    if len(doc_lens) != num_docs or sum(doc_lens) != max_rows:
        raise ValueError(f"graph plan wants {num_docs} documents over {max_rows} rows, "
                         f"got {len(doc_lens)} over {sum(doc_lens)}")
    return tuple(doc_lens)


def head_dim_of(llm_config) -> int:
    """Per-head width of a Qwen3 config (`head_dim`, else hidden size over heads)."""
    return getattr(llm_config, "head_dim", None) or llm_config.hidden_size // llm_config.num_attention_heads


def make_attention_backend(kind: str, model) -> AttentionBackend:
    """The attention for `model`'s device and dtype: `auto` picks FlashInfer on CUDA when it
    imports (else torch, logged); `flashinfer` insists; `torch` is SDPA per document."""
    if kind not in ("auto", "torch", "flashinfer"):
        raise ValueError(f"unknown attention backend {kind!r}")
    weight = model.audio_heads.weight
    device, cfg = weight.device, model.llm.config
    head_dim = head_dim_of(cfg)
    if kind != "torch" and device.type == "cuda":
        try:
            from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention

            return FlashInferAttention(device, weight.dtype, head_dim**-0.5, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, head_dim)
        except ImportError as exc:
            if kind == "flashinfer":
                raise
            log.warning("FlashInfer unavailable (%s); using the torch attention backend", exc)
    if kind == "flashinfer":
        raise RuntimeError("the FlashInfer attention backend needs a CUDA device")
    return TorchAttention(head_dim**-0.5)
