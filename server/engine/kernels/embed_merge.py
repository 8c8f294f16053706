"""A step's input embeddings in one pass (Triton, CUDA).

One program per row reads what the reference's `_prepare_embed_inputs` keeps for it: its text
row, or its eight audio rows summed in float32 and rounded once. `check` finds a summation order
that gives the reference's bits on the model's own tables; without one the backbone keeps the
reference's modules (docs/architecture.md, "Kernels").
"""

from __future__ import annotations

import torch

from server.engine.kernels.triton_env import kernels_can_run
from server.engine.reference import ReferenceModel

try:  # Triton is optional: CPU installs keep the reference's modules
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

if triton is not None:

    @triton.jit
    def _audio_row(ids, offsets, audio_table, S, HIDDEN, row, c, cols, keep):
        """Codebook `c`'s audio embedding of `row`, in float32."""
        index = tl.load(ids + c * S + row) + tl.load(offsets + c)
        return tl.load(audio_table + index * HIDDEN + cols, mask=keep).to(tl.float32)

    # the row count changes every step: not specialised on (one build serves every step)
    @triton.jit(do_not_specialize=["S"])
    def _embed_merge_kernel(ids, mask, text_table, audio_table, offsets, out, S, HIDDEN,
                            C: tl.constexpr, BLOCK: tl.constexpr, TREE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        keep = cols < HIDDEN
        if tl.load(mask + row) != 0:
            if TREE:  # eight codebooks summed in pairs at half the distance, as CUDA's block reduction
                acc = ((_audio_row(ids, offsets, audio_table, S, HIDDEN, row, 0, cols, keep)
                        + _audio_row(ids, offsets, audio_table, S, HIDDEN, row, 4, cols, keep))
                       + (_audio_row(ids, offsets, audio_table, S, HIDDEN, row, 2, cols, keep)
                          + _audio_row(ids, offsets, audio_table, S, HIDDEN, row, 6, cols, keep))) \
                    + ((_audio_row(ids, offsets, audio_table, S, HIDDEN, row, 1, cols, keep)
                        + _audio_row(ids, offsets, audio_table, S, HIDDEN, row, 5, cols, keep))
                       + (_audio_row(ids, offsets, audio_table, S, HIDDEN, row, 3, cols, keep)
                          + _audio_row(ids, offsets, audio_table, S, HIDDEN, row, 7, cols, keep)))
            else:  # in codebook order
                acc = tl.zeros((BLOCK,), dtype=tl.float32)
                for c in tl.static_range(C):
                    acc += _audio_row(ids, offsets, audio_table, S, HIDDEN, row, c, cols, keep)
            value = acc.to(out.dtype.element_ty)
        else:
            value = tl.load(text_table + tl.load(ids + row) * HIDDEN + cols, mask=keep)
        tl.store(out + row * HIDDEN + cols, value, mask=keep)


ORDER_TREE, ORDER_SEQUENTIAL = "tree", "sequential"


available = kernels_can_run  # whether this kernel can run on a device


@torch.inference_mode()
def embed_merge(model: ReferenceModel, ids: torch.Tensor, mask: torch.Tensor, order: str = ORDER_TREE) -> torch.Tensor:
    """ids (C, S) long, mask (S,) bool -> (S, hidden) embeddings in the tables' dtype: the
    reference's `_prepare_embed_inputs` for one packed row."""
    text_table = model.get_input_embeddings().weight
    audio_table = model.audio_embeddings.weight
    ids, mask = ids.contiguous(), mask.contiguous()
    c, s = ids.shape
    hidden = text_table.shape[1]
    assert audio_table.shape[1] == hidden and audio_table.dtype == text_table.dtype
    out = torch.empty((s, hidden), dtype=audio_table.dtype, device=ids.device)
    if s:
        _embed_merge_kernel[(s,)](ids, mask, text_table, audio_table, model.codebook_layer_offsets, out, s, hidden,
                                  C=c, BLOCK=triton.next_power_of_2(hidden), TREE=order == ORDER_TREE and c == 8,
                                  num_warps=4)
    return out


@torch.inference_mode()
def reference(model: ReferenceModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The reference's own embeddings (on CUDA its codebook sum accumulates in float32 and
    rounds once; the CPU's rounds half-precision sums as it goes, so only CUDA gives its bits)."""
    return model._prepare_embed_inputs(ids.unsqueeze(0), mask.unsqueeze(0))[0]


@torch.inference_mode()
def check(model: ReferenceModel, device, rows: int = 4096, seed: int = 0) -> dict:
    """Each order against the reference on the model's own tables, random ids (three rows in
    four audio): the number of differing values and the largest difference."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    c = model.config.num_audio_codebook
    audio_vocab = model.audio_embeddings.weight.shape[0] // c
    text_vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, audio_vocab, (c, rows), generator=gen)
    mask = torch.rand(rows, generator=gen) < 0.75
    ids[0, ~mask] = torch.randint(0, text_vocab, (int((~mask).sum()),), generator=gen)
    ids, mask = ids.to(device), mask.to(device)
    want = reference(model, ids, mask)
    out = {}
    for order in (ORDER_TREE, ORDER_SEQUENTIAL):
        got = embed_merge(model, ids, mask, order)
        out[order] = {"differing": int((got != want).sum()), "max_abs_diff": float((got - want).abs().max())}
    return out


def pick_order(result: dict) -> str | None:
    """The first order that gives the reference's bits, else None."""
    return next((order for order in (ORDER_TREE, ORDER_SEQUENTIAL) if result[order]["differing"] == 0), None)
