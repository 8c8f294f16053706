"""A voice made from a turn's own first audio, and whether it may set the pace.

A stream without a voice speaks its later segments with its first segment's tokens as their
voice, and `keep_voice` keeps that same prompt. The speaker comes across from any length, the
speaking rate only from enough audio: a "Sure!" of a second says little about how fast this
voice speaks, and planning later text from its rate made it about three times too long. So a
prompt shorter than `MIN_PACE_SECONDS` gives the voice only; the text is then planned as
without a reference.
"""

from __future__ import annotations

from typing import Any

from server.engine.types import VoicePrompt

MIN_PACE_SECONDS = 2.0


def sets_pace(frames: int, frame_rate: float) -> bool:
    return frames >= MIN_PACE_SECONDS * frame_rate


def chained_voice(tokens: Any, text: str, frame_rate: float) -> VoicePrompt:
    """A turn's first chunk as the voice of what follows (peak-normalised, as the reference's
    chained chunks are: no `rms`)."""
    return VoicePrompt(tokens=tokens, text=text, rms=None, sets_pace=sets_pace(int(tokens.shape[-1]), frame_rate))
