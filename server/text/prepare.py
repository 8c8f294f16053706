"""A request's text as the engine gets it: the pronunciation lexicon applied, then normalised
when the request asks (`normalize_text`).

The lexicon runs in a worker thread and the normaliser's grammars in worker processes
(`normalize_workers`: they keep the GIL for the whole call), never on the event loop, and only
when there is work: a request without `normalize_text` and no entry that could apply goes
straight on. A stream prepares each segment once it is complete (`server.streaming.session`).

The lexicon is read from the voice library and kept for `LEXICON_TTL_S` (changes made through
this server take effect at once; another replica's, within that time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from server.text import lexicon
from server.text.lexicon import Pronunciation
from server.text.normalize_workers import NormalizerWorkers

LEXICON_TTL_S = 5.0


class TextPreparer:
    def __init__(self, read_lexicon: Callable[[], list[Pronunciation]],
                 voice_ids: Callable[[str], set[str]], *, normalize_workers: int):
        """`read_lexicon`: every entry (blocking: run in a thread); `voice_ids(voice)`: the ids
        a request's `voice` (an id, a display name, a built-in name) stands for (blocking);
        `normalize_workers`: processes running the normaliser's grammars at most."""
        self._read = read_lexicon
        self.normalizer = NormalizerWorkers(normalize_workers)
        self._voice_ids = voice_ids
        self._entries: list[Pronunciation] = []
        self._read_at = -LEXICON_TTL_S

    def changed(self) -> None:
        """An entry was added or deleted here: read the lexicon again at the next request."""
        self._read_at = -LEXICON_TTL_S

    async def entries(self) -> list[Pronunciation]:
        if time.monotonic() - self._read_at >= LEXICON_TTL_S:
            self._entries = await asyncio.to_thread(self._read)
            self._read_at = time.monotonic()
        return self._entries

    async def prepare(self, text: str, language: str | None, normalize: bool, voice: str | None = None) -> str:
        entries = await self.entries()
        if entries:
            text = await asyncio.to_thread(self.apply_lexicon, text, voice, entries)
        return await self.normalizer.normalize(text, language) if normalize else text

    def apply_lexicon(self, text: str, voice: str | None, entries: list[Pronunciation]) -> str:
        """The entries that apply to `voice` (and to every voice), on the caller's thread."""
        ids: set[str] = set()
        if voice is not None and any(entry.voice is not None for entry in entries):
            ids = self._voice_ids(voice)
        return lexicon.apply(text, lexicon.for_voice(entries, ids))

    def close(self) -> None:
        self.normalizer.close()
