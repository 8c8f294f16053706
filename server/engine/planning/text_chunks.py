"""The reference's text chunking, walking the punctuation instead of every character.

Sentences and chunks are (start, end) spans of the text; only punctuation and closing marks,
found by one regular expression, are visited, and a chunk becomes a string once. Lengths are the
character counts the reference's lists have, so every chunk is the reference's (tests compare
them on curated and random texts).
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
