"""Which backbone a model's steps run: the fused one on CUDA with FlashInfer, else the reference
modules."""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from server.engine.kernels.attention.selector import make_attention_backend
from server.engine.kernels.fp8 import QuantizationUnsupported, check_fp8_device
from server.engine.model.backbone import OmniVoiceBackbone
from server.engine.model.canvas import PackedCanvas
from server.engine.model.cuda_graphs import DEFAULT_GRAPH_MAX_TOKENS, GRAPH_TOKEN_BUCKETS, token_buckets_up_to
from server.engine.model.fused_backbone import FusedBackbone
from server.engine.reference import ReferenceModel

log = logging.getLogger(__name__)


class Backbone(Protocol):
    """The packed forward a step runs: float32 logits at the target rows, in `tgt_index` order.
    The fused backbone also gives them in the model's dtype (`head_logits`) and warms its
    largest step (`warm_eager`); the runner asks for those only where they exist."""

    def __call__(self, canvas: PackedCanvas) -> torch.Tensor: ...


def make_backbone(model: ReferenceModel, attention="auto", *, graphs: bool = True, quantize: str | None = None,
                  graph_max_tokens: int = DEFAULT_GRAPH_MAX_TOKENS) -> Backbone:
    """The backbone for `model`.

    `attention` is a setting (`auto` | `torch` | `flashinfer`) or an attention backend already
    made (`make_attention_backend`). FlashInfer on CUDA gets the fused path (CUDA graphs for
    steps up to `graph_max_tokens` when `graphs`); anything else gets the reference modules
    (logged). `auto` falls back to torch attention when FlashInfer fails its boot check;
    `flashinfer` raises instead.
    `quantize="fp8"` (Hopper, fused path only) runs the projections in FP8 (`fp8.py`).
    """
    device = model.audio_heads.weight.device
    if quantize == "fp8":
        check_fp8_device(device)
    backend = make_attention_backend(attention, model) if isinstance(attention, str) else attention
    if backend.name == "flashinfer" and device.type == "cuda":
        buckets = token_buckets_up_to(graph_max_tokens)
        fused = FusedBackbone(model, backend, graphs=graphs and bool(buckets), quantize=quantize,
                              token_buckets=buckets or GRAPH_TOKEN_BUCKETS)
        fused.capture()
        graphs_note = (f"up to {fused.graph_max_tokens} tokens ({len(fused.graphs.captured)} captured in "
                       f"{fused.graphs.capture_seconds:.1f} s)" if fused.graphs_enabled else "off")
        log.info("backbone: fused, FlashInfer (%s kernels), CUDA graphs %s", getattr(backend, "backend", "?"),
                 graphs_note)
        return fused
    if quantize is not None:
        raise QuantizationUnsupported(
            f"--quantize {quantize} needs the fused FlashInfer path, which is unavailable here")
    log.info("backbone: reference modules, %s attention on %s", backend.name, device.type)
    return OmniVoiceBackbone(model, backend)
