"""Where the engine's Triton kernels run, and whether they may.

`INTERPRET`: Triton's CPU interpreter (the kernels' CPU tests take its branches);
`kernels_can_run`: whether the kernels can run on a device; `checked_error`: the start-up gate
of a kernel whose error against float32 must be within the model dtype's rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from server import envs

log = logging.getLogger(__name__)

INTERPRET = envs.TRITON_INTERPRET

try:  # Triton is optional: CPU installs keep the torch paths
    import triton  # noqa: F401

    HAS_TRITON = True
except Exception:  # noqa: BLE001
    HAS_TRITON = False


def kernels_can_run(device: torch.device | str | None = None) -> bool:
    """Triton is importable and its kernels can run on `device` (None: wherever Triton runs):
    CUDA, or the CPU under the interpreter."""
    return HAS_TRITON and (device is None or torch.device(device).type == "cuda" or INTERPRET)


def check_limit(dtype: torch.dtype) -> float:
    """The relative error a kernel's check may show against float32: about twice half
    precision's rounding (bf16 ~4e-3), float32's own elsewhere."""
    return {torch.bfloat16: 1e-2, torch.float16: 2e-3}.get(dtype, 1e-4)


def checked_error(what: str, check: Callable[[], float], dtype: torch.dtype, fallback: str) -> float | None:
    """Run a kernel's start-up `check` (its relative error against float32 arithmetic): the
    error when within `check_limit(dtype)`, else None, logged with what is used instead."""
    try:
        err = check()
    except Exception as exc:  # noqa: BLE001 - fall back, loudly
        log.warning("%s kernel failed its check (%s); %s", what, exc, fallback)
        return None
    limit = check_limit(dtype)
    if not err < limit:
        log.warning("%s kernel off by %.2e (limit %.0e); %s", what, err, limit, fallback)
        return None
    return err
