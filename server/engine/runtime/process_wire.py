"""The messages between an engine process and its parent (`process.py`), one Struct each.

They cross a `multiprocessing` pipe, which pickles them: their payloads are the engine's own
objects (requests whose voices carry token tensors, audio as numpy arrays, the exception a
submit raised, stats dataclasses), which msgspec's encoders cannot carry without hooks that would
copy every array into bytes and back and a schema per exception. So msgspec gives the shape
(typed, frozen, matched by class) and pickle the transport; pickle protocol 5 passes the arrays
as they are.
"""

from __future__ import annotations

import msgspec
import numpy as np

from server.engine.scheduling.output import StepRecord
from server.engine.types import Accepted, EngineEvent, EngineStats, SynthesisRequest, VoicePrompt


class _Message(msgspec.Struct, frozen=True):
    pass


# ---- parent -> child ------------------------------------------------------------------------


class SubmitCall(_Message, frozen=True):
    call: int
    request: SynthesisRequest


class EncodeCall(_Message, frozen=True):
    call: int
    audio: np.ndarray
    sample_rate: int
    text: str | None


class StatsCall(_Message, frozen=True):
    call: int


class CancelRequest(_Message, frozen=True):
    request_id: str


class Stop(_Message, frozen=True):
    pass


ToChild = SubmitCall | EncodeCall | StatsCall | CancelRequest | Stop


# ---- child -> parent ------------------------------------------------------------------------


class Ready(_Message, frozen=True):
    """The child's engine is loaded and started: what the parent reports of it."""

    sample_rate: int
    frame_rate: int
    model_name: str
    random_checkpoint: bool


class StartFailed(_Message, frozen=True):
    reason: str


class Snapshot(_Message, frozen=True):
    """A `StatsCall`'s answer: the engine's stats and its recent steps (for the metrics)."""

    stats: EngineStats
    steps: list[StepRecord]


class Reply(_Message, frozen=True):
    """A call's result: the submit's `Accepted`, the encoded `VoicePrompt`, or a `Snapshot`."""

    call: int
    value: Accepted | VoicePrompt | Snapshot


class Refused(_Message, frozen=True):
    """A call's failure, raised again in the parent (a `RequestRejected`, or a bug's)."""

    call: int
    error: BaseException


class Event(_Message, frozen=True):
    event: EngineEvent


FromChild = Ready | StartFailed | Reply | Refused | Event
