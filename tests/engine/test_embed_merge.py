"""The one-pass input embeddings on a GPU, bit-identical to the reference's
`_prepare_embed_inputs` in bfloat16 and float16 (through Triton's interpreter: tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.checkpoint import load_omnivoice
from server.engine.kernels import embed_merge as em


@pytest.mark.gpu
def test_embeddings_on_the_gpu_give_the_references_bits(tiny_checkpoint):
    for dtype in ("bfloat16", "float16"):
        model = load_omnivoice(str(tiny_checkpoint), "cuda", dtype)
        result = em.check(model, "cuda", rows=8192)
        assert em.pick_order(result) == em.ORDER_TREE, (dtype, result)
        ids = torch.randint(0, 1025, (8, 300), device="cuda")
        mask = torch.rand(300, device="cuda") < 0.8
        assert torch.equal(em.embed_merge(model, ids, mask), em.reference(model, ids, mask))
