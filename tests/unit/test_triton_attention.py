"""The small-step attention kernel's tile tables and graph planner, and on Hopper its tensor
descriptor loads against its pointer loads (the kernel through Triton's interpreter:
tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels.attention import triton_backend as ta
from server.engine.kernels.attention.torch_backend import TorchAttention


def test_tile_table_covers_every_row_once():
    docs = [1, 64, 65, 200, 3]
    table = ta.tile_table(docs, block_m=64, tiles=ta.max_tiles(len(docs), sum(docs), 64))
    covered = torch.zeros(sum(docs), dtype=torch.int32)
    start = 0
    bounds = {}
    for n in docs:
        bounds.update({row: (start, start + n) for row in range(start, start + n)})
        start += n
    for q_start, doc_end, doc_start in table.tolist():
        if doc_end == 0:
            continue  # an empty tile
        rows = range(q_start, min(q_start + 64, doc_end))
        assert all(bounds[row] == (doc_start, doc_end) for row in rows)
        covered[list(rows)] += 1
    assert bool((covered == 1).all())
    assert table.shape[0] == ta.max_tiles(len(docs), sum(docs), 64)


def test_a_table_too_small_is_refused():
    with pytest.raises(ValueError):
        ta.tile_table([64, 64], block_m=64, tiles=1)


def test_graph_planner_refuses_another_shape():
    planner = ta.TritonAttention("cpu", 1.0).graph_planner(2, 10)
    with pytest.raises(ValueError):
        planner.plan([5, 6])


@pytest.mark.gpu
def test_tma_and_pointer_loads_agree_on_the_gpu():
    """On Hopper the kernel loads through tensor descriptors; it must give what the pointer
    loads give (same blocks, same arithmetic) and what float32 attention gives, for one-row
    and pad documents, a graph table's empty tiles, three pipeline stages past 2048 rows, and
    operands a descriptor cannot take (which fall back to pointer loads)."""
    dev = torch.device("cuda")
    if not ta.tma_loads(dev):
        pytest.skip("needs a GPU with TMA (Hopper or later)")
    torch.manual_seed(0)
    scale = 128**-0.5
    ref = TorchAttention(scale)
    for docs in ([1], [5], [287, 250, 1, 1, 5], [130, 1, 1], [650, 560] * 3):
        seq = sum(docs)
        qkv = (torch.randn(seq, 32, 128) * 2).to(dev, torch.bfloat16)
        q, k, v = qkv[:, :16].contiguous(), qkv[:, 16:24].contiguous(), qkv[:, 24:]
        want = ref.attend(ref.plan(docs), *(t.float() for t in (q, k, v)))
        tiles = ta._to_device(ta.tile_table(docs, tiles=ta.max_tiles(len(docs) + 2, seq)), dev)  # empty tiles too
        by_pointers = ta.attend(tiles, q, k, v, scale, tma=False).float()
        by_tma = ta.attend(tiles, q, k, v, scale, tma=True).float()
        assert float((by_tma - by_pointers).abs().max()) <= 2e-2 * float(by_pointers.abs().max()), docs
        assert float((by_tma - want).norm() / want.norm()) < 1e-2, docs
        odd = torch.empty(seq * 16 * 128 + 1, dtype=torch.bfloat16, device=dev)[1:].view(seq, 16, 128)
        odd.copy_(q)  # 2-byte aligned: no descriptor, pointer loads
        assert not ta._descriptor_fits(odd)
        assert torch.equal(ta.attend(tiles, odd, k, v, scale), ta.attend(tiles, q, k, v, scale, tma=False))
