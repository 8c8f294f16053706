"""TunedLinear: which algorithm a row count gets, and that a tuned GEMM computes F.linear's
bits (the second part on CUDA only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from server.engine import tuned_linear
from server.engine.tuned_linear import TunedLinear

N, K = 4, 3


class FakeGemm:
    """Stands in for LtGemm: records what ran, supports every algorithm but "refused"."""

    def __init__(self, log, m, n, k, dtype):
        self.log, self.m = log, m
        self.closed = False

    def supports(self, algo):
        return algo != "refused"

    def fits(self, x, w):
        return x.is_contiguous()

    def run(self, x, w, algo):
        self.log.append((self.m, algo))
        return F.linear(x, w)

    def close(self):
        self.closed = True


def make(plans_rows):
    tuned = TunedLinear(lt=None, plans={(N, K, torch.float32): plans_rows})
    ran, made = [], []

    def factory(m, n, k, dtype):
        made.append(FakeGemm(ran, m, n, k, dtype))
        return made[-1]

    tuned._make_gemm = factory
    return tuned, ran, made


def call(tuned, m):
    x, w = torch.randn(m, K), torch.randn(N, K)
    assert torch.equal(tuned(x, w), F.linear(x, w))


def test_row_counts_map_to_the_nearest_tuned_count_at_or_above():
    tuned, ran, made = make([(768, "a"), (1024, None), (12288, "b")])
    call(tuned, 100)  # below the smallest tuned count: F.linear, nothing made
    assert ran == [] and made == []
    call(tuned, 768)
    call(tuned, 900)  # 1024 kept F.linear
    call(tuned, 2000)
    call(tuned, 40000)  # above the largest: the largest's algorithm
    assert ran == [(768, "a"), (2000, "b"), (40000, "b")]
    call(tuned, 768)
    assert len(made) == 3  # shapes are planned once
    assert tuned.summary["replaced"] == {f"{N}x{K}": [768, 12288]}


def test_unknown_shapes_refused_algorithms_and_odd_operands_fall_back():
    tuned, ran, made = make([(768, "refused"), (2048, "a")])
    call(tuned, 768)
    assert ran == [] and made[0].closed
    x, w = torch.randn(K, 2048).t(), torch.randn(N, K)  # not contiguous: F.linear
    assert torch.equal(tuned(x, w), F.linear(x, w))
    x, w = torch.randn(2048, 5), torch.randn(6, 5)  # a shape never tuned
    assert torch.equal(tuned(x, w), F.linear(x, w))
    assert ran == []


def test_the_cache_of_other_row_counts_is_bounded_and_closes_what_it_drops(monkeypatch):
    monkeypatch.setattr(tuned_linear, "MAX_CACHED_SHAPES", 2)
    tuned, _, made = make([(768, "a"), (4096, "b")])
    call(tuned, 768)  # exact: kept for good
    for m in (1000, 1001, 1002):
        call(tuned, m)
    assert [g.closed for g in made] == [False, True, False, False]
    assert len(tuned._other) == 2 and len(tuned._exact) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tuned_gemms_give_f_linear_bits_eager_and_in_a_graph():
    from server.engine.cublaslt import CublasLt, LtGemm

    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = {(n, k): [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5 for _ in range(4)]
               for n, k in ((4096, 1024), (1024, 3072))}
    tuned = TunedLinear.tuned(dev, weights, rows=(768, 3072, 12288))
    lt = CublasLt(dev)
    for (n, k), ws in weights.items():
        for m in (768, 3072, 5000, 12288):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            assert torch.equal(tuned(x, ws[0]), F.linear(x, ws[0]))
        gemm = LtGemm(lt, 1024, n, k, torch.bfloat16)
        x = torch.randn(1024, k, device=dev, dtype=torch.bfloat16)
        for algo in gemm.candidates():  # every candidate computes the same product
            assert gemm.supports(algo)
            torch.testing.assert_close(gemm.run(x, ws[0], algo), F.linear(x, ws[0]), rtol=2e-2, atol=2e-2)
        gemm.close()
    x = torch.randn(3072, 1024, device=dev, dtype=torch.bfloat16)
    w = weights[(4096, 1024)][1]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tuned(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tuned(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, F.linear(x, w))
