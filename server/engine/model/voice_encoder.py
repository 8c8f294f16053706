"""Encoding reference voices off the step's critical path.

`create_voice_clone_prompt` runs on worker threads of its own (on a GPU each with its own CUDA
stream), `workers` clips at a time, the rest queued in arrival order.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from server.engine.model.codec import Codec
from server.engine.model.worker_streams import WorkerStreams
from server.engine.types import VoicePrompt

ENCODE_WORKERS = 2


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
