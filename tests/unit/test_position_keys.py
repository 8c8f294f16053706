"""The one-launch selection keys kernel's compile-time signature, and on a GPU its bit-identity
with the sampler's torch path (through Triton's interpreter, where `log` is numpy's:
tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels import position_keys as pk
from server.engine.model.canvas import PackedCanvas
from server.engine.model.sampler import Sampler


@pytest.mark.gpu
def test_kernel_on_the_gpu_is_bit_identical():
    for rows in (1, 300, 5000):
        result = pk.check("cuda", rows=rows)
        assert pk.passes(result), (rows, result)


@pytest.mark.gpu
@pytest.mark.parametrize("items", [1, 3])
def test_sampler_tokens_on_the_gpu_equal_the_torch_path(items):
    """Full-size codebooks and vocabulary, the reference's 32 steps, bf16 logits: a seeded
    request reveals the very same tokens with the kernel as without it."""
    import types

    from server.engine.planning.utterances import unmask_schedule
    from server.engine.work import CanvasItem

    c, v, mask, t, steps = 8, 1025, 1024, 250, 32

    def run(fused_keys: bool) -> list:
        sampler = Sampler(mask, c, torch.device("cuda"), fused_keys=fused_keys)
        assert sampler.fused_keys is fused_keys
        utts, canvas_items = [], []
        for i in range(items):
            tokens = torch.full((c, t), mask, dtype=torch.long, device="cuda")
            item = CanvasItem(f"x#{i}", torch.zeros((c, 2), dtype=torch.long, device="cuda"),
                              torch.zeros(2, dtype=torch.bool, device="cuda"), tokens, 2.0)
            opts = types.SimpleNamespace(layer_penalty_factor=5.0, position_temperature=5.0, class_temperature=0.0)
            gen = torch.Generator(device="cuda")
            gen.manual_seed(100 + i)
            utts.append(types.SimpleNamespace(options=opts, schedule=unmask_schedule(t, c, steps, 0.1), step=0,
                                              generator=gen, item=item))
            canvas_items.append(item)
        canvas = PackedCanvas(torch.zeros((c, 1)), torch.zeros(1), torch.zeros(1), [1], torch.zeros(1), canvas_items,
                              [i * t for i in range(items)], [(items + i) * t for i in range(items)])
        gen = torch.Generator(device="cuda")
        gen.manual_seed(9)
        for step in range(steps):
            for u in utts:
                u.step = step
            logits = (torch.randn((2 * items * t, c, v), generator=gen, device="cuda") * 3).to(torch.bfloat16)
            assert sampler.step(logits, canvas, utts).tolist() == [True] * items
        return [u.item.tokens.cpu() for u in utts]

    fused, plain = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))
    assert not any(bool((x == mask).any()) for x in fused)


def test_arguments_that_change_with_lengths_compile_no_new_variant():
    """A step's row count and its views' strides and offsets follow the texts' lengths. Were
    Triton to specialise on them, the first request whose rows were a multiple of 16 would
    wait for a new compile (300-420 ms on an H200, a fresh-length first sound at 502 ms)."""
    params = {p.name: p for p in pk._position_keys_kernel.params}
    for name in ("rows", "su_r", "su_c", "st_r", "st_c", "sk_r", "sk_c"):
        assert params[name].do_not_specialize, name
    for name in ("conf", "pred", "unif", "pen", "temp", "tok", "key_out", "pred_out", "finite_out"):
        assert params[name].do_not_specialize_on_alignment, name
