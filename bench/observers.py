"""How the bench watches an engine: through the engine's observer port, never its privates.

An engine is given its observer when it is made, so a bench engine is made with a
`Switchboard` (`bench_engine`), and each instrument (`bench/timeline.py`'s `Timeline`,
`bench/engine_bench.py`'s `StageTimer`) is attached to it for its scenario and detached after;
with none attached, every call returns at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from server.config import EngineSettings
from server.engine.model.canvas import PackedCanvas
from server.engine.model.step_observer import StepPhase
from server.engine.reference import ReferenceModel
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.observer import EngineObserver, Outcome, QuietObserver
from server.engine.scheduling.output import LaunchedStep, ScheduledBatch, StepRecord
from server.engine.work import RequestState, Utterance


class Switchboard(QuietObserver):
    """Passes each of the engine's calls to the instruments attached now, in attach order."""

    def __init__(self) -> None:
        self.attached: tuple[EngineObserver, ...] = ()  # replaced whole: the engine's threads read it

    def attach(self, observer: EngineObserver) -> None:
        self.attached = (*self.attached, observer)

    def detach(self, observer: EngineObserver) -> None:
        self.attached = tuple(o for o in self.attached if o is not observer)

    @contextmanager
    def watching(self, observer: EngineObserver) -> Iterator[EngineObserver]:
        self.attach(observer)
        try:
            yield observer
        finally:
            self.detach(observer)

    def phase_begin(self, phase: StepPhase) -> None:
        for o in self.attached:
            o.phase_begin(phase)

    def phase_end(self, phase: StepPhase, canvas: PackedCanvas) -> None:
        for o in self.attached:
            o.phase_end(phase, canvas)

    def admit_begin(self, state: RequestState) -> None:
        for o in self.attached:
            o.admit_begin(state)

    def admit_end(self, state: RequestState) -> None:
        for o in self.attached:
            o.admit_end(state)

    def step_begin(self, index: int, batch: ScheduledBatch[Utterance]) -> None:
        for o in self.attached:
            o.step_begin(index, batch)

    def step_end(self, step: LaunchedStep) -> None:
        for o in self.attached:
            o.step_end(step)

    def step_settled(self, record: StepRecord) -> None:
        for o in self.attached:
            o.step_settled(record)

    def chunk_complete(self, utt: Utterance) -> None:
        for o in self.attached:
            o.chunk_complete(utt)

    def finished(self, state: RequestState, outcome: Outcome) -> None:
        for o in self.attached:
            o.finished(state, outcome)

    def decode_begin(self, state: RequestState, chunk: int) -> None:
        for o in self.attached:
            o.decode_begin(state, chunk)

    def decode_end(self, state: RequestState, chunk: int) -> None:
        for o in self.attached:
            o.decode_end(state, chunk)

    def post_begin(self, state: RequestState, chunk: int | None) -> None:
        for o in self.attached:
            o.post_begin(state, chunk)

    def post_end(self, state: RequestState, chunk: int | None) -> None:
        for o in self.attached:
            o.post_end(state, chunk)


def switchboard_of(engine: EngineLoop) -> Switchboard:
    """The switchboard `engine` was made with (`bench_engine`), or a clear error."""
    if not isinstance(engine.observer, Switchboard):
        raise TypeError(f"{engine.name} was made without a bench Switchboard as its observer "
                        "(make it with bench.observers.bench_engine)")
    return engine.observer


def bench_engine(model: ReferenceModel, settings: EngineSettings, name: str = "bench", **kwargs) -> EngineLoop:
    """An `EngineLoop` on `model` that the bench's instruments can watch (its observer a
    `Switchboard`); `kwargs` go to `EngineLoop` (`backbone`, `model_name`, `random_checkpoint`)."""
    return EngineLoop(model, settings, name, observer=Switchboard(), **kwargs)
