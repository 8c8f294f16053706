"""`keep_voice`: the speaker a request produced, kept as a voice any later request may name.

A request or stream with `keep_voice` gets a `KeptVoice` ticket. Its first chunk's finished
tokens (and that chunk's text: together, a voice prompt, as the reference's long-text
chunking uses its first chunk for the rest) are stored in the voice library as soon as they
are done (from a chunk under two seconds, the speaker without its speaking rate:
`server.voices.pace`), while the rest is still being made, so `done` (or the HTTP response's headers) can
name the voice without waiting for a write. A stream in automatic or design mode already takes
its first segment as the voice of the rest: the kept voice is that very prompt.

Kept voices live in the same library as uploads (SQLite or PostgreSQL, so every replica sees
them), with `kept: true` and an `expires_at` (`--kept-voice-ttl`, from when it was kept). Each
belongs to who kept it (`server.voices.store.Owner`: its API key, listed, used and deleted by it
alone; without keys its id, 128 random bits, is what grants it). At most
`--max-kept-voices-per-owner` are one owner's and `--max-kept-voices` everyone's: past either,
the owner's own (or the biggest owner's) closest to expiry make room.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from dataclasses import dataclass

import numpy as np

from server.engine.types import ChunkTokens
from server.voices import VoiceLibrary
from server.voices.pace import sets_pace
from server.voices.store import Owner

log = logging.getLogger("chorus.voices")

FORMAT_VERSION = 1  # the layout `server.engine.voice_codec` reads


@dataclass(frozen=True)
class KeepPolicy:
    ttl_seconds: float = 24 * 3600.0
    max_kept: int = 1000
    max_per_owner: int = 100


def voice_blob(tokens: np.ndarray, text: str, sets_pace: bool = True) -> bytes:
    """A stored voice from a chunk's tokens, in `server.engine.model.voice_codec`'s layout,
    written from numpy (the web layer has no torch). `rms` is NaN: none, as for chained chunks;
    `sets_pace` false where the chunk is too short to say how fast the voice speaks."""
    if tokens.ndim != 2 or tokens.size == 0:
        raise ValueError(f"voice tokens must be (codebooks, frames), got shape {tokens.shape}")
    buf = io.BytesIO()
    np.savez(buf, format=np.array(FORMAT_VERSION, dtype=np.int64), tokens=tokens.astype(np.int16),
             text=np.array(text), rms=np.array(np.nan, dtype=np.float64), sets_pace=np.array(sets_pace))
    return buf.getvalue()


class KeepFailed(Exception):
    """The voice could not be kept (the message is for the client)."""


class KeptVoice:
    """One request's ticket: `on_tokens` takes the first chunk's tokens and starts storing
    them; `voice_id()` waits for the id."""

    def __init__(self, store: VoiceLibrary, policy: KeepPolicy, frame_rate: float, owner: Owner):
        self.store = store
        self.policy = policy
        self.frame_rate = frame_rate
        self.owner = owner
        self._task: asyncio.Task[str] | None = None

    def on_tokens(self, event: ChunkTokens) -> None:
        if event.chunk == 0 and self._task is None:
            self.keep(np.asarray(event.tokens), event.text)

    def keep(self, tokens: np.ndarray, text: str) -> None:
        """Store `tokens` speaking `text` (once; later calls are ignored)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._store(tokens, text))

    @property
    def started(self) -> bool:
        return self._task is not None

    async def _store(self, tokens: np.ndarray, text: str) -> str:
        blob = voice_blob(tokens, text.strip(), sets_pace(tokens.shape[-1], self.frame_rate))
        expires_at = int(time.time() + self.policy.ttl_seconds)
        info = await asyncio.to_thread(self.store.add_kept, text.strip(), tokens.shape[-1] / self.frame_rate,
                                       blob, expires_at, self.owner, self.policy.max_kept, self.policy.max_per_owner)
        log.info("voice kept", extra={"voice": info.id, "seconds": info.seconds, "expires_at": expires_at})
        return info.id

    async def voice_id(self) -> str:
        if self._task is None:
            raise KeepFailed("keep_voice: the request made no audio to keep a voice from")
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("keeping a voice failed")
            raise KeepFailed(f"keep_voice: the voice could not be stored ({type(exc).__name__})") from None
