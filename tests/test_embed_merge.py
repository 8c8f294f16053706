"""The one-pass input embeddings against the reference's `_prepare_embed_inputs`, on the CPU
through Triton's interpreter (in a subprocess: the interpreter is chosen when Triton is
imported), on the tiny checkpoint's own tables in float16 (the interpreter casts float32 to
bfloat16 by truncating, where CUDA rounds to nearest; the GPU test checks bfloat16)."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from bench.parity import random_items
    from server.checkpoint import load_omnivoice
    from server.engine.kernels import embed_merge as em
    from server.engine.kernels.attention.torch_backend import TorchAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone
    from server.engine.kernels.layer_ops import TorchOps

    def exact(model, ids, mask):
        # the reference's arithmetic as CUDA runs it: the codebook sum in float32, rounded once
        shifted = ids * mask + model.codebook_layer_offsets.view(-1, 1)
        audio = model.audio_embeddings(shifted).float().sum(0).to(model.audio_embeddings.weight.dtype)
        return torch.where(mask.unsqueeze(-1), audio, model.get_input_embeddings()(ids[0]))

    with torch.inference_mode():
        for dtype in ("float16",):
            model = load_omnivoice(sys.argv[1], "cpu", dtype)
            # a real packed row (text and audio rows, several documents), strided ids included
            items = random_items(model, [(5, 40, 2.0), (3, 25, 0.0)], seed=1, device="cpu")
            canvas = build_packed_canvas(items, "cpu")
            ids, mask = canvas.packed_ids, canvas.audio_mask
            assert bool(mask.any()) and not bool(mask.all())
            want = exact(model, ids, mask)
            for order in (em.ORDER_TREE, em.ORDER_SEQUENTIAL):
                assert torch.equal(em.embed_merge(model, ids, mask, order), want), (dtype, order)
            wide = torch.zeros((ids.shape[0], ids.shape[1] * 2), dtype=ids.dtype)
            wide[:, ::2] = ids
            assert torch.equal(em.embed_merge(model, wide[:, ::2], mask), want)
            assert torch.equal(em.reference(model, ids, mask)[~mask], want[~mask])  # text rows: one row each

            # the CPU's own reference rounds its half-precision sums as it goes: the check sees
            # it, and a backbone asked for the kernel keeps the reference's modules
            attn = TorchAttention(model.llm.config.head_dim ** -0.5)
            fused = FusedBackbone(model, attn, TorchOps(), fuse_embed=True)
            assert fused.embed_order == em.pick_order(fused.embed_check)
            assert FusedBackbone(model, attn, TorchOps()).embed_order is None  # off by default off CUDA
            if fused.embed_order is None:
                assert fused.embed_check[em.ORDER_TREE]["differing"] > 0
            fused.embed_order = em.ORDER_TREE  # taken: the forward embeds through the kernel
            assert torch.equal(fused._embed(ids, mask), want)
    print("ok")
""")


def test_embeddings_in_the_interpreter(tiny_checkpoint):
    run_in_triton_interpreter(SCRIPT, args=[str(tiny_checkpoint)])


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_embeddings_on_the_gpu_give_the_references_bits(tiny_checkpoint):
    import torch

    from server.checkpoint import load_omnivoice
    from server.engine.kernels import embed_merge as em
    for dtype in ("bfloat16", "float16"):
        model = load_omnivoice(str(tiny_checkpoint), "cuda", dtype)
        result = em.check(model, "cuda", rows=8192)
        assert em.pick_order(result) == em.ORDER_TREE, (dtype, result)
        ids = torch.randint(0, 1025, (8, 300), device="cuda")
        mask = torch.rand(300, device="cuda") < 0.8
        assert torch.equal(em.embed_merge(model, ids, mask), em.reference(model, ids, mask))
