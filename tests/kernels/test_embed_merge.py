"""The one-pass input embeddings against the reference's `_prepare_embed_inputs`, on the CPU
through Triton's interpreter (marker `kernels`: a process started with `TRITON_INTERPRET=1`),
on the tiny checkpoint's own tables in float16 (the interpreter casts float32 to
bfloat16 by truncating, where CUDA rounds to nearest; the GPU test checks bfloat16)."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

from bench.parity import random_items
from server.checkpoint import load_omnivoice
from server.engine.kernels import embed_merge as em
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.layer_ops import TorchOps
from server.engine.model.canvas import build_packed_canvas
from server.engine.model.fused_backbone import FusedBackbone

CHECK_ROWS = 256


def _exact(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The reference's arithmetic as CUDA runs it: the codebook sum in float32, rounded once."""
    shifted = ids * mask + model.codebook_layer_offsets.view(-1, 1)
    audio = model.audio_embeddings(shifted).float().sum(0).to(model.audio_embeddings.weight.dtype)
    return torch.where(mask.unsqueeze(-1), audio, model.get_input_embeddings()(ids[0]))


@pytest.fixture(scope="module")
def half_model(tiny_checkpoint):
    return load_omnivoice(str(tiny_checkpoint), "cpu", "float16")


@pytest.fixture(scope="module")
def packed_row(half_model):
    """A real packed row (text and audio rows, several documents, a ragged tail)."""
    items = random_items(half_model, [(5, 40, 2.0), (3, 25, 0.0)], seed=1, device="cpu")
    canvas = build_packed_canvas(items, "cpu")
    assert bool(canvas.audio_mask.any()) and not bool(canvas.audio_mask.all())
    return canvas.packed_ids, canvas.audio_mask


@torch.inference_mode()
def test_embeddings_in_the_interpreter(half_model, packed_row):
    """Each summation order, strided ids included; text rows are the reference's (one row each)."""
    model, (ids, mask) = half_model, packed_row
    want = _exact(model, ids, mask)
    for order in (em.ORDER_TREE, em.ORDER_SEQUENTIAL):
        assert torch.equal(em.embed_merge(model, ids, mask, order), want), order
    wide = torch.zeros((ids.shape[0], ids.shape[1] * 2), dtype=ids.dtype)
    wide[:, ::2] = ids
    assert torch.equal(em.embed_merge(model, wide[:, ::2], mask), want)
    assert torch.equal(em.reference(model, ids, mask)[~mask], want[~mask])


@torch.inference_mode()
def test_a_backbone_asked_for_the_kernel_follows_its_check(half_model, packed_row, monkeypatch):
    """The CPU's own reference rounds its half-precision sums as it goes: the check sees it,
    and a backbone asked for the kernel keeps the reference's modules; taken, the forward
    embeds through the kernel. (The check on fewer random rows: the interpreter is slow.)"""
    model, (ids, mask) = half_model, packed_row
    monkeypatch.setattr(em, "check", functools.partial(em.check, rows=CHECK_ROWS))
    attn = TorchAttention(model.llm.config.head_dim ** -0.5)
    fused = FusedBackbone(model, attn, TorchOps(), fuse_embed=True)
    assert fused.embed_check is not None
    assert fused.embed_order == em.pick_order(fused.embed_check)
    assert FusedBackbone(model, attn, TorchOps()).embed_order is None  # off by default off CUDA
    if fused.embed_order is None:
        assert fused.embed_check[em.ORDER_TREE]["differing"] > 0
    fused.embed_order = em.ORDER_TREE  # taken: the forward embeds through the kernel
    assert torch.equal(fused._embed(ids, mask), _exact(model, ids, mask))
