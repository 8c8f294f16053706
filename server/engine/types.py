"""The engine's public vocabulary: what goes in (requests, voices) and what comes out (events).

Plain data only (numpy for audio, torch only inside `VoicePrompt.tokens`), so the service
layer can hold these without importing or touching torch itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

StreamMode = Literal["chunk", "whole"]
# What a client is told of work refused or ended by a shutdown, by the engine and the server alike.
SHUTTING_DOWN = "the server is shutting down; try another replica or later"


@dataclass(frozen=True)
class GenerationOptions:
    """Per-request knobs: one field per row of the options table (`server/options.py`: ranges,
    units and why), in its order, with its types and defaults (the reference's
    `OmniVoiceGenerationConfig`); `tests/unit/test_generation_options.py` holds them equal."""

    num_step: int = 32
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty_factor: float = 5.0
    position_temperature: float = 5.0
    class_temperature: float = 0.0
    denoise: bool = True
    speed: float | None = None
    duration: float | None = None
    seed: int | None = None
    postprocess: bool = True
    chunk_seconds: float = 15.0
    chunk_threshold: float = 30.0
    normalize_text: bool | Literal["reference"] = False  # true: the best normaliser; "reference": the reference's
    first_chunk_seconds: float | None = None


@dataclass(frozen=True)
class VoicePrompt:
    """An encoded reference voice, as the reference's `VoiceClonePrompt`.

    `tokens` is a CPU `torch.LongTensor` or an integer numpy array of shape (8, T) (numpy lets
    the torch-free web layer pass back a finished chunk's `ChunkTokens`); the engine moves it
    to its device. `rms` None: post-process as without a reference (peak normalisation), the
    convention of the reference's chained chunks, whose reference is the first chunk's audio.
    `sets_pace` False: the clip gives the voice only, the text's length is planned as without a
    reference (a stream's first segment too short to say how fast this voice speaks).
    """

    tokens: Any
    text: str
    rms: float | None
    sets_pace: bool = True

    @property
    def num_frames(self) -> int:
        return int(self.tokens.shape[-1])


@dataclass(frozen=True)
class SynthesisRequest:
    """One utterance to synthesise. `request_id` must be unique within the engine."""

    request_id: str
    text: str
    language: str | None = None
    instruct: str | None = None
    voice: VoicePrompt | None = None
    options: GenerationOptions = field(default_factory=GenerationOptions)
    stream: StreamMode = "chunk"
    # `time.perf_counter()` when the server received the frame or body that asked for it:
    # the engine's timings (queue, first audio, total) count from there. None: from submit.
    received_at: float | None = None
    # `time.perf_counter()` when the listener will need this request's first audio (e.g. when
    # playback of a stream's earlier segments will reach this one). The deadline scheduler
    # takes it as chunk 0's deadline and as the earliest playback start of its later chunks;
    # None: needed as soon as possible (at arrival).
    due_at: float | None = None
    # whether to emit a `Progress` event per step: off, a step delivers nothing to the event
    # loop until the chunk's audio (32 cross-thread hand-offs fewer per chunk)
    progress: bool = True


@dataclass(frozen=True)
class Accepted:
    """What `Engine.submit` returns for a valid request: its chunk plan."""

    request_id: str
    chunks: int
    target_seconds: list[float]


class RequestRejected(ValueError):
    """A request the engine refuses at submission (bad instruct, too big for the budget...).

    `field` names the offending input where there is one (for the client's error message).
    """

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_request",
                 retry_after_ms: int | None = None):
        super().__init__(message)
        self.field = field
        self.code = code
        self.retry_after_ms = retry_after_ms  # `busy`: when trying again may succeed


@dataclass(frozen=True)
class EngineStats:
    """One engine's load, for metrics (the pool routes on its own reservations)."""

    name: str
    waiting_items: int
    running_items: int
    requests_inflight: int
    steps_total: int
    packed_tokens_last_step: int
    step_seconds_last: float
    decode_hold_seconds_total: float = 0.0  # wall time the decode hold kept chunks waiting
    decode_holds_refused_total: int = 0  # holds the hold budget did not start
    realtime_headroom: float = 1.0  # the share of the engine its realtime promises leave free


# ---- events, delivered to the request's sink from the engine thread --------------------


@dataclass(frozen=True)
class Progress:
    request_id: str
    chunk: int
    step: int  # steps done for this chunk, 1..num_steps
    num_steps: int
    fraction: float  # steps done over all chunks of the request


@dataclass(frozen=True)
class ChunkAudio:
    """Post-processed float32 mono audio of one text chunk (or of the whole request when
    `stream == "whole"`, then `chunk == 0` and `final` is true)."""

    request_id: str
    chunk: int
    audio: np.ndarray
    sample_rate: int
    final: bool


@dataclass(frozen=True)
class ChunkTokens:
    """The finished token canvas (8, T) of one chunk, before decoding (for parity checks
    and debugging; consumers may ignore it)."""

    request_id: str
    chunk: int
    tokens: np.ndarray
    text: str = ""  # the text this chunk speaks (a kept voice's transcript)


@dataclass(frozen=True)
class Finished:
    """The request ended. `outcome` is exactly one of done / cancelled / error."""

    request_id: str
    outcome: Literal["done", "cancelled", "error"]
    message: str | None = None
    audio_seconds: float = 0.0
    queue_ms: float = 0.0
    first_audio_ms: float | None = None
    total_ms: float = 0.0


EngineEvent = Progress | ChunkTokens | ChunkAudio | Finished
EventSink = Callable[[EngineEvent], None]
