"""The one-launch selection keys against the sampler's torch path, on the CPU through Triton's
interpreter (marker `kernels`: a process started with `TRITON_INTERPRET=1`). There the
interpreter's `log` is numpy's, a unit in the last place off torch's now and then, so keys
are compared to that rounding; on a GPU both call libdevice's `logf` and the sampler takes
the kernel only when they are bit-identical (`test_kernel_on_the_gpu_is_bit_identical`)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels import position_keys as pk
from server.engine.model.canvas import PackedCanvas
from server.engine.model.sampler import Sampler
from tests.unit.test_sampler import MASK, STEPS, C, T, V, _lone

kernels = pytest.mark.kernels  # under Triton's interpreter: `TRITON_INTERPRET=1 pytest -m kernels`


@kernels
def test_check_in_the_interpreter():
    """The start-up check's inputs (NaN, infinities, overflowing knobs, revealed positions)."""
    result = pk.check("cpu")
    assert result["id_mismatches"] == 0 and result["flag_mismatches"] == 0, result
    assert result["key_max_abs_diff"] < 1e-5, result


def _sample(fused_keys: bool, lone: bool) -> list[torch.Tensor]:
    sampler = Sampler(MASK, C, torch.device("cpu"), fused_scores=False, fused_keys=fused_keys)
    assert sampler.fused_keys is fused_keys
    c1, u1 = _lone(1, 5.0, 2.0)
    c2, u2 = _lone(2, 3.0, 0.0)
    i1, i2 = c1.items[0], c2.items[0]
    canvas = c1 if lone else PackedCanvas(torch.zeros((C, 1)), torch.zeros(1), torch.zeros(1), [1],
                                          torch.zeros(1), [i1, i2], [0, T], [2 * T, None])
    utts = [u1] if lone else [u1, u2]
    gen = torch.Generator().manual_seed(9)
    for step in range(STEPS):
        for u in utts:
            u.step = step
        logits = torch.randn((2 * T if lone else 3 * T, C, V), generator=gen) * 3
        flags = sampler.step(logits, canvas, utts)
        assert flags.tolist() == [True] * len(utts)
    return [u.item.tokens.clone() for u in utts]


@kernels
@pytest.mark.parametrize("lone", [True, False])
def test_the_sampler_reveals_the_same_tokens_with_the_kernel(lone, monkeypatch):
    """A lone item (keys codebook-major, read by top-k without a copy) and a batch of two."""
    # here keys may be a unit in the last place off (numpy's log): let the sampler take the kernel
    monkeypatch.setattr(pk, "passes", lambda r: r["id_mismatches"] == r["flag_mismatches"] == 0
                        and r["key_max_abs_diff"] < 1e-5)
    fused, plain = _sample(True, lone), _sample(False, lone)
    assert all(torch.equal(a, b) for a, b in zip(fused, plain)), lone
    assert not any(bool((t == MASK).any()) for t in fused)


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
