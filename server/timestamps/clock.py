"""One request's (or stream's) timestamps: each chunk's words placed on its audio clock.

The clock is the audio sent, in samples at the request's `sample_rate` (the same clock as a
stream's `offset_samples`): a chunk of N samples at the engine's rate that starts after M of
them spans round(M * out / in) .. round((M + N) * out / in) there, whatever the encoder holds
back between frames.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from server.engine.types import ChunkTokens
from server.timestamps.frames import Span, TimestampKind, WordsMsg
from server.timestamps.model_words import AsWritten, place, tokens

log = logging.getLogger("chorus.timestamps")


class Aligner(Protocol):
    """`--aligner`'s CTC aligner (`server.engine.model.aligner.CtcAligner`), on its own thread."""

    def align(self, audio: np.ndarray, rate: int, words: list[str]) -> Future[list[tuple[float, float]]]: ...


class WordClock:
    def __init__(self, request_id: str, kind: TimestampKind, written: AsWritten | None = None):
        self.request_id = request_id
        self.kind = kind
        self.written = written  # the lexicon's substitutions: shown as written
        self.texts: dict[int, str] = {}  # chunk -> the text it spoke (from its finished tokens)
        self.engine_samples = 0  # audio so far, at the engine's rate

    def on_tokens(self, event: ChunkTokens) -> None:
        self.texts[event.chunk] = event.text

    def whole_text(self) -> str:
        """Every chunk's text, in order: the words of a request sent whole."""
        return " ".join(self.texts[k].strip() for k in sorted(self.texts))

    def _span(self, samples: int, engine_rate: int, out_rate: int) -> tuple[int, int]:
        start = round(self.engine_samples * out_rate / engine_rate)
        self.engine_samples += samples
        return start, round(self.engine_samples * out_rate / engine_rate)

    def frame(self, text: str, samples: int, engine_rate: int, out_rate: int,
              segment: int | None = None) -> WordsMsg:
        """The `words` frame of the next `samples` of audio (at `engine_rate`), speaking `text`."""
        start, end = self._span(samples, engine_rate, out_rate)
        words, chars = place(text.strip(), start, end, chars=self.kind == "char", written=self.written)
        return WordsMsg(self.request_id, "model", words, segment=segment, chars=chars)

    async def aligned_frame(self, aligner: Aligner, text: str, audio: np.ndarray, engine_rate: int,
                            out_rate: int) -> WordsMsg:
        """The same from the aligner (the clock moves on at once: later chunks need not wait)."""
        start, end = self._span(audio.shape[-1], engine_rate, out_rate)
        return await aligned_words(aligner, self.request_id, self.kind, text, audio, engine_rate, start, end, out_rate,
                                   written=self.written)


async def aligned_words(aligner: Aligner, request_id: str, kind: TimestampKind, text: str, audio: np.ndarray,
                        engine_rate: int, start: int, end: int, out_rate: int, segment: int | None = None,
                        written: AsWritten | None = None) -> WordsMsg:
    """The `words` frame of audio spanning [start, end) of the clock (at `out_rate`), from the
    aligner (the words as spoken; a lexicon substitution shown as written over their span); the
    model's estimate when the aligner fails."""
    text = text.strip()
    spans_in_text = tokens(text)
    words = [text[a:b] for a, b in spans_in_text]
    labelled = written.label(text, spans_in_text) if written is not None else None
    try:
        spans = await asyncio.wrap_future(aligner.align(audio, engine_rate, words))
    except Exception:  # a failed alignment costs that chunk its "aligned" source, nothing else
        log.exception("aligning a chunk failed; its words come from the model's estimate")
        if written is not None and labelled is not None:
            written.next -= _taken(labelled, text)  # `place` labels the same words again
        model_words, chars = place(text, start, end, chars=kind == "char", written=written)
        return WordsMsg(request_id, "model", model_words, segment=segment, chars=chars)
    placed = [Span(word, min(start + round(a * out_rate), end), min(start + round(b * out_rate), end))
              for word, (a, b) in zip(words, spans)]
    if labelled is not None:
        placed = _as_labelled(placed, spans_in_text, labelled)
    chars = None
    if kind == "char":  # within each aligned word, by the model's weights
        chars = [c for w in placed for c in place(w.text, w.start_samples, w.end_samples, chars=True)[1] or []]
    return WordsMsg(request_id, "aligned", placed, segment=segment, chars=chars)


def _taken(labelled: list[tuple[int, int, str]], text: str) -> int:
    """How many substitutions `labelled` used (shown words that differ from the text)."""
    return sum(shown != text[a:b] for a, b, shown in labelled)


def _as_labelled(placed: list[Span], spans: list[tuple[int, int]],
                 labelled: list[tuple[int, int, str]]) -> list[Span]:
    """Aligned spoken words merged as `labelled` groups them (a substitution's words as one)."""
    out, i = [], 0
    for a, b, shown in labelled:
        group = []
        while i < len(spans) and spans[i][0] < b:
            if spans[i][0] >= a:
                group.append(placed[i])
            i += 1
        if group:
            out.append(Span(shown, group[0].start_samples, group[-1].end_samples))
    return out


def segment_words(aligner: Aligner | None, request_id: str, kind: TimestampKind, text: str, audio: np.ndarray,
                  engine_rate: int, start: int, end: int, out_rate: int,
                  segment: int, written: AsWritten | None = None) -> WordsMsg | Awaitable[WordsMsg]:
    """A stream segment's `words` frame: at once from the model's estimate, or (with an aligner)
    something to await; a lexicon substitution shown as written."""
    if aligner is None:
        words, chars = place(text.strip(), start, end, chars=kind == "char", written=written)
        return WordsMsg(request_id, "model", words, segment=segment, chars=chars)
    return aligned_words(aligner, request_id, kind, text, audio, engine_rate, start, end, out_rate, segment,
                         written=written)
