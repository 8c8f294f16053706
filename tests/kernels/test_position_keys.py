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


def test_check_in_the_interpreter():
    """The start-up check's inputs (NaN, infinities, overflowing knobs, revealed positions)."""
    result = pk.check("cpu")
    assert result["id_mismatches"] == 0 and result["flag_mismatches"] == 0, result
    assert result["key_max_abs_diff"] < 1e-5, result


@pytest.mark.parametrize("lone", [True, False])
def test_the_sampler_reveals_the_same_tokens_with_the_kernel(lone, monkeypatch):
    """A lone item (keys codebook-major, read by top-k without a copy) and a batch of two."""
    # here keys may be a unit in the last place off (numpy's log): let the sampler take the kernel
    monkeypatch.setattr(pk, "passes", lambda r: r["id_mismatches"] == r["flag_mismatches"] == 0
                        and r["key_max_abs_diff"] < 1e-5)
    fused, plain = _sample(True, lone), _sample(False, lone)
    assert all(torch.equal(a, b) for a, b in zip(fused, plain)), lone
    assert not any(bool((t == MASK).any()) for t in fused)
