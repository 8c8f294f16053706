"""`"source": "model"` timestamps: the model's own allocation of a chunk's length to its text.

OmniVoice sizes each chunk from its characters' weights (`RuleDurationEstimator`: a Latin
letter 1, a space 0.2, punctuation 0.5, a CJK character 3, a digit 3.5...). The same weights,
summed along the chunk's text, say where each word starts and ends as a share of the chunk; the
shares are scaled to the chunk's actual audio (after post-processing), so the first word starts
at the chunk's first sample and the last one ends at its last. It is an estimate (the model
places sounds where it will within its canvas), free, and never late: it needs nothing but the
text and the audio's length.

Words are runs between spaces, with punctuation kept on the word before it; in Chinese,
Japanese and Korean each character is a word. The text is the one the chunk spoke (after the
lexicon and `normalize_text`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from itertools import accumulate

from server.text.reference_modules import reference_module
from server.timestamps.frames import Span

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


@lru_cache(maxsize=1)
def _weigh():
    return reference_module("duration").RuleDurationEstimator()._get_char_weight


def tokens(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the words of `text`."""
    spans: list[list[int]] = []
    for match in _TOKEN.finditer(text):
        if spans and not any(c.isalnum() for c in match.group(0)):
            spans[-1][1] = match.end()  # punctuation goes with the word before it
        else:
            spans.append([match.start(), match.end()])
    return [(a, b) for a, b in spans]


class AsWritten:
    """One request's lexicon substitutions, in order: the words as spoken that stand for words
    as written (`[K AO1 R AH0 S]` for `Chorus`, `three em` for `3M`). Word timestamps show the
    written word over the span of the spoken ones. Chunks are read in order; a substitution not
    found (a normaliser that rewrote it) leaves the spoken words as they are."""

    def __init__(self, pairs: tuple[tuple[str, str], ...] = ()):
        self.pairs = pairs
        self.next = 0

    def label(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
        """`text`'s word spans as (start, end, the word shown): those one substitution covers
        merged into one, showing what was written (with the punctuation around it)."""
        out: list[tuple[int, int, str]] = []
        i = 0
        while i < len(spans):
            a, b = spans[i]
            k = -1
            if self.next < len(self.pairs):
                said = self.pairs[self.next][0]
                k = text.find(said, a)
            if k < 0 or k >= b:
                out.append((a, b, text[a:b]))
                i += 1
                continue
            said, written = self.pairs[self.next]
            self.next += 1
            stop = k + len(said)
            j = i
            while j + 1 < len(spans) and spans[j + 1][0] < stop:
                j += 1
            last = max(spans[j][1], stop)
            out.append((a, last, text[a:k] + written + text[stop:last]))
            i = j + 1
        return out


def place(text: str, start: int, end: int, chars: bool = False,
          written: AsWritten | None = None) -> tuple[list[Span], list[Span] | None]:
    """The words (and, with `chars`, every non-space character) of a chunk whose audio spans
    samples [start, end) of the stream's clock; a lexicon substitution shown as written."""
    weigh = _weigh()
    cumulative = [0.0, *accumulate(weigh(c) for c in text)]
    total = cumulative[-1]
    n = max(end - start, 0)

    def at(index: int) -> int:
        return start + (round(cumulative[index] / total * n) if total > 0 else round(index / len(text) * n))

    words = tokens(text)
    if words:  # the first word starts with the chunk's audio and the last one ends with it
        first, last = words[0][0], words[-1][1]
        scale = cumulative[last] - cumulative[first]
        cumulative = [(w - cumulative[first]) * (total / scale) if scale > 0 else w for w in cumulative]
    labelled = written.label(text, words) if written is not None else [(a, b, text[a:b]) for a, b in words]
    out = [Span(shown, at(a), at(b)) for a, b, shown in labelled]
    if out:
        out[0].start_samples, out[-1].end_samples = start, max(end, start)
    letters = None
    if chars:
        letters = []
        for (a, b, shown), span in zip(labelled, out, strict=True):
            if shown == text[a:b]:
                letters += [Span(c, min(max(at(i), start), end), min(max(at(i + 1), start), end))
                            for i, c in enumerate(text[a:b], a) if not c.isspace()]
            else:  # a substituted word: its written letters share its span evenly
                shown_letters = [c for c in shown if not c.isspace()]
                width = (span.end_samples - span.start_samples) / max(len(shown_letters), 1)
                letters += [Span(c, span.start_samples + round(n * width), span.start_samples + round((n + 1) * width))
                            for n, c in enumerate(shown_letters)]
    return out, letters
