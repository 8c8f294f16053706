"""The one place an attention backend is chosen for a model's device and dtype."""

from __future__ import annotations

import logging

from server.engine.kernels.attention.base import AttentionBackend, head_dim_of
from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.reference import ReferenceModel

log = logging.getLogger(__name__)


def make_attention_backend(kind: str, model: ReferenceModel) -> AttentionBackend:
    """The attention for `model`'s device and dtype: `auto` picks FlashInfer on CUDA when it
    imports (else torch, logged); `flashinfer` insists; `torch` is SDPA per document."""
    if kind not in ("auto", "torch", "flashinfer"):
        raise ValueError(f"unknown attention backend {kind!r}")
    weight = model.audio_heads.weight
    device, cfg = weight.device, model.llm.config
    head_dim = head_dim_of(cfg)
    if kind != "torch" and device.type == "cuda":
        try:
            return FlashInferAttention(device, weight.dtype, head_dim**-0.5, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, head_dim)
        except ImportError as exc:
            if kind == "flashinfer":
                raise
            log.warning("FlashInfer unavailable (%s); using the torch attention backend", exc)
    if kind == "flashinfer":
        raise RuntimeError("the FlashInfer attention backend needs a CUDA device")
    return TorchAttention(head_dim**-0.5)
