"""The fused gate-up + SiLU kernel against the unfused arithmetic, on the CPU through Triton's
interpreter (in a subprocess: the interpreter is chosen when Triton is imported). The
interpreter's bfloat16 tensor-descriptor loads are not faithful, so it runs in float16 and
float32 here; the GPU tests (`test_gpu_backbone.py`) run it in bfloat16 on the device."""

from __future__ import annotations

import textwrap

import pytest

from tests.triton_interpreter import run_in_triton_interpreter

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import torch
    from server.engine import gate_up_silu as m
    from server.engine.kernels import TorchOps
    # partial row tiles (300 and 70 rows against 128-row tiles), two column tiles
    assert m.check("cpu", torch.float32, 128, 128, rows=300) < 1e-5
    assert m.check("cpu", torch.float16, 128, 128, rows=70) < 2e-3
    # the definition is the unfused path's: the GEMM's stored output, then the gate
    torch.manual_seed(0)
    x, w = torch.randn(9, 64), torch.randn(256, 64) * 0.125
    want = TorchOps.silu_and_mul(torch.nn.functional.linear(x, w))
    assert torch.allclose(m.reference(x, w), want, atol=1e-5)
    got = m.gate_up_silu(x, w)
    assert got.shape == (9, 128) and float((got - want).abs().max()) < 1e-4
    assert m.gate_up_silu(x[:0], w).shape == (0, 128)
    print("ok")
""")


def test_kernel_in_the_interpreter():
    run_in_triton_interpreter(SCRIPT)


def test_the_tile_must_divide_the_mlp():
    from server.engine import gate_up_silu as m

    assert m.supports(1024, 3072) and not m.supports(1000, 3072) and not m.supports(1024, 3000)


def test_cpu_backbones_keep_the_unfused_gate(reference_model):
    """Only CUDA steps may take the fused kernel: on the CPU the threshold is never set."""
    from server.engine.attention import TorchAttention
    from server.engine.fused_backbone import FusedBackbone
    from server.engine.kernels import TorchOps

    attention = TorchAttention(reference_model.llm.config.head_dim ** -0.5)
    assert FusedBackbone(reference_model, attention, TorchOps()).fused_gate_min_rows is None
