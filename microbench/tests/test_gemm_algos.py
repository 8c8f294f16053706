"""`python -m microbench.gemm_algos` and its cuBLASLt binding: refused without CUDA; on a GPU, every
candidate computes the product F.linear does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from microbench import gemm_algos

pytestmark = pytest.mark.bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_sweep_refuses_a_machine_without_cuda(tmp_path, capsys):
    assert gemm_algos.main(["--out", str(tmp_path / "out.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_candidate_computes_f_linear_and_a_sweep_reports_them():
    from microbench.cublaslt import CublasLt, LtGemm

    dev = torch.device("cuda")
    lt = CublasLt(dev)
    w = torch.randn(1024, 3072, device=dev, dtype=torch.bfloat16) * 3072**-0.5
    x = torch.randn(768, 3072, device=dev, dtype=torch.bfloat16)
    gemm = LtGemm(lt, 768, 1024, 3072, torch.bfloat16)
    algos = gemm.candidates()
    assert algos
    for algo in algos:
        torch.testing.assert_close(gemm.run(x, w, algo), F.linear(x, w), rtol=2e-2, atol=2e-2)
    gemm.close()
    report = gemm_algos.sweep((768,))
    assert {r["gemm"] for r in report["gemms"]} == set(gemm_algos.PROJECTIONS)
    assert all(r["candidates"] >= 1 and r["cublas_us"] > 0 for r in report["gemms"])
