"""The one-pass CFG scoring kernel's compile-time signature, and its check on a GPU (the
kernel against the sampler's torch path through Triton's interpreter: tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from server.engine.kernels import cfg_scores as cs


@pytest.mark.gpu
def test_kernel_on_the_gpu_passes_its_check():
    for dtype in (torch.bfloat16, torch.float16):
        result = cs.check("cuda", dtype=dtype, rows=512)
        assert cs.passes(result), (dtype, result)


def test_the_conditional_row_count_compiles_no_new_variant():
    """`uncond_offset` follows the step's rows: no variant compiled per divisibility of it."""
    params = {p.name: p for p in cs._cfg_scores_kernel.params}
    assert params["uncond_offset"].do_not_specialize
