"""The engine's port for whoever watches it work: a request's admission, each step, each chunk's
decode and post-processing, the request's end.

An engine is given one observer when it is made (`EngineLoop(..., observer=)`), and calls it at
these points; with none, it calls nothing. The calls happen on the thread doing the work (the
engine thread, or a finisher lane's thread for a decode and its post-processing), at the moment
the work starts or ends, and add no sync: an observer takes its own clocks (and CUDA events,
which then land on the current stream) and must return quickly. `chorus bench`'s phase
timeline and stage timings are observers (`bench/timeline.py`, `bench/engine_bench.py`).
`QuietObserver` does nothing at every point: a base for observers that watch a few.
"""

from __future__ import annotations

from typing import Literal, Protocol

from server.engine.model.canvas import PackedCanvas
from server.engine.model.step_observer import StepObserver, StepPhase
from server.engine.scheduling.output import LaunchedStep, ScheduledBatch, StepRecord
from server.engine.work import RequestState, Utterance

Outcome = Literal["done", "cancelled", "error"]


class EngineObserver(StepObserver, Protocol):
    # ---- the engine thread --------------------------------------------------------------

    def admit_begin(self, state: RequestState) -> None:
        """A submitted request reaches the engine thread; its first canvases are built next."""

    def admit_end(self, state: RequestState) -> None:
        """Its canvases are queued for the scheduler (or it failed: `finished` said so)."""

    def step_begin(self, index: int, batch: ScheduledBatch[Utterance]) -> None:
        """Step `index` (the engine's count) is about to be launched with `batch`."""

    def step_end(self, step: LaunchedStep) -> None:
        """It is launched: its device work queued, not done (its record comes when it settles)."""

    def step_settled(self, record: StepRecord) -> None:
        """A step's results were read, one step after its launch: its record, with its time."""

    def chunk_complete(self, utt: Utterance) -> None:
        """A chunk's last step was read; its decode is handed on next."""

    def finished(self, state: RequestState, outcome: Outcome) -> None:
        """The request ended (its `Finished` event is out)."""

    # ---- the thread doing the work: a lane's, or the engine thread launching a decode ---

    def decode_begin(self, state: RequestState, chunk: int) -> None:
        """The chunk's decode is launched (again, if a first launch found no graph for it)."""

    def decode_end(self, state: RequestState, chunk: int) -> None:
        """Its audio is on the host."""

    def post_begin(self, state: RequestState, chunk: int | None) -> None:
        """Post-processing starts: of one chunk, or (`chunk` None) of a whole request's joined chunks."""

    def post_end(self, state: RequestState, chunk: int | None) -> None:
        """It ended; the audio goes to the engine thread next."""


class QuietObserver:
    """An `EngineObserver` that does nothing at every point: subclass it, override what you watch."""

    def phase_begin(self, phase: StepPhase) -> None:
        return None

    def phase_end(self, phase: StepPhase, canvas: PackedCanvas) -> None:
        return None

    def admit_begin(self, state: RequestState) -> None:
        return None

    def admit_end(self, state: RequestState) -> None:
        return None

    def step_begin(self, index: int, batch: ScheduledBatch[Utterance]) -> None:
        return None

    def step_end(self, step: LaunchedStep) -> None:
        return None

    def step_settled(self, record: StepRecord) -> None:
        return None

    def chunk_complete(self, utt: Utterance) -> None:
        return None

    def finished(self, state: RequestState, outcome: Outcome) -> None:
        return None

    def decode_begin(self, state: RequestState, chunk: int) -> None:
        return None

    def decode_end(self, state: RequestState, chunk: int) -> None:
        return None

    def post_begin(self, state: RequestState, chunk: int | None) -> None:
        return None

    def post_end(self, state: RequestState, chunk: int | None) -> None:
        return None
