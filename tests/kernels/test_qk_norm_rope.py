"""The Triton q/k norm + RoPE kernel against its float32 definition, run on the CPU through
Triton's interpreter (marker `kernels`: the interpreter is chosen when Triton is imported, so
these run in a process started with `TRITON_INTERPRET=1`)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels import qk_norm_rope as m
from server.engine.kernels.layer_ops import TorchOps


def test_check_is_the_definition_to_rounding():
    # float32: the kernel is the definition up to float32 rounding
    assert m.check("cpu", torch.float32, 4, 2, 16, 1e-6, 1e6, tokens=29) < 1e-4
    assert m.check("cpu", torch.float16, 16, 8, 128, 1e-6, 1e6, tokens=9) < 2e-3


def test_a_strided_view_of_a_fused_qkv_output():
    """A strided (S, H, D) view, as the backbone passes it; the definition is the unfused
    path's: rmsnorm per head, then rotate-half RoPE."""
    torch.manual_seed(0)
    qkv = torch.randn(11, 8 * 16).view(11, 8, 16)
    w, pos = torch.randn(2, 16), torch.randint(0, 900, (11,))
    q, k = m.qk_norm_rope(qkv, w, pos, 4, 2, 1e-6, 1e6)
    rq, rk = m.reference(qkv, w, pos, 4, 2, 1e-6, 1e6)
    assert q.shape == (11, 4, 16) and k.shape == (11, 2, 16) and q.is_contiguous()
    # float32 angles up to ~900 rad: agreement to float32 rounding of the angle, relatively
    assert float((q - rq).norm() / rq.norm()) < 1e-5 and float((k - rk).norm() / rk.norm()) < 1e-5
    tq = TorchOps.rmsnorm(qkv[:, :4], w[0], 1e-6)
    tk = TorchOps.rmsnorm(qkv[:, 4:6], w[1], 1e-6)
    TorchOps.rope_inplace(tq, tk, pos, 1e6)
    assert torch.allclose(tq, rq, atol=1e-5) and torch.allclose(tk, rk, atol=1e-5)


@pytest.mark.parametrize(("nq", "nk"), [(16, 8), (12, 6), (3, 1)])
def test_every_program_shape_gives_the_same_bits(nq, nk):
    """One head's arithmetic never depends on its neighbours, nor on how many tokens or heads a
    program takes (head counts that are not powers of two included). Compiled on a GPU, a
    shape may differ in the last bit (the norm's sum order)."""
    torch.manual_seed(0)
    qkv = torch.randn(13, 32, 16).to(torch.bfloat16)
    pos = torch.randint(0, 900, (13,))
    w = torch.randn(2, 16).to(torch.bfloat16)
    S = m.ProgramShape
    base = m.qk_norm_rope(qkv, w, pos, nq, nk, 1e-6, 1e6, shape=S("heads", 32, 4))
    rq, rk = m.reference(qkv, w, pos, nq, nk, 1e-6, 1e6)
    assert float((base[0].float() - rq.float()).norm() / rq.float().norm()) < 1e-2
    assert float((base[1].float() - rk.float()).norm() / rk.float().norm()) < 1e-2
    for shape in (S("heads", 8, 1), S("heads", 4, 2), S("heads", 16, 4), S("tokens", 1, 4),
                  S("tokens", 2, 1), S("tokens", 4, 2), S("tokens", 16, 4)):
        got = m.qk_norm_rope(qkv, w, pos, nq, nk, 1e-6, 1e6, shape=shape)
        assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1]), (nq, nk, shape)
