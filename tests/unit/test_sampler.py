"""The sampler's two selection paths agree: a lone item selects straight on its canvas, a
batch through the padded table; the same scores must reveal the same tokens either way,
poisoned scores included. (Both against the reference: tests/engine/test_engine_parity.py.)"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from server.engine.model.canvas import PackedCanvas
from server.engine.model.sampler import Sampler
from server.engine.planning.utterances import unmask_schedule
from server.engine.work import CanvasItem

C, V, MASK, T, STEPS = 4, 33, 32, 7, 5


def _lone(seed: int, position_temperature: float, guidance: float, device: str = "cpu"):
    tokens = torch.full((C, T), MASK, dtype=torch.long, device=device)
    item = CanvasItem("x#0", torch.zeros((C, 2), dtype=torch.long), torch.zeros(2, dtype=torch.bool), tokens,
                      guidance)
    opts = types.SimpleNamespace(layer_penalty_factor=5.0, position_temperature=position_temperature,
                                 class_temperature=0.0)
    utt = types.SimpleNamespace(options=opts, schedule=unmask_schedule(T, C, STEPS, 0.1), step=0,
                                generator=torch.Generator(device=device).manual_seed(seed), item=item)
    canvas = PackedCanvas(torch.zeros((C, 1)), torch.zeros(1), torch.zeros(1), [1], torch.zeros(1), [item], [0],
                          [T if guidance else None])
    return canvas, utt


def _table_path(sampler: Sampler) -> Sampler:
    """Route a lone item through the padded table, as a batch of one would go."""
    def select_one(item, key, predicted, k, finite_rows):
        return sampler._select([item], key, predicted, item.tokens.t(), [k], finite_rows, sampler._last)

    sampler._select_one = select_one
    return sampler


@pytest.mark.parametrize("poison", [None, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("position_temperature,guidance", [(5.0, 2.0), (0.0, 0.0)])
def test_lone_item_selection_equals_the_table_path(poison, position_temperature, guidance):
    gen = torch.Generator().manual_seed(3)
    direct, table = Sampler(MASK, C, torch.device("cpu")), _table_path(Sampler(MASK, C, torch.device("cpu")))
    a, b = _lone(7, position_temperature, guidance), _lone(7, position_temperature, guidance)
    for step in range(STEPS):
        logits = torch.randn((2 * T if guidance else T, C, V), generator=gen)
        if poison is not None:
            logits[1:3] = poison
        flags = []
        for sampler, (canvas, utt) in ((direct, a), (table, b)):
            utt.step = step
            flags.append(sampler.step(logits.clone(), canvas, [utt]).tolist())
        assert flags[0] == flags[1] == [poison is None]
        assert torch.equal(a[0].items[0].tokens, b[0].items[0].tokens)
        revealed = int((a[0].items[0].tokens != MASK).sum())
        assert revealed == sum(a[1].schedule[: step + 1])  # exactly k per step, never a revealed one twice
    assert not bool((a[0].items[0].tokens == MASK).any())
    assert int(a[0].items[0].tokens.max()) < V


@pytest.mark.gpu
def test_a_lone_items_unsorted_top_k_on_the_gpu_reveals_what_the_sorted_table_does():
    """On CUDA a lone item's top-k skips the sort (the picks are a set): with scores full of
    ties (few distinct logits, no position noise) it must reveal what the sorted table reveals."""
    gen = torch.Generator().manual_seed(4)
    direct, table = Sampler(MASK, C, torch.device("cuda")), _table_path(Sampler(MASK, C, torch.device("cuda")))
    a, b = _lone(7, 0.0, 2.0, "cuda"), _lone(7, 0.0, 2.0, "cuda")
    for step in range(STEPS):
        logits = torch.randint(0, 3, (2 * T, C, V), generator=gen).float().cuda()
        for sampler, (canvas, utt) in ((direct, a), (table, b)):
            utt.step = step
            assert sampler.step(logits.clone(), canvas, [utt]).tolist() == [True]
        assert torch.equal(a[0].items[0].tokens, b[0].items[0].tokens)
    assert not bool((a[0].items[0].tokens == MASK).any())


def test_a_batch_reveals_each_items_own_k():
    gen = torch.Generator().manual_seed(4)
    sampler = Sampler(MASK, C, torch.device("cpu"))
    (c1, u1), (c2, u2) = _lone(1, 5.0, 2.0), _lone(2, 5.0, 2.0)
    u2.schedule = [0, *u2.schedule[:-1]]  # joined a step later: different k in the same step
    items = [c1.items[0], c2.items[0]]
    canvas = PackedCanvas(torch.zeros((C, 1)), torch.zeros(1), torch.zeros(1), [1], torch.zeros(1), items,
                          [0, T], [2 * T, 3 * T])
    for step in range(STEPS):
        u1.step = u2.step = step
        sampler.step(torch.randn((4 * T, C, V), generator=gen), canvas, [u1, u2])
        for item, utt in ((items[0], u1), (items[1], u2)):
            assert int((item.tokens != MASK).sum()) == sum(utt.schedule[: step + 1])
    np.testing.assert_array_less(items[0].tokens.numpy(), V)
