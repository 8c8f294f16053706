"""The one-pass CFG scoring kernel against the sampler's torch path, on the CPU through
Triton's interpreter (in a subprocess: the interpreter is chosen when Triton is imported)."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from server.engine.kernels import cfg_scores as cs
    from server.engine.model.canvas import PackedCanvas
    from server.engine.model.sampler import Sampler

    # the check the sampler runs before it trusts the kernel, in both half precisions
    for dtype in (torch.bfloat16, torch.float16):
        result = cs.check("cpu", dtype=dtype, rows=16)
        assert cs.passes(result), (dtype, result)

    # a row split in a head block and a tail (V not a power of two), a longer tail, no tail,
    # and MASK in the head; one block of V's next power of two (`split=False`) agrees
    for vocab, mask in ((1030, 1029), (1024, 1023), (1025, 7)):
        result = cs.check("cpu", vocab=vocab, mask_id=mask, rows=8)
        assert cs.passes(result), (vocab, mask, result)
    assert cs.blocks(1025) == (1024, 1) and cs.blocks(1030) == (1024, 8) and cs.blocks(1024) == (1024, 0)
    assert cs.blocks(1025, split=False) == (2048, 0)
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(8, 8, 1025, generator=gen) * 3).to(torch.bfloat16)
    scale = torch.tensor([2.0, 1.0, 0.5, 3.0])
    split, whole = cs.cfg_scores(logits, 4, scale, 1024), cs.cfg_scores(logits, 4, scale, 1024, split=False)
    assert float((split[0] - whole[0]).abs().max()) < 1e-5 and torch.equal(split[1], whole[1])

    # the first maximum when the tail's column ties the head's best
    tie = torch.zeros(2, 1, 1025, dtype=torch.bfloat16)
    tie[:, 0, 10] = tie[:, 0, 1024] = 5.0
    conf, pred = cs.cfg_scores(tie, 1, torch.tensor([2.0]), 0)
    assert pred.tolist() == [[10]] and torch.equal(pred, cs.reference(tie, 1, torch.tensor([2.0]), 0)[1])
    tie[:, 0, 1024] = 6.0  # strictly greater in the tail
    assert cs.cfg_scores(tie, 1, torch.tensor([2.0]), 0)[1].tolist() == [[1024]]

    # non-finite logits make exactly the confidences the torch path makes non-finite
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

    # the sampler reveals the same tokens with the kernel on half logits as with the torch
    # path on float32 ones, in a batch whose items differ in guidance and position noise
    from tests.test_sampler import C, MASK, STEPS, T, V, _lone

    def item(seed, guidance, position_temperature):
        canvas, utt = _lone(seed, position_temperature, guidance)
        return canvas.items[0], utt

    def run(fused, guidance2):
        sampler = Sampler(MASK, C, torch.device("cpu"), fused_scores=fused)
        assert sampler.fused_scores is fused
        (i1, u1), (i2, u2) = item(1, 2.0, 5.0), item(2, guidance2, 0.0)
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

    for guidance2 in (3.0, 0.0):  # all CFG: the kernel; one item without: the torch path on upcast logits
        fused, plain = run(True, guidance2), run(False, guidance2)
        assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1]), guidance2
        assert not bool((fused[0] == MASK).any())
    print("ok")
""")


def test_kernel_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_kernel_on_the_gpu_passes_its_check():
    from server.engine.kernels import cfg_scores
    for dtype in ("bfloat16", "float16"):
        result = cfg_scores.check("cuda", dtype=getattr(__import__("torch"), dtype), rows=512)
        assert cfg_scores.passes(result), (dtype, result)


def test_the_conditional_row_count_compiles_no_new_variant():
    """`uncond_offset` follows the step's rows: no variant compiled per divisibility of it."""
    from server.engine.kernels import cfg_scores as cs
    params = {p.name: p for p in cs._cfg_scores_kernel.params}
    assert params["uncond_offset"].do_not_specialize
