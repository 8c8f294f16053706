"""A scripted stand-in for `EngineLoop`, for tests of the service layer's own logic
(ordering, failure paths) that a real engine rarely or never shows on demand."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import torch

from server.engine.types import Accepted, ChunkAudio, Finished, Progress, RequestRejected, VoicePrompt


class FakeEngine:
    """Each sentence of the text is a chunk. Chunk audio is emitted in REVERSE order, as
    concurrent chunks may finish. Text starting with `fail` ends in an engine error after
    one chunk's audio; `reject` is refused at submission."""

    sample_rate = 24000
    frame_rate = 25
    model_name = "fake"
    ready = True

    def __init__(self) -> None:
        self.step_log: list = []
        self.cancelled: list[str] = []
        self.engines = [self]

    def submit(self, request, sink) -> Accepted:
        if request.text.startswith("reject"):
            raise RequestRejected("instruct: not a known voice attribute", field="instruct")
        chunks = [c for c in request.text.split(".") if c.strip()] or [request.text]
        n = len(chunks)
        steps = request.options.num_step

        def run() -> None:
            for i in range(n):
                for s in range(1, steps + 1):
                    sink(Progress(request.request_id, i, s, steps, (i * steps + s) / (n * steps)))
            for i in reversed(range(n)):
                audio = np.full(100 * (i + 1), 0.01 * (i + 1), np.float32)
                sink(ChunkAudio(request.request_id, i, audio, self.sample_rate, final=i == n - 1))
                if request.text.startswith("fail"):
                    sink(Finished(request.request_id, "error", "the engine failed on this request: boom"))
                    return
            sink(Finished(request.request_id, "done", None, sum(100 * (i + 1) for i in range(n)) / 24000,
                          1.0, 2.0, 3.0))

        threading.Thread(target=run, daemon=True).start()
        return Accepted(request.request_id, n, [1.0] * n)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def encode_voice(self, audio, sample_rate, text) -> Future:
        future: Future = Future()
        future.set_result(VoicePrompt(torch.zeros((8, 10), dtype=torch.long), text or "", 0.05))
        return future

    def stats(self):
        return SimpleNamespace(name="fake", waiting_items=0, running_items=0, steps_total=0, outstanding_work=0)
