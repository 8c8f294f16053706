"""Split-K projections and the norm that sums their slices, against their definitions: the
GEMM on CPU tensors, the Triton norm through the interpreter (float16 and float32: the
interpreter's bfloat16 casts truncate)."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from server.engine.kernels.split_k import split_linear
from tests.triton_interpreter import run_in_triton_interpreter


@pytest.mark.parametrize("splits", [1, 2, 3, 4])
def test_split_linear_slices_the_inner_dimension(splits):
    torch.manual_seed(0)
    x, w = torch.randn(7, 96), torch.randn(40, 96)
    parts = split_linear(x, w, splits)
    assert parts.shape == (splits, 7, 40) and parts.dtype == torch.float32
    ks = 96 // splits
    for s in range(splits):  # slice s is x's columns [s*ks, (s+1)*ks) against the same weight columns
        assert torch.allclose(parts[s], x[:, s * ks:(s + 1) * ks] @ w[:, s * ks:(s + 1) * ks].T, atol=1e-5)
    assert torch.allclose(parts.sum(0), x @ w.T, atol=1e-4)


def test_split_linear_refuses_an_uneven_split():
    with pytest.raises(ValueError, match="cannot split"):
        split_linear(torch.randn(3, 10), torch.randn(4, 10), 3)


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")

SCRIPT = textwrap.dedent("""
    import torch
    from server.engine.kernels import split_k as m
    from server.engine.kernels.layer_ops import TorchOps
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.float32):
        for splits in (1, 2, 3):
            x, w = torch.randn(9, 96), torch.randn(40, 96) / 10
            parts = m.split_linear(x, w, splits).contiguous()
            res, ln = torch.randn(9, 40).to(dtype), (1 + torch.randn(40) / 10).to(dtype)
            got_res = res.clone()
            got = m.split_add_rmsnorm(parts, got_res, ln, 1e-6)
            want_res, want = m.reference(parts, res, ln, 1e-6)
            # the residual: the slices summed in order, rounded, added, rounded: exactly
            assert torch.equal(got_res, want_res), (dtype, splits)
            assert float((got.float() - want.float()).abs().max()) <= 2e-3 * float(want.float().abs().max())
            # and that is the engine's add + norm of the unsplit projection's rounded output
            h = (x @ w.T).to(dtype)
            ref_res = res.clone()
            TorchOps.fused_add_rmsnorm(h, ref_res, ln, 1e-6)
            assert float((got_res.float() - ref_res.float()).abs().max()) <= 2e-3 * float(ref_res.float().abs().max())
    # any program shape (rows a program, warps): the same residual, the same norm to rounding
    parts = m.split_linear(torch.randn(11, 96), torch.randn(40, 96) / 10, 2).contiguous()
    res, ln = torch.randn(11, 40).to(torch.float16), (1 + torch.randn(40) / 10).to(torch.float16)
    base_res = res.clone()
    base = m.split_add_rmsnorm(parts, base_res, ln, 1e-6)
    for shape in ((2, 1), (4, 2), (8, 8), (16, 4)):
        got_res = res.clone()
        got = m.split_add_rmsnorm(parts, got_res, ln, 1e-6, shape=shape)
        assert torch.equal(got_res, base_res), shape
        assert float((got.float() - base.float()).abs().max()) <= 2e-3 * float(base.float().abs().max()), shape
    # an empty step writes nothing
    assert m.split_add_rmsnorm(torch.zeros(2, 0, 40), torch.zeros(0, 40), torch.ones(40), 1e-6).shape == (0, 40)
    assert m.check("cpu", torch.float16, 64, 1e-6) < 2e-3
    print("ok")
""")


@needs_triton
def test_norm_kernel_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)


BACKBONE_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from bench.parity import compare, random_items
    from server.checkpoint import load_omnivoice
    from server.engine.kernels import split_k
    from server.engine.kernels.attention.torch_backend import TorchAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone
    from server.engine.kernels.layer_ops import TorchOps
    model = load_omnivoice(sys.argv[1], "cpu", "float32")
    attn = TorchAttention(model.llm.config.head_dim ** -0.5)
    plain = FusedBackbone(model, attn, TorchOps())
    split = FusedBackbone(model, attn, TorchOps(), split_k=True)
    assert not plain.split_k and split.split_k  # off by default off CUDA; on when asked and checked
    for splits, items in ((4, [(5, 40, 2.0)]), (2, [(5, 150, 2.0), (3, 120, 0.0), (4, 90, 2.0)])):
        canvas = build_packed_canvas(random_items(model, items, seed=splits, device="cpu"), "cpu")
        assert split_k.splits_for(canvas.total_len) == splits, canvas.total_len
        result = compare(split(canvas), plain(canvas))
        assert result["rel_l2"] < 1e-5 and result["argmax_agree"] == 1.0, result
    print("ok")
""")


@needs_triton
def test_backbone_with_split_projections_in_the_interpreter(tiny_checkpoint):
    """The fused forward with its narrow projections split and summed by the norm gives the
    unsplit forward's logits (float32, CPU: the same sums in another order)."""
    run_in_triton_interpreter(BACKBONE_SCRIPT, args=[str(tiny_checkpoint)])


def test_splits_by_rows():
    from server.engine.kernels.split_k import splits_for

    assert [splits_for(r) for r in (1, 135, 192, 193, 544, 1024, 1025, 34000)] == [4, 4, 4, 2, 2, 2, 1, 1]
    # a model whose inner dimensions a count does not divide gets the largest halving that does
    assert splits_for(135, (2048, 3072)) == 4 and splits_for(135, (2048, 3070)) == 2
    assert splits_for(544, (2047, 3072)) == 1 and splits_for(135, (6, 10)) == 2
