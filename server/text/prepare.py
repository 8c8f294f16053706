"""A request's text as the engine gets it: the pronunciation lexicon applied, then normalised
when the request asks (`normalize_text`).

Both are request-controlled work and follow the one rule (`server.bounds`): the text as spoken
is held to `max_spoken_chars` (checked as the lexicon writes it, and after normalisation), the
lexicon runs on the text thread within `lexicon_seconds` and the normaliser's grammars in worker
processes within `normalize_seconds` of their CPU time, and both stop when their request is
cancelled (the awaiting task is). A request with no entry that could apply and no
`normalize_text` goes straight on. A stream prepares each segment once it is complete
(`server.streaming.session`).

The lexicon is read from the voice library and compiled once per change (`lexicon.Lexicon`),
by one task every request waiting on it shares; it is read again after `LEXICON_TTL_S` (changes
made through this server take effect at once; another replica's, within that time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from server.bounds import WorkBounds, WorkRefused, run_bounded
from server.errors import ServiceError
from server.text.lexicon import Applied, Lexicon, Pronunciation
from server.text.normalize import Choice
from server.text.normalize_workers import NormalizerWorkers, WorkerDied

LEXICON_TTL_S = 5.0


@dataclass(frozen=True)
class Spoken:
    """A request's text as spoken, and (in order) each lexicon entry's words as spoken with the
    words the user wrote for them: word timestamps name what was written."""

    text: str
    as_written: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TextLimits:
    max_spoken_chars: int = 20000  # the text after the lexicon and normalisation
    lexicon_seconds: float = 2.0  # applying the lexicon to one text
    normalize_seconds: float = 30.0  # CPU seconds of the workers normalising one text may take


class TextPreparer:
    def __init__(self, read_lexicon: Callable[[], list[Pronunciation]],
                 voice_ids: Callable[[str], set[str]], *, normalize_workers: int,
                 limits: TextLimits = TextLimits()):
        """`read_lexicon`: every entry (blocking: run on the text thread); `voice_ids(voice)`: the
        ids a request's `voice` (an id, a display name, a built-in name) stands for (blocking);
        `normalize_workers`: processes running the normaliser's grammars at most."""
        self._read = read_lexicon
        self.limits = limits
        self.normalizer = NormalizerWorkers(normalize_workers, budget_s=limits.normalize_seconds)
        self._voice_ids = voice_ids
        # the lexicon's reads, builds and applications: one thread of their own, so they neither
        # wait behind nor hold up what other routes run on the loop's default executor
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="chorus-text")
        self._entries: tuple[Pronunciation, ...] = ()
        self._lexicon = Lexicon(())
        self._read_at = -LEXICON_TTL_S
        self._refresh: asyncio.Task[Lexicon] | None = None

    def changed(self) -> None:
        """An entry was added or deleted here: read the lexicon again at the next request."""
        self._read_at = -LEXICON_TTL_S

    async def lexicon(self) -> Lexicon:
        """The compiled lexicon, read again once `LEXICON_TTL_S` has passed (one read at a time:
        the requests meanwhile wait for the same one)."""
        if time.monotonic() - self._read_at < LEXICON_TTL_S:
            return self._lexicon
        if self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._reload())
            self._refresh.add_done_callback(self._refreshed)
        return await asyncio.shield(self._refresh)

    def _refreshed(self, task: asyncio.Task) -> None:
        self._refresh = None
        if not task.cancelled():
            task.exception()  # seen: a failed read is retried by the next request

    async def _reload(self) -> Lexicon:
        started = time.monotonic()
        entries = tuple(await asyncio.get_running_loop().run_in_executor(self._thread, self._read))
        if entries != self._entries:
            self._lexicon = await asyncio.get_running_loop().run_in_executor(self._thread, Lexicon, entries)
            self._entries = entries
        self._read_at = started
        return self._lexicon

    async def prepare(self, text: str, language: str | None, normalize: Choice, voice: str | None = None,
                      field: str = "text") -> str:
        """The text as spoken; `ServiceError` past a cap or a budget (`field` names the text), or
        when a normaliser worker died on it. `normalize`: the request's `normalize_text` (true,
        "reference" or false), which the workers' normaliser follows."""
        return (await self.prepare_spoken(text, language, normalize, voice, field)).text

    async def prepare_spoken(self, text: str, language: str | None, normalize: Choice, voice: str | None = None,
                             field: str = "text") -> Spoken:
        """`prepare`'s text, with what each lexicon entry put in stands for (word timestamps)."""
        try:
            return await self._prepare(text, language, normalize, voice, field)
        except WorkRefused as exc:
            raise ServiceError(exc.code, exc.message, exc.field) from None
        except WorkerDied as exc:
            raise ServiceError("internal", str(exc)) from None

    async def _prepare(self, text: str, language: str | None, normalize: Choice, voice: str | None,
                       field: str) -> Spoken:
        lexicon = await self.lexicon()
        said: tuple[tuple[str, str], ...] = ()
        if lexicon:
            bounds = WorkBounds.within("the pronunciation lexicon", self.limits.max_spoken_chars,
                                       self.limits.lexicon_seconds, field)
            applied = await run_bounded(self._thread, bounds, self.apply_lexicon, lexicon, text, voice, bounds)
            text, said = applied.text, applied.as_written()
        if not normalize:
            return Spoken(text, said)
        bounds = WorkBounds.within("normalize_text", self.limits.max_spoken_chars, None, field)
        return Spoken(await self.normalizer.normalize(text, language, bounds, choice=normalize), said)

    def apply_lexicon(self, lexicon: Lexicon, text: str, voice: str | None, bounds: WorkBounds) -> Applied:
        """The entries that apply to `voice` (and to every voice), on the caller's thread."""
        ids: set[str] = set()
        if voice is not None and lexicon.scoped:
            ids = self._voice_ids(voice)
        return lexicon.apply(text, frozenset(ids), bounds)

    def close(self) -> None:
        self.normalizer.close()
        self._thread.shutdown(wait=False, cancel_futures=True)
