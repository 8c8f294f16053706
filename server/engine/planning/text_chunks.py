"""The reference's text chunking, walking the punctuation instead of every character.

A long text is cut into chunks on the path to its first sound: `chunk_text_punctuation`
(the reference's rule) appends the text character by character to Python lists, joins and
strips the sentence so far at every full stop to look for abbreviations, and joins every
chunk again at the end. For a 60 s paragraph that was most of its planning, which went from
1.06 to 0.55 ms on an H200 machine's host with this port (the engine's timeline, fast start).

Here the same three passes work on positions. A sentence, a merged chunk and a final chunk
are always runs of consecutive characters of the text (a punctuation mark that opens a
sentence joins the previous sentence, which ends right before it), so each is kept as a
(start, end) pair; only the punctuation and closing marks, found by one regular expression,
are visited, and a chunk becomes a string once, by slicing. Lengths are the same character
counts the reference's lists have, so every merge decision and every output string is the
reference's (tests compare the two on curated and random texts). The punctuation, closing
marks and abbreviations are the reference module's own sets.
"""

from __future__ import annotations

import re

from server.engine.upstream_names import ABBREVIATIONS, CLOSING_MARKS, SPLIT_PUNCTUATION

_MARKS = re.compile("[" + "".join(re.escape(c) for c in sorted(SPLIT_PUNCTUATION | CLOSING_MARKS)) + "]")


def sentence_spans(text: str) -> list[list[int]]:
    """The reference's first pass: [start, end) of every sentence, in order, covering the text."""
    sentences: list[list[int]] = []
    start = 0  # where the sentence being read starts; empty while it equals the mark's index
    for match in _MARKS.finditer(text):
        i = match.start()
        mark = text[i]
        if start == i and sentences:  # a mark opening a sentence closes the previous one
            sentences[-1][1] = start = i + 1
        # a split mark ends the sentence, but a full stop after an abbreviation does not (the
        # last word, as `"".join(sentence).strip().split()[-1]`, is never empty: it holds the stop)
        elif mark in SPLIT_PUNCTUATION and (
                mark != "." or text[start:i + 1].rsplit(None, 1)[-1] not in ABBREVIATIONS):
            sentences.append([start, i + 1])
            start = i + 1
    if start < len(text):
        sentences.append([start, len(text)])
    return sentences


def _merge(spans: list[list[int]], chunk_len: int) -> list[list[int]]:
    """The reference's second pass: consecutive sentences joined while they fit `chunk_len`."""
    merged: list[list[int]] = []
    current: list[int] | None = None
    for start, end in spans:
        size = 0 if current is None else current[1] - current[0]
        if size + (end - start) <= chunk_len:
            current = [start if current is None else current[0], end]
        else:
            if current is not None:
                merged.append(current)
            current = [start, end]
    if current is not None:
        merged.append(current)
    return merged


def _absorb_short(chunks: list[list[int]], min_chunk_len: int) -> list[list[int]]:
    """The reference's last pass: a chunk under `min_chunk_len` joins the one before it; a
    short first chunk takes in the second."""
    first_short = bool(chunks) and chunks[0][1] - chunks[0][0] < min_chunk_len
    final: list[list[int]] = []
    for i, (start, end) in enumerate(chunks):
        if (i == 1 and first_short) or (end - start < min_chunk_len and final):
            final[-1][1] = end
        else:
            final.append([start, end])
    return final


def chunk_text_punctuation(text: str, chunk_len: int, min_chunk_len: int | None = None) -> list[str]:
    """`omnivoice.utils.text.chunk_text_punctuation(text, chunk_len, min_chunk_len)`: the
    same chunks, as stripped strings, empty ones left out."""
    chunks = _merge(sentence_spans(text), chunk_len)
    if min_chunk_len is not None:
        chunks = _absorb_short(chunks, min_chunk_len)
    return [piece for start, end in chunks if (piece := text[start:end].strip())]
