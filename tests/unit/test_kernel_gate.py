"""The start-up gate of kernels checked by their relative error against float32."""

from __future__ import annotations

import logging

import torch

from server.engine.kernels.triton_env import check_limit, checked_error


def test_an_error_within_the_dtype_limit_passes_and_is_returned():
    assert check_limit(torch.bfloat16) == 1e-2 and check_limit(torch.float16) == 2e-3
    assert check_limit(torch.float32) == 1e-4
    assert checked_error("k", lambda: 4e-3, torch.bfloat16, "torch instead") == 4e-3


def test_an_error_over_the_limit_or_a_failing_check_falls_back_loudly(caplog):
    def broken() -> float:
        raise RuntimeError("no kernel here")

    with caplog.at_level(logging.WARNING):
        assert checked_error("k", lambda: 4e-3, torch.float16, "torch instead") is None
        assert checked_error("k", lambda: float("nan"), torch.bfloat16, "torch instead") is None
        assert checked_error("k", broken, torch.bfloat16, "torch instead") is None
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "k kernel off by 4.00e-03 (limit 2e-03); torch instead"
    assert messages[1].startswith("k kernel off by nan")
    assert messages[2] == "k kernel failed its check (no kernel here); torch instead"
