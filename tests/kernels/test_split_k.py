"""The Triton norm that sums split-K slices, against its definition, alone and in the backbone,
on the CPU through Triton's interpreter (this folder: marker `kernels`, a process started with
`TRITON_INTERPRET=1`; float16 and float32: the interpreter's bfloat16 casts truncate)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from bench.parity import compare, random_items
from server.checkpoint import load_omnivoice
from server.engine.kernels import split_k
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.layer_ops import TorchOps
from server.engine.model.canvas import build_packed_canvas
from server.engine.model.fused_backbone import FusedBackbone

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_norm_sums_the_slices_in_the_interpreter(dtype, splits):
    torch.manual_seed(splits)
    x, w = torch.randn(9, 96), torch.randn(40, 96) / 10
    parts = split_k.split_linear(x, w, splits).contiguous()
    res, ln = torch.randn(9, 40).to(dtype), (1 + torch.randn(40) / 10).to(dtype)
    got_res = res.clone()
    got = split_k.split_add_rmsnorm(parts, got_res, ln, 1e-6)
    want_res, want = split_k.reference(parts, res, ln, 1e-6)
    # the residual: the slices summed in order, rounded, added, rounded: exactly
    assert torch.equal(got_res, want_res), (dtype, splits)
    assert float((got.float() - want.float()).abs().max()) <= 2e-3 * float(want.float().abs().max())
    # and that is the engine's add + norm of the unsplit projection's rounded output
    h = (x @ w.T).to(dtype)
    ref_res = res.clone()
    TorchOps.fused_add_rmsnorm(h, ref_res, ln, 1e-6)
    assert float((got_res.float() - ref_res.float()).abs().max()) <= 2e-3 * float(ref_res.float().abs().max())


@needs_triton
def test_norm_gives_the_same_result_in_any_program_shape():
    """Rows a program, warps: the same residual, the same norm to rounding."""
    torch.manual_seed(0)
    parts = split_k.split_linear(torch.randn(11, 96), torch.randn(40, 96) / 10, 2).contiguous()
    res, ln = torch.randn(11, 40).to(torch.float16), (1 + torch.randn(40) / 10).to(torch.float16)
    base_res = res.clone()
    base = split_k.split_add_rmsnorm(parts, base_res, ln, 1e-6)
    for shape in ((2, 1), (4, 2), (8, 8), (16, 4)):
        got_res = res.clone()
        got = split_k.split_add_rmsnorm(parts, got_res, ln, 1e-6, shape=shape)
        assert torch.equal(got_res, base_res), shape
        assert float((got.float() - base.float()).abs().max()) <= 2e-3 * float(base.float().abs().max()), shape


@needs_triton
def test_norm_of_an_empty_step_and_the_check():
    # an empty step writes nothing
    assert split_k.split_add_rmsnorm(torch.zeros(2, 0, 40), torch.zeros(0, 40), torch.ones(40), 1e-6).shape == (0, 40)
    assert split_k.check("cpu", torch.float16, 64, 1e-6) < 2e-3


@needs_triton
def test_backbone_with_split_projections_in_the_interpreter(tiny_checkpoint):
    """The fused forward with its narrow projections split and summed by the norm gives the
    unsplit forward's logits (float32, CPU: the same sums in another order)."""
    model = load_omnivoice(str(tiny_checkpoint), "cpu", "float32")
    attn = TorchAttention(model.llm.config.head_dim ** -0.5)
    plain = FusedBackbone(model, attn, TorchOps())
    split = FusedBackbone(model, attn, TorchOps(), split_k=True)
    assert not plain.split_k and split.split_k  # off by default off CUDA; on when asked and checked
    for splits, items in ((4, [(5, 40, 2.0)]), (2, [(5, 60, 2.0), (3, 40, 0.0), (4, 30, 2.0)])):
        canvas = build_packed_canvas(random_items(model, items, seed=splits, device="cpu"), "cpu")
        assert split_k.splits_for(canvas.total_len) == splits, canvas.total_len
        result = compare(split(canvas), plain(canvas))
        assert result["rel_l2"] < 1e-5 and result["argmax_agree"] == 1.0, result
