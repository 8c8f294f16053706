"""The units of work every room of the engine shares.

A request's plan (`RequestPlan`: its text chunks and their lengths), its engine-side state
(`RequestState`), and each chunk as an `Utterance`: its frozen spec (`ChunkSpec`: who it is,
its unmask schedule, when it is due), its canvas (`CanvasItem`) and its own random generator,
stepping through the schedule. Planning makes them, the scheduler queues them (through the
`Schedulable` face: `scheduling/schedulable.py`), the model steps them and the runtime finishes
them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from server.engine.types import EventSink, Finished, GenerationOptions, SynthesisRequest


@dataclass(frozen=True)
class ChunkPlan:
    text: str
    target_len: int


@dataclass(frozen=True)
class RequestPlan:
    language: str | None
    instruct: str | None
    chunks: tuple[ChunkPlan, ...]
    # speed used to estimate chunk lengths (the reference's `task.speed` entry, or None)
    chunk_speed: float | None
    chained: bool  # no voice and several chunks: chunk 0 becomes the others' reference

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(self.chunks))  # frozen all the way down

    def frames_before(self, chunk_index: int) -> int:
        """Planned audio frames of the chunks before `chunk_index`."""
        return sum(chunk.target_len for chunk in self.chunks[:chunk_index])


@dataclass(frozen=True)
class ChunkDue:
    """What a chunk's deadline is reckoned from, fixed when it is built (`scheduling/deadlines.py`
    reckons it; the request's first audio, which moves a later chunk's, is read live)."""

    whole: bool  # a whole-file request: due its whole audio's length after arrival
    arrived_at: float  # perf_counter: the request's arrival (`RequestState.submitted_at`)
    hint: float | None  # `SynthesisRequest.due_at`: when playback will reach the request
    chunk_index: int
    frames_before: int  # planned audio of the request's chunks before this one
    frames_total: int  # planned audio of the whole request
    num_step: int  # steps per chunk: chunk 0's time before its audio, while none is out


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk as planning leaves it: whose it is, in which order it arrived, its knobs, its
    unmask schedule (tokens revealed at each step) and its deadline's terms."""

    request_id: str
    chunk_index: int
    arrival: int  # the request's place in arrival order (`RequestState.seq`)
    options: GenerationOptions
    schedule: tuple[int, ...]
    due: ChunkDue


@dataclass
class CanvasItem:
    """One utterance's contribution to a step.

    `prefix_ids` is [C, N]: style tokens, text tokens, then reference audio tokens when
    cloning. `tokens` is [C, T], the live target canvas (MASK at step 0, fully revealed
    after the last step); it is updated in place by the sampler between steps.
    """

    item_id: str
    prefix_ids: torch.Tensor
    prefix_audio_mask: torch.Tensor
    tokens: torch.Tensor
    guidance_scale: float
    # the prefix's audio mask on the host, for building index arrays without device reads
    prefix_audio_mask_host: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.prefix_audio_mask_host is None:
            self.prefix_audio_mask_host = self.prefix_audio_mask.cpu().numpy().astype(np.bool_)

    @property
    def does_cfg(self) -> bool:
        return self.guidance_scale != 0

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_ids.shape[1])

    @property
    def target_len(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def cond_len(self) -> int:
        return self.prefix_len + self.target_len

    @property
    def packed_len(self) -> int:
        """Tokens this item adds to a step: its budget cost."""
        return self.cond_len + (self.target_len if self.does_cfg else 0)


@dataclass
class RequestState:
    """Engine-side bookkeeping of one request across its chunks."""

    request: SynthesisRequest
    plan: RequestPlan
    sink: EventSink
    seq: int
    seed: int
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_audio_at: float | None = None
    steps_done: int = 0
    finished: bool = False
    raw_audio: dict[int, object] = field(default_factory=dict)
    # style + text token ids per chunk, tokenized once at submission (budget check)
    text_ids: dict[int, torch.Tensor] = field(default_factory=dict)
    audio_samples: int = 0

    def __post_init__(self) -> None:
        if self.request.received_at is not None:  # the clock starts where the server got the frame
            self.submitted_at = min(self.submitted_at, self.request.received_at)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_chunks(self) -> int:
        return len(self.plan.chunks)

    @property
    def ref_rms(self) -> float | None:
        """The reference voice's loudness, which post-processing restores (None: no reference)."""
        return self.request.voice.rms if self.request.voice else None

    @property
    def total_steps(self) -> int:
        return self.num_chunks * self.request.options.num_step

    def ended(self, outcome: str, message: str | None, sample_rate: int) -> Finished:
        """The request's one terminal event, with its timings (ms since submission)."""
        now = time.perf_counter()
        ms = lambda t: round((t - self.submitted_at) * 1000.0, 3)
        return Finished(
            request_id=self.request_id,
            outcome=outcome,  # type: ignore[arg-type]
            message=message,
            audio_seconds=round(self.audio_samples / sample_rate, 4),
            queue_ms=ms(self.started_at) if self.started_at else ms(now),
            first_audio_ms=ms(self.first_audio_at) if self.first_audio_at else None,
            total_ms=ms(now),
        )


@dataclass
class Utterance:
    """One text chunk of a request at work: its spec, its live canvas and random stream, and the
    steps it has taken. It is `Schedulable` (key, packed length, steps left, due)."""

    state: RequestState
    spec: ChunkSpec
    item: CanvasItem
    generator: torch.Generator
    step: int = 0  # steps taken: the index into `schedule` of the next one

    # ---- what the scheduler orders and packs it by ----------------------------------------

    @property
    def key(self) -> tuple[int, int]:
        """Arrival order: the request's, then the chunk's within it."""
        return self.spec.arrival, self.spec.chunk_index

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def chunk_index(self) -> int:
        return self.spec.chunk_index

    @property
    def packed_len(self) -> int:
        return self.item.packed_len

    @property
    def steps_left(self) -> int:
        return self.num_step - self.step

    @property
    def due(self) -> ChunkDue:
        return self.spec.due

    @property
    def first_audio_at(self) -> float | None:
        """When the request's first audio went out (None: not yet)."""
        return self.state.first_audio_at

    def advance(self) -> None:
        """One more step taken."""
        self.step += 1

    # ---- what a step reads ---------------------------------------------------------------

    @property
    def options(self) -> GenerationOptions:
        return self.spec.options

    @property
    def schedule(self) -> tuple[int, ...]:
        return self.spec.schedule

    @property
    def num_step(self) -> int:
        return self.spec.options.num_step

    @property
    def finished(self) -> bool:
        return self.step >= self.num_step
