"""When each chunk is needed: the deadlines and slack that the `deadline` scheduler packs by.

A streamed request's chunk 0 is due when the request arrived (or at its `due_at` hint, the
moment the listener's playback reaches it, for a stream's later text segment). A later chunk
is due when playback will reach it: playback start (first audio sent, and not before the
hint) plus the audio of the chunks before it, at real-time speed; before any audio has been
sent, the start is estimated as chunk 0's due time plus the steps chunk 0 takes. Whole-file
requests (`stream: whole`) play nothing until they end: one is due its whole audio's length
after it arrived, so it waits for streams while it can and ages in once it cannot.

Slack is what is left after the work: due - now - (steps still to run x seconds per step).
A chunk whose slack exceeds the horizon is far ahead of playback: it may wait, and may be
paused, for chunks that are due sooner.
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
