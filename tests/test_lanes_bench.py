"""`python -m bench.lanes`: how it splits a step's documents over lanes (no GPU needed)."""

from __future__ import annotations

import itertools

import pytest
import torch

from bench.lanes import split_documents, sub_canvas
from bench.parity import random_items
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.layer_ops import TorchOps
from server.engine.model.canvas import build_packed_canvas
from server.engine.model.fused_backbone import FusedBackbone


@pytest.mark.parametrize("doc_lens,lanes,want", [
    ([279, 250], 2, [(0, 1), (1, 2)]),
    ([279, 250, 279, 250], 2, [(0, 2), (2, 4)]),
    ([279, 250, 279, 250, 279, 250, 280, 250], 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
    ([1, 100], 2, [(0, 1), (1, 2)]),
    ([100, 1, 1], 2, [(0, 1), (1, 3)]),
    ([5, 5, 5], 4, None),
])
def test_documents_split_at_boundaries_into_nonempty_even_lanes(doc_lens, lanes, want):
    got = split_documents(doc_lens, lanes)
    assert got == want
    if got:
        assert got[0][0] == 0 and got[-1][1] == len(doc_lens)
        assert all(a < b for a, b in got) and all(b == c for (_, b), (c, _) in itertools.pairwise(got))


def test_lanes_compute_exactly_their_rows_of_the_whole_step(reference_model):
    """The bench's premise: a step's documents split over lanes give the whole step's rows."""
    items = random_items(reference_model, [(3, 40, 2.0), (5, 70, 0.0), (2, 17, 2.0)], seed=1, device="cpu")
    canvas = build_packed_canvas(items, "cpu")
    backbone = FusedBackbone(reference_model, TorchAttention(reference_model.llm.config.head_dim ** -0.5), TorchOps())
    whole = backbone.hidden_states(canvas)
    parts = [sub_canvas(canvas, a, b) for a, b in split_documents(list(canvas.doc_lens), 2)]
    assert [p.doc_lens for p in parts] == [list(canvas.doc_lens[:2]), list(canvas.doc_lens[2:])]
    assert all(p.position_ids[0] == 0 for p in parts)  # a lane starts with a document
    lanes = torch.cat([backbone.hidden_states(p) for p in parts], 0)
    assert torch.allclose(lanes, whole, atol=1e-5, rtol=1e-5)
