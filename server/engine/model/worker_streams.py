"""A CUDA stream per worker thread, so work off the step thread never queues behind a step."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import torch

from server import envs

# CUDA maps any priority below its range to the highest one it has.
HIGHEST_PRIORITY = -100


def decode_priority() -> int:
    """Priority of the finisher's decode streams: the highest, so a finished chunk's decode
    (a request's first audio waits for it) is given SMs before a step's queued blocks
    (`CHORUS_DECODE_PRIORITY=0`: an ordinary stream)."""
    return HIGHEST_PRIORITY if envs.CHORUS_DECODE_PRIORITY else 0


class WorkerStreams:
    """Each thread that asks gets its own stream on `device` (and makes it its current GPU);
    None off CUDA. `priority` as `torch.cuda.Stream` takes it (lower is sooner; 0 ordinary)."""

    def __init__(self, device: torch.device, priority: int = 0):
        self.device = device
        self.priority = priority
        self._local = threading.local()

    def current(self) -> torch.cuda.Stream | None:
        if self.device.type != "cuda":
            return None
        if getattr(self._local, "stream", None) is None:
            torch.cuda.set_device(self.device)  # this worker thread's current GPU
            self._local.stream = torch.cuda.Stream(self.device, priority=self.priority)
        return self._local.stream


def on(stream: torch.cuda.Stream | None) -> AbstractContextManager:
    """`stream` made current for the block (nothing to do for None, off CUDA)."""
    return torch.cuda.stream(stream) if stream is not None else nullcontext()
