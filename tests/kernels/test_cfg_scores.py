"""The one-pass CFG scoring kernel against the sampler's torch path, on the CPU through
Triton's interpreter (marker `kernels`: the interpreter is chosen when Triton is imported, so
these run in a process started with `TRITON_INTERPRET=1`)."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels import cfg_scores as cs
from server.engine.model.canvas import PackedCanvas
from server.engine.model.sampler import Sampler
from tests.unit.test_sampler import MASK, STEPS, C, T, V, _lone


def _sample(fused: bool, guidance2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Two items that differ in guidance and position noise, revealed step by step."""
    sampler = Sampler(MASK, C, torch.device("cpu"), fused_scores=fused)
    assert sampler.fused_scores is fused
    (c1, u1), (c2, u2) = _lone(1, 5.0, 2.0), _lone(2, 0.0, guidance2)
    i1, i2 = c1.items[0], c2.items[0]
    uncond = [2 * T, 3 * T] if guidance2 else [2 * T, None]
    canvas = PackedCanvas(torch.zeros((C, 1)), torch.zeros(1), torch.zeros(1), [1], torch.zeros(1), [i1, i2],
                          [0, T], uncond)
    gen = torch.Generator().manual_seed(9)
    for step in range(STEPS):
        u1.step = u2.step = step
        rows = 4 * T if guidance2 else 3 * T
        logits = (torch.randn((rows, C, V), generator=gen) * 3).to(torch.bfloat16)
        flags = sampler.step(logits if fused else logits.float(), canvas, [u1, u2])
        assert flags.tolist() == [True, True]
    return i1.tokens.clone(), i2.tokens.clone()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_check_passes_in_both_half_precisions(dtype):
    """The check the sampler runs before it trusts the kernel."""
    result = cs.check("cpu", dtype=dtype, rows=16)
    assert cs.passes(result), (dtype, result)


@pytest.mark.parametrize(("vocab", "mask"), [(1030, 1029), (1024, 1023), (1025, 7)])
def test_rows_split_in_a_head_block_and_a_tail(vocab, mask):
    """A row split in a head block and a tail (V not a power of two), a longer tail, no tail,
    and MASK in the head."""
    result = cs.check("cpu", vocab=vocab, mask_id=mask, rows=8)
    assert cs.passes(result), (vocab, mask, result)


def test_one_block_of_the_next_power_of_two_agrees():
    assert cs.blocks(1025) == (1024, 1) and cs.blocks(1030) == (1024, 8) and cs.blocks(1024) == (1024, 0)
    assert cs.blocks(1025, split=False) == (2048, 0)
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(8, 8, 1025, generator=gen) * 3).to(torch.bfloat16)
    scale = torch.tensor([2.0, 1.0, 0.5, 3.0])
    split, whole = cs.cfg_scores(logits, 4, scale, 1024), cs.cfg_scores(logits, 4, scale, 1024, split=False)
    assert float((split[0] - whole[0]).abs().max()) < 1e-5 and torch.equal(split[1], whole[1])


def test_the_first_maximum_when_the_tail_ties_the_head():
    tie = torch.zeros(2, 1, 1025, dtype=torch.bfloat16)
    tie[:, 0, 10] = tie[:, 0, 1024] = 5.0
    _conf, pred = cs.cfg_scores(tie, 1, torch.tensor([2.0]), 0)
    assert pred.tolist() == [[10]] and torch.equal(pred, cs.reference(tie, 1, torch.tensor([2.0]), 0)[1])
    tie[:, 0, 1024] = 6.0  # strictly greater in the tail
    assert cs.cfg_scores(tie, 1, torch.tensor([2.0]), 0)[1].tolist() == [[1024]]


def test_non_finite_logits_make_the_torch_paths_non_finite_confidences():
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(8, 8, 1025, generator=gen) * 3).to(torch.bfloat16)
    logits[0, 1, 5] = float("nan")
    logits[1, 2, 7] = float("inf")
    logits[2, 3, :] = -float("inf")
    logits[3, 0, 9] = -float("inf")  # one impossible token: still finite
    logits[5, 4, 3] = float("nan")  # the unconditional row of conditional row 1
    scale = torch.tensor([2.0, 2.0, 0.5, 3.0])
    conf, pred = cs.cfg_scores(logits, 4, scale, 1024)
    want_conf, want_pred = cs.reference(logits, 4, scale, 1024)
    assert torch.equal(torch.isfinite(conf), torch.isfinite(want_conf))
    assert int((~torch.isfinite(conf)).sum()) == 4
    ok = torch.isfinite(want_conf)
    assert float((conf - want_conf)[ok].abs().max()) < 1e-5 and torch.equal(pred[ok], want_pred[ok])
    assert int(pred.max()) < 1024  # never the MASK id


@pytest.mark.parametrize("guidance2", [3.0, 0.0])
def test_the_sampler_reveals_the_same_tokens_with_the_kernel(guidance2, monkeypatch):
    """The kernel on half logits reveals what the torch path reveals on float32 ones. All CFG:
    the kernel; one item without: the torch path on upcast logits. (The sampler's start-up
    check on fewer rows: the interpreter is slow, and the check's own tests are above.)"""
    monkeypatch.setattr(cs, "check", functools.partial(cs.check, rows=16))
    fused, plain = _sample(True, guidance2), _sample(False, guidance2)
    assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1]), guidance2
    assert not bool((fused[0] == MASK).any())
