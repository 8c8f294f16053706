"""Where the engine's Triton kernels run, and whether they may.

`INTERPRET`: whether Triton runs in its CPU interpreter (`TRITON_INTERPRET`, as Triton reads
it): the engine's kernels then take the interpreter's branches (no libdevice) and run on CPU
tensors, which is how their CPU tests exercise them. `checked_error`: the start-up gate of a
kernel that replaces torch arithmetic only when its error against float32 is within the
model dtype's rounding. `pdl_enabled`: whether the per-layer kernels launch with programmatic
dependent launch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import lru_cache

import torch

log = logging.getLogger(__name__)

INTERPRET = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


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


# ---- programmatic dependent launch ----------------------------------------------------------

try:  # Triton is optional; `gdc_wait` is its griddepcontrol.wait (Hopper and later)
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_wait
except Exception:  # noqa: BLE001
    triton = gdc_wait = None

if gdc_wait is not None:

    @triton.jit
    def _pdl_probe(x, PDL: tl.constexpr):
        if PDL:
            gdc_wait()
        tl.store(x, 1.0)


@lru_cache(maxsize=8)
def pdl_enabled(device_index: int) -> bool:
    """Whether the per-layer Triton kernels launch with programmatic dependent launch on this
    CUDA device: each waits (`griddepcontrol.wait`) for the kernel before it to finish, but is
    launched, and its programs placed, while that kernel's last programs still run, instead of
    after it. Hopper and later, not under the interpreter, unless `CHORUS_TRITON_PDL=0`; a
    Triton that cannot launch so (probed once) gets ordinary launches."""
    if INTERPRET or gdc_wait is None or os.environ.get("CHORUS_TRITON_PDL", "") == "0":
        return False
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        _pdl_probe[(1,)](torch.zeros(1, device=f"cuda:{device_index}"), PDL=True, launch_pdl=True)
        torch.cuda.synchronize(device_index)
    except Exception as exc:  # noqa: BLE001 - ordinary launches still work
        log.info("Triton kernels launch without programmatic dependent launch (%s)", exc)
        return False
    return True


def pdl_for(t: torch.Tensor) -> bool:
    """`pdl_enabled` for the device a kernel's tensor is on (False off CUDA)."""
    return t.is_cuda and pdl_enabled(t.device.index if t.device.index is not None else torch.cuda.current_device())
