"""Packed forward vs the reference forward, on the same canvases and weights.

The reference runs as `_generate_iterative` runs it: a dense batch of 2B rows (conditional
canvases, then unconditional target-only ones), right-padded, a boolean attention mask
per row (pad rows see only themselves), `OmniVoice.forward` over every position. Its logits
at the target positions are gathered into the packed canvas's `tgt_index` order, so the
two results compare row for row. `captured_tokens` catches the reference `generate()`'s
token canvases just before it decodes them, for token-level parity.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from server.engine.model.canvas import PackedCanvas, build_packed_canvas
from server.engine.work import CanvasItem


def random_items(model, specs: list[tuple[int, int, float]], seed: int, device,
                 reveal: float = 0.5) -> list[CanvasItem]:
    """Canvases of the reference's layout: (words of text, target frames, guidance) each.

    Built by the reference's `_prepare_inference_inputs`; a fraction `reveal` of each target
    is filled with random codes, as mid-generation.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    c, mask_id = model.config.num_audio_codebook, model.config.audio_mask_id
    words = "the quick brown fox jumps over a lazy dog while seven singers hum along".split()
    items = []
    for i, (n_words, frames, guidance) in enumerate(specs):
        text = " ".join(rng.choice(words) for _ in range(n_words)) + "."
        inputs = model._prepare_inference_inputs(text, frames, None, None, None, None, True)
        ids = inputs["input_ids"][0].cpu()
        mask = inputs["audio_mask"][0].cpu()
        prefix = ids.shape[1] - frames
        tokens = ids[:, prefix:].clone()
        shown = torch.rand(c, frames, generator=gen) < reveal
        tokens[shown] = torch.randint(0, mask_id, (int(shown.sum()),), generator=gen)
        items.append(CanvasItem(
            item_id=f"p{i}", prefix_ids=ids[:, :prefix].to(device),
            prefix_audio_mask=mask[:prefix].to(device), tokens=tokens.to(device), guidance_scale=guidance,
        ))
    return items


@torch.inference_mode()
def reference_target_logits(model, canvas: PackedCanvas) -> torch.Tensor:
    """The reference forward's float32 logits at the canvas's target rows, (S_t, C, V)."""
    items = canvas.items
    b = len(items)
    c = model.config.num_audio_codebook
    device = model.audio_heads.weight.device
    cond = [torch.cat([it.prefix_ids, it.tokens], 1) for it in items]
    cmask = [torch.cat([it.prefix_audio_mask, torch.ones(it.target_len, dtype=torch.bool, device=device)])
             for it in items]
    max_len = max(x.shape[1] for x in cond)
    ids = torch.full((2 * b, c, max_len), model.config.audio_mask_id, dtype=torch.long, device=device)
    amask = torch.zeros(2 * b, max_len, dtype=torch.bool, device=device)
    att = torch.zeros(2 * b, 1, max_len, max_len, dtype=torch.bool, device=device)
    for i, it in enumerate(items):
        n, t = cond[i].shape[1], it.target_len
        ids[i, :, :n], amask[i, :n] = cond[i], cmask[i]
        att[i, :, :n, :n] = True
        ids[b + i, :, :t], amask[b + i, :t] = it.tokens, True
        att[b + i, :, :t, :t] = True
        if max_len > t:
            diag = torch.arange(t, max_len, device=device)
            att[b + i, :, diag, diag] = True
    logits = model(input_ids=ids, audio_mask=amask, attention_mask=att).logits  # (2B, C, L, V)
    rows = []
    for i, it in enumerate(items):
        n, t = cond[i].shape[1], it.target_len
        rows.append(logits[i, :, n - t : n].transpose(0, 1))
    for i, it in enumerate(items):
        if it.does_cfg:
            rows.append(logits[b + i, :, : it.target_len].transpose(0, 1))
    return torch.cat(rows).float()


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative L2 error, max abs difference, argmax agreement (fractions), finiteness."""
    out, ref = out.double(), ref.double()
    diff = out - ref
    return {
        "rel_l2": float(diff.norm() / ref.norm().clamp_min(1e-30)),
        "max_abs": float(diff.abs().max()),
        "ref_abs_max": float(ref.abs().max()),
        "argmax_agree": float((out.argmax(-1) == ref.argmax(-1)).double().mean()),
        "finite": bool(torch.isfinite(out).all()),
    }


def parity_canvas(model, seed: int, device, n_items: int = 6) -> PackedCanvas:
    """A mixed step: short and long targets, one item at guidance 0."""
    rng = random.Random(seed)
    specs = []
    for i in range(n_items):
        frames = rng.randint(20, 300)
        specs.append((max(2, math.ceil(frames / 10)), frames, 0.0 if i == 1 else 2.0))
    return build_packed_canvas(random_items(model, specs, seed, device), device)


@contextmanager
def captured_tokens(model) -> Iterator[list]:
    """Within the block, every `_decode_and_post_process` call's tokens (a (C, T) tensor,
    or a list of chunk tensors for long text) are appended to the yielded list."""
    captured: list = []
    original = model._decode_and_post_process

    def capture(tokens, rms, gen_config):
        captured.append(tokens)
        return original(tokens, rms, gen_config)

    model._decode_and_post_process = capture
    try:
        yield captured
    finally:
        del model._decode_and_post_process
