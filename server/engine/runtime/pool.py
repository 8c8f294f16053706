"""Several engines behind one engine API: one `EngineLoop` per device.

A request goes, whole, to the engine with the least outstanding work, reserved at submission
under the pool's lock and released when it ends; its cancels follow it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import torch

from server.config import EngineSettings
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.process import EngineProcess
from server.engine.scheduling.audio_budget import AudioBudget
from server.engine.types import (
    Accepted,
    EngineEvent,
    EngineStats,
    EventSink,
    Finished,
    RequestRejected,
    SynthesisRequest,
)

log = logging.getLogger("chorus.engine")


def expand_devices(device: str) -> list[str]:
    """`cpu` -> [cpu]; `cuda` -> every visible GPU; `cuda:0,2` -> those; `cuda:1` -> [cuda:1]."""
    if device == "cpu":
        return ["cpu"]
    if device == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("--device cuda: no CUDA device is visible")
        return [f"cuda:{i}" for i in range(count)]
    if device.startswith("cuda:") and "," in device:
        return [f"cuda:{index.strip()}" for index in device[5:].split(",")]
    return [device]


class EnginePool:
    """The engine API the web layer uses, over one engine per device: it routes each request to
    one engine and answers for all of them (`sample_rate`, `frame_rate`, `model_name`: every
    engine serves the same model); `engines` lists them, for metrics and stats."""

    def __init__(self, engines: list[EngineLoop | EngineProcess], max_audio_seconds_inflight: float | None = None):
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = engines
        self.audio_budget = AudioBudget(max_audio_seconds_inflight)
        self._lock = threading.Lock()
        self._owner: dict[str, int] = {}
        self._work: list[int] = [0] * len(engines)
        self._cost: dict[str, int] = {}

    @classmethod
    def load(cls, model_path: str, settings: EngineSettings, asr_model: str | None = None) -> EnginePool:
        """One engine per device; each in its own process (`engine_processes`, by default when
        there are several devices: one GIL per GPU), else a thread of this one."""
        devices = expand_devices(settings.device)
        own_process = settings.engine_processes if settings.engine_processes is not None else len(devices) > 1
        engines: list[EngineLoop | EngineProcess] = []
        for index, device in enumerate(devices):
            one = replace(settings, device=device)
            if own_process:
                engines.append(EngineProcess(model_path, one, f"engine{index}", asr_model))
            else:
                engines.append(EngineLoop.load(model_path, one, name=f"engine{index}"))
                if asr_model:
                    engines[-1].model.load_asr_model(asr_model)
        return cls(engines, settings.max_audio_seconds_inflight)

    # the single-engine API ------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        """Samples per second of the audio every engine sends."""
        return self.engines[0].sample_rate

    @property
    def frame_rate(self) -> int:
        """Codec frames per second of audio: a voice's or a chunk's tokens to seconds."""
        return self.engines[0].frame_rate

    @property
    def model_name(self) -> str:
        return self.engines[0].model_name

    @property
    def is_random_checkpoint(self) -> bool:
        return self.engines[0].is_random_checkpoint

    @property
    def ready(self) -> bool:
        return all(e.ready for e in self.engines)

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def stop(self, timeout: float = 10.0) -> None:
        for engine in self.engines:
            engine.stop(timeout)

    def submit(self, request: SynthesisRequest, sink: EventSink) -> Accepted:
        with self._lock:
            index = min(range(len(self.engines)), key=lambda i: self._work[i])
        engine = self.engines[index]
        rid = request.request_id

        def release(event: EngineEvent) -> None:
            if isinstance(event, Finished):
                self.audio_budget.release(rid)
                with self._lock:
                    if self._owner.pop(rid, None) is not None:
                        self._work[index] -= self._cost.pop(rid, 0)
            sink(event)

        with self._lock:
            if rid in self._owner:
                raise RequestRejected(f"id: {rid!r} is already in flight", field="id", code="duplicate_id")
            # reserve before submitting: the engine may finish the request at once
            self._owner[rid] = index
        try:
            accepted = engine.submit(request, release, admit=lambda seconds: self.audio_budget.reserve(rid, seconds))
        except Exception:
            self.audio_budget.release(rid)
            with self._lock:
                self._owner.pop(rid, None)
            raise
        cost = sum(int(s * engine.frame_rate) for s in accepted.target_seconds) * 2 * request.options.num_step
        with self._lock:
            if rid in self._owner:
                self._cost[rid] = cost
                self._work[index] += cost
        return accepted

    def cancel(self, request_id: str) -> None:
        with self._lock:
            index = self._owner.get(request_id)
        if index is not None:
            self.engines[index].cancel(request_id)

    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future:
        with self._lock:
            index = min(range(len(self.engines)), key=lambda i: self._work[i])
        return self.engines[index].encode_voice(audio, sample_rate, text)

    def stats(self) -> list[EngineStats]:
        return [engine.stats() for engine in self.engines]

    @property
    def step_log(self):
        return self.engines[0].step_log
