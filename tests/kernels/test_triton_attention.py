"""The small-step attention kernel against per-document SDPA, on the CPU through Triton's
interpreter (marker `kernels`: a process started with `TRITON_INTERPRET=1`), and its tile
tables."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels.attention import triton_backend as ta
from server.engine.kernels.attention.torch_backend import TorchAttention

HQ, HKV, D = 4, 2, 32


new_interpreter = pytest.mark.skipif(
    tuple(int(x) for x in __import__("triton").__version__.split(".")[:2]) < (3, 7),
    reason="Triton 3.6's interpreter cannot take a loaded scalar as a loop bound")


@new_interpreter
@pytest.mark.parametrize("docs", [[1], [5], [70, 3, 1, 64], [130, 1, 1]])
def test_kernel_in_the_interpreter(docs):
    """One row; documents shorter and longer than a tile, length-1 pad documents; a graph
    planner's static table, any layout of its documents and rows re-planned."""
    torch.manual_seed(0)
    scale = D ** -0.5
    ref = TorchAttention(scale)
    attn = ta.TritonAttention("cpu", scale)
    seq = sum(docs)
    qkv = torch.randn(seq, HQ + 2 * HKV, D) * 2
    q, k = qkv[:, :HQ].contiguous(), qkv[:, HQ:HQ + HKV].contiguous()
    v = qkv[:, HQ + HKV:]  # a strided view of the fused QKV output, as the backbone passes it
    want = ref.attend(ref.plan(docs), q, k, v)
    got = attn.attend(attn.plan(docs), q, k, v)
    assert float((got - want).abs().max()) < 1e-5, docs
    planner = attn.graph_planner(len(docs), seq)
    for layout in (docs, [seq - len(docs) + 1] + [1] * (len(docs) - 1), docs):
        want = ref.attend(ref.plan(layout), q, k, v)
        out = torch.empty_like(q)
        attn.attend(planner.plan(layout), q, k, v, out)
        assert float((out - want).abs().max()) < 1e-5, layout


@new_interpreter
def test_check_in_the_interpreter():
    assert ta.check("cpu", torch.float32, HQ, HKV, D) < 1e-5
