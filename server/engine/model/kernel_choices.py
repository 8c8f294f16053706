"""Which Triton kernels a fused backbone runs in place of its plain ops: each by default on CUDA,
and only where its start-up check against the plain ops passes here (else logged, and the plain
ops run).
"""

from __future__ import annotations

import logging

import torch

from server.engine.kernels import embed_merge, qk_norm_rope, split_k
from server.engine.kernels.triton_env import checked_error
from server.engine.reference import ReferenceModel

log = logging.getLogger(__name__)


def _cuda_or_none(device: torch.device) -> torch.device | None:
    return device if device.type == "cuda" else None


def choose_qk_rope(wanted: bool | None, device: torch.device, dtype: torch.dtype, num_q_heads: int,
                   num_kv_heads: int, head_dim: int, eps: float, rope_theta: float) -> tuple[str, float | None]:
    """(`triton`: one fused q/k norm + RoPE pass, or `separate`: the ops' rmsnorm then RoPE; the
    kernel's check error when it runs)."""
    if wanted is None:
        wanted = device.type == "cuda"
    if not wanted:
        return "separate", None
    if not qk_norm_rope.available(_cuda_or_none(device)):
        log.info("q/k norm + RoPE: Triton unavailable, using separate kernels")
        return "separate", None
    err = checked_error("q/k norm + RoPE", lambda: qk_norm_rope.check(
        device, dtype, num_q_heads, num_kv_heads, head_dim, eps, rope_theta), dtype, "using separate kernels")
    return ("separate", None) if err is None else ("triton", err)


def choose_split_k(wanted: bool | None, device: torch.device, dtype: torch.dtype, quantize: str | None,
                   hidden: int, eps: float) -> bool:
    """Whether small steps split their narrow projections (O, down) along the inner dimension,
    the add + norm after each summing the slices: in the model's own dtype only (not fp8)."""
    if wanted is None:
        wanted = device.type == "cuda" and quantize is None
    if not wanted:
        return False
    if quantize is not None or not split_k.available(_cuda_or_none(device)):
        log.info("split-K projections: unavailable here, unsplit")
        return False
    return checked_error("split-K add + norm", lambda: split_k.check(device, dtype, hidden, eps),
                         dtype, "unsplit projections") is not None


def choose_embed_order(wanted: bool | None, model: ReferenceModel,
                       device: torch.device) -> tuple[str | None, dict | None]:
    """(the order in which the one-pass embedding kernel sums the codebooks: the first that gives
    the reference's bits on this model's tables, or None for the reference's modules; the check)."""
    if wanted is None:
        wanted = device.type == "cuda"
    if not wanted:
        return None, None
    if not embed_merge.available(_cuda_or_none(device)):
        log.info("input embeddings: Triton unavailable, using the reference's modules")
        return None, None
    try:
        check = embed_merge.check(model, device)
    except Exception as exc:  # noqa: BLE001 - fall back, loudly
        log.warning("input embeddings kernel failed its check (%s); using the reference's modules", exc)
        return None, None
    order = embed_merge.pick_order(check)
    if order is None:
        log.warning("input embeddings kernel differs from the reference (%s); using the reference's modules", check)
    return order, check
