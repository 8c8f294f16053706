"""What the step runner reports of each forward it queues, to whoever watches the engine.

A step is one forward per group of items (several only after an out-of-memory error), each in
three phases: the canvas is packed on the host, the backbone's forward is queued, the sampler's
unmasking is queued. The runner calls `phase_begin` and `phase_end` around each phase on the
engine thread, nothing more (no sync, no clock of its own). The engine's whole port
(`runtime/observer.py`) extends this one.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from server.engine.model.canvas import PackedCanvas


class StepPhase(Enum):
    CANVAS = "canvas"  # the group's canvases packed into one row (host work and small copies)
    FORWARD = "forward"  # the backbone's forward, queued on the device
    SAMPLE = "sample"  # the sampler's scoring and unmasking, queued on the device


class StepObserver(Protocol):
    def phase_begin(self, phase: StepPhase) -> None:
        """A phase of one forward starts (a phase that raises has no end)."""

    def phase_end(self, phase: StepPhase, canvas: PackedCanvas) -> None:
        """It ended; `canvas` is the packed row it built or ran on."""
