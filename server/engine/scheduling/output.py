"""The contract between the scheduler and the step runner: what a step is to run
(`ScheduledBatch`) and what the runner launched (`LaunchedStep`), which the scheduler (`advance`)
and the runtime (settle, finish) act on; and the record each step leaves (`StepRecord`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, NamedTuple

import torch

from server.engine.scheduling.schedulable import S
from server.engine.work import Utterance


class ScheduledBatch(NamedTuple, Generic[S]):
    """The utterances of the next step, and how many of them joined at this boundary."""

    utts: list[S]
    admitted: int


class StepTimer:
    """Wall time of a step's device work: CUDA events on a GPU, the clock elsewhere."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._end.record()
        else:
            self._elapsed = time.perf_counter() - self._t0

    def seconds(self) -> float:
        if self._cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1000.0
        return self._elapsed


@dataclass
class LaunchedPart:
    """Utterances stepped by one forward, and their (not yet read) finiteness flags."""

    utts: list[Utterance]
    finite: torch.Tensor  # (items,) bool, on the host once `ready` has passed
    step_numbers: list[int]  # each utterance's step number, 1..num_step, after this step
    ready: torch.cuda.Event | None = None


@dataclass(frozen=True)
class FailedItem:
    """An utterance whose step raised even alone: its request must end with `error`."""

    utt: Utterance
    error: BaseException


@dataclass
class LaunchedStep:
    """What one `run` queued on the device: the contract between runner, scheduler and loop."""

    parts: list[LaunchedPart]
    failed: list[FailedItem] = field(default_factory=list)
    timer: StepTimer | None = None
    items: int = 0  # utterances scheduled
    packed_tokens: int = 0  # their packed tokens
    admitted: int = 0  # of which joined at this step boundary
    index: int = 0  # the engine's step number
    interval: float | None = None  # s since the previous launch, if that step was still in flight

    @property
    def stepped(self) -> list[Utterance]:
        """Every utterance that advanced one step."""
        return [utt for part in self.parts for utt in part.utts]


@dataclass(frozen=True)
class StepRecord:
    """One executed step: the step log's entry (metrics, `stats`), from its device time."""

    index: int
    items: int
    packed_tokens: int
    seconds: float
    admitted: int = 0
    interval: float | None = None  # launch to launch of back-to-back steps: `seconds` + host gaps
