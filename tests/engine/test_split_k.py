"""Split-K projections against their definition, the GEMM on CPU tensors (the Triton norm that
sums their slices, through Triton's interpreter: tests/kernels/)."""

from __future__ import annotations

import pytest
import torch

from server.engine.kernels import split_k
from server.engine.kernels.split_k import split_linear


@pytest.mark.parametrize("splits", [1, 2, 3, 4])
def test_split_linear_slices_the_inner_dimension(splits):
    torch.manual_seed(0)
    x, w = torch.randn(7, 96), torch.randn(40, 96)
    parts = split_linear(x, w, splits)
    assert parts.shape == (splits, 7, 40) and parts.dtype == torch.float32
    ks = 96 // splits
    for s in range(splits):  # slice s is x's columns [s*ks, (s+1)*ks) against the same weight columns
        assert torch.allclose(parts[s], x[:, s * ks:(s + 1) * ks] @ w[:, s * ks:(s + 1) * ks].T, atol=1e-5)
    assert torch.allclose(parts.sum(0), x @ w.T, atol=1e-4)


def test_split_linear_refuses_an_uneven_split():
    with pytest.raises(ValueError, match="cannot split"):
        split_linear(torch.randn(3, 10), torch.randn(4, 10), 3)

def test_splits_by_rows():
    splits_for = split_k.splits_for
    assert [splits_for(r) for r in (1, 135, 192, 193, 544, 1024, 1025, 34000)] == [4, 4, 4, 2, 2, 2, 1, 1]
    # a model whose inner dimensions a count does not divide gets the largest halving that does
    assert splits_for(135, (2048, 3072)) == 4 and splits_for(135, (2048, 3070)) == 2
    assert splits_for(544, (2047, 3072)) == 1 and splits_for(135, (6, 10)) == 2
