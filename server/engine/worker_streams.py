"""A CUDA stream per worker thread, so work off the step thread never queues behind a step."""

from __future__ import annotations

import threading

import torch


class WorkerStreams:
    """Each thread that asks gets its own stream on `device` (and makes it its current GPU);
    None off CUDA."""

    def __init__(self, device: torch.device):
        self.device = device
        self._local = threading.local()

    def current(self) -> torch.cuda.Stream | None:
        if self.device.type != "cuda":
            return None
        if getattr(self._local, "stream", None) is None:
            torch.cuda.set_device(self.device)  # this worker thread's current GPU
            self._local.stream = torch.cuda.Stream(self.device)
        return self._local.stream
