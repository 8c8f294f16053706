"""Whether Triton runs in its CPU interpreter (`TRITON_INTERPRET`, as Triton reads it): the
engine's kernels then take the interpreter's branches (no libdevice) and run on CPU tensors,
which is how their CPU tests exercise them."""

from __future__ import annotations

import os

INTERPRET = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")
