"""The q/k norm + RoPE kernel's program shape by size (the kernel against its float32
definition through Triton's interpreter: tests/kernels/)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from server.engine.kernels import qk_norm_rope as m


def test_program_shapes_by_size():
    S = m.ProgramShape
    assert m.program_shape(5000, 24) == S("tokens", 1, 2) and m.program_shape(600, 24) == S("heads", 8, 1)
    assert m.program_shape(600, 6) == S("heads", 8, 4)


