"""When each chunk is needed: the deadlines and slack that the `deadline` scheduler packs by.

A streamed chunk is due when playback reaches it (chunk 0: on arrival, or its `due_at` hint); a
whole-file request is due its audio's length after arrival. Slack = due - now - steps left x
seconds per step; beyond the horizon a chunk may wait (docs/architecture.md).
"""

from __future__ import annotations

from typing import Literal

from server.engine.scheduling.schedulable import Schedulable

HORIZON_S = 1.0  # slack beyond this: far ahead of playback (may wait, may be paused)
DEFAULT_STEP_S = 0.05  # seconds per step until the engine has measured some

Tier = Literal[0, 1, 2]
URGENT, AHEAD, BATCH = 0, 1, 2  # due within the horizon | a stream's chunk far ahead | whole-file


def is_whole(chunk: Schedulable) -> bool:
    return chunk.due.whole


def audio_seconds_before(chunk: Schedulable, frame_rate: int) -> float:
    """Audio of the request's chunks before this one, by their planned lengths."""
    return chunk.due.frames_before / frame_rate


def due_at(chunk: Schedulable, step_s: float, frame_rate: int) -> float:
    """perf_counter() seconds by which this chunk's audio is needed."""
    due = chunk.due
    if due.whole:
        return due.arrived_at + due.frames_total / frame_rate
    first = due.hint if due.hint is not None else due.arrived_at
    if due.chunk_index == 0:
        return first
    first_audio_at = chunk.first_audio_at
    if first_audio_at is not None:
        start = first_audio_at if due.hint is None else max(first_audio_at, due.hint)
    else:
        start = first + due.num_step * step_s
    return start + audio_seconds_before(chunk, frame_rate)


def slack(chunk: Schedulable, now: float, step_s: float, frame_rate: int) -> float:
    """Seconds this chunk could still wait and make its deadline."""
    return due_at(chunk, step_s, frame_rate) - now - chunk.steps_left * step_s


def tier(chunk: Schedulable, slack_s: float, horizon_s: float = HORIZON_S) -> Tier:
    """URGENT blocks and may pause others; AHEAD and BATCH only fill what is left."""
    if slack_s <= horizon_s:
        return URGENT
    return BATCH if is_whole(chunk) else AHEAD
