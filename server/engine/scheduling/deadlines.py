"""When each chunk is needed: the deadlines and slack that the `deadline` scheduler packs by.

A streamed chunk is due when playback reaches it (chunk 0: on arrival, or its `due_at` hint); a
whole-file request is due its audio's length after arrival. Slack = due - now - steps left x
seconds per step; beyond the horizon a chunk may wait (docs/architecture.md).
"""

from __future__ import annotations

from typing import Literal

HORIZON_S = 1.0  # slack beyond this: far ahead of playback (may wait, may be paused)
DEFAULT_STEP_S = 0.05  # seconds per step until the engine has measured some

Tier = Literal[0, 1, 2]
URGENT, AHEAD, BATCH = 0, 1, 2  # due within the horizon | a stream's chunk far ahead | whole-file


def is_whole(utt) -> bool:
    return utt.state.request.stream == "whole"


def audio_seconds_before(utt, frame_rate: int) -> float:
    """Audio of the request's chunks before this one, by their planned lengths."""
    return sum(c.target_len for c in utt.state.plan.chunks[: utt.chunk_index]) / frame_rate


def due_at(utt, step_s: float, frame_rate: int) -> float:
    """perf_counter() seconds by which this chunk's audio is needed."""
    state = utt.state
    request = state.request
    if is_whole(utt):
        return state.submitted_at + sum(c.target_len for c in state.plan.chunks) / frame_rate
    hint = request.due_at
    first = hint if hint is not None else state.submitted_at
    if utt.chunk_index == 0:
        return first
    if state.first_audio_at is not None:
        start = state.first_audio_at if hint is None else max(state.first_audio_at, hint)
    else:
        start = first + request.options.num_step * step_s
    return start + audio_seconds_before(utt, frame_rate)


def slack(utt, now: float, step_s: float, frame_rate: int) -> float:
    """Seconds this chunk could still wait and make its deadline."""
    return due_at(utt, step_s, frame_rate) - now - (utt.num_step - utt.step) * step_s


def tier(utt, slack_s: float, horizon_s: float = HORIZON_S) -> Tier:
    """URGENT blocks and may pause others; AHEAD and BATCH only fill what is left."""
    if slack_s <= horizon_s:
        return URGENT
    return BATCH if is_whole(utt) else AHEAD
