"""The units of work every room of the engine shares.

A request's plan (`RequestPlan`: its text chunks and their lengths), its engine-side state
(`RequestState`), and each chunk as an `Utterance`: one canvas (`CanvasItem`) stepping through its
own schedule with its own random generator. Planning makes them, the scheduler queues them, the
model steps them and the runtime finishes them.
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
    chunks: list[ChunkPlan]
    # speed used to estimate chunk lengths (the reference's `task.speed` entry, or None)
    chunk_speed: float | None
    chained: bool  # no voice and several chunks: chunk 0 becomes the others' reference


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
    """One text chunk of a request: one canvas, stepping through its own schedule."""

    state: RequestState
    chunk_index: int
    item: CanvasItem
    schedule: tuple[int, ...]
    generator: torch.Generator
    step: int = 0

    @property
    def options(self) -> GenerationOptions:
        return self.state.request.options

    @property
    def num_step(self) -> int:
        return self.options.num_step

    @property
    def finished(self) -> bool:
        return self.step >= self.num_step

    @property
    def packed_len(self) -> int:
        return self.item.packed_len
