"""Encoding reference voices off the step's critical path.

A voice upload runs the reference's `create_voice_clone_prompt` (resampling, silence trim,
an ASR pass when no transcript is given, the codec's encoder): up to seconds of work per
clip. On the engine thread it would stall every request's steps; here it runs on its own
worker threads (on a GPU each with its own CUDA stream), at most `workers` clips at once,
the rest queued in arrival order. On a CPU each worker runs one intra-op thread (torch's
thread count is per calling thread), so encodes add at most `workers` busy threads beside
the step loop's own pool instead of a full pool each.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from server.engine.codec import Codec
from server.engine.types import VoicePrompt
from server.engine.worker_streams import WorkerStreams

ENCODE_WORKERS = 2
CPU_THREADS_PER_WORKER = 1


class VoiceEncoder:
    def __init__(self, codec: Codec, device: torch.device, workers: int = ENCODE_WORKERS):
        self.codec = codec
        self.device = device
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chorus-encode")
        self._streams = WorkerStreams(device)

    def submit(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future:
        """Queue one clip; the future gets its `VoicePrompt` (CPU tokens) or the error."""
        return self._pool.submit(self._encode, audio, sample_rate, text)

    def _encode(self, audio: np.ndarray, sample_rate: int, text: str | None) -> VoicePrompt:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(CPU_THREADS_PER_WORKER)  # this worker's own pool, not the step loop's
        stream = self._streams.current()
        if stream is None:
            return self.codec.encode_voice(audio, sample_rate, text)
        with torch.cuda.stream(stream):
            prompt = self.codec.encode_voice(audio, sample_rate, text)  # its tokens come back on the host
            stream.synchronize()
        return prompt

    def shutdown(self) -> None:
        """Take no more clips; those already queued still finish (their callers wait on them)."""
        self._pool.shutdown(wait=False)
