"""A request's text as the engine gets it: normalised when the request asks (`normalize_text`).

Runs in a worker thread (the grammars take a few milliseconds a sentence, and the first use
loads them), never on the event loop. A stream prepares each segment once it is complete
(`server.streaming.session`), so normalisation never sees half a sentence.
"""

from __future__ import annotations

import asyncio

from server.text import normalize as normalizer


class TextPreparer:
    async def prepare(self, text: str, language: str | None, normalize: bool) -> str:
        if not normalize:
            return text
        return await asyncio.to_thread(self.prepare_now, text, language, normalize)

    def prepare_now(self, text: str, language: str | None, normalize: bool) -> str:
        """The same, on the caller's thread (a worker thread)."""
        return normalizer.normalize(text, language) if normalize else text
