"""One long text as a job's items, and how long a text will play.

A long text is cut at paragraph breaks (a blank line), paragraphs that are too long at sentence
ends, sentences that are too long at clause marks, then at spaces (or anywhere, in a script
written without them); the pieces are packed in order into items of at most `max_chars`. Where
the later items take the first item's voice (no voice named), the first item is kept to its first
sentence or two (`first_chars`): that item's first chunk becomes the voice every later chunk
carries as its reference, and a short reference is cheap to carry in every canvas.

Lengths come from the reference's own duration estimator (character weights, the same rule the
engine plans a request by), so caps and the time left need no model.
"""

from __future__ import annotations

import re
from functools import lru_cache

from server.text.reference_modules import reference_module
from server.visible_text import has_visible_text

_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n")
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’»)\]]*\s+|[。！？]+[\"'”’」』)]*\s*")
_CLAUSE_END = re.compile(r"[,;:—]+\s+|[，；：、]+\s*")
_NO_SPACES = re.compile(r"\S+")
# what the reference's estimator measures a text against when there is no reference voice: this
# many audio tokens (25 a second) for this text (`OmniVoice._estimate_target_tokens`)
_BASE_TEXT, _BASE_TOKENS, _TOKENS_PER_SECOND = "Nice to meet you.", 25, 25.0


@lru_cache(maxsize=1)
def _estimator():
    return reference_module("duration").RuleDurationEstimator()


def estimate_seconds(text: str, speed: float | None = None, duration: float | None = None) -> float:
    """How long `text` plays as the engine would plan it without a reference voice: `duration`
    when given, else the estimator's length (divided by `speed`)."""
    if duration:
        return float(duration)
    tokens = _estimator().estimate_duration(text, _BASE_TEXT, _BASE_TOKENS)
    seconds = max(1.0, tokens) / _TOKENS_PER_SECOND
    return seconds / speed if speed and speed > 0 else seconds


def _cut(text: str, boundary: re.Pattern[str]) -> list[str]:
    """`text` cut after each match of `boundary` (the match stays with the piece before it)."""
    pieces, start = [], 0
    for match in boundary.finditer(text):
        if match.end() > start:
            pieces.append(text[start:match.end()])
            start = match.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if has_visible_text(piece)]


def _words(text: str, max_chars: int) -> list[str]:
    """A text with no boundary left, cut at spaces; a word longer than `max_chars` anywhere."""
    out: list[str] = []
    for word in _NO_SPACES.findall(text):
        out.extend(word[k:k + max_chars] for k in range(0, len(word), max_chars))
    return out


def _pieces(text: str, max_chars: int) -> list[str]:
    """Sentences (or smaller pieces) of at most `max_chars`, in order."""
    out: list[str] = []
    for sentence in _cut(text, _SENTENCE_END):
        if len(sentence) <= max_chars:
            out.append(sentence)
            continue
        for clause in _cut(sentence, _CLAUSE_END):
            out.extend([clause] if len(clause) <= max_chars else _words(clause, max_chars))
    return out


def _pack(pieces: list[str], max_chars: int, sep: str) -> list[str]:
    """Consecutive pieces joined while they fit in `max_chars`."""
    items: list[str] = []
    for piece in pieces:
        if items and len(items[-1]) + len(sep) + len(piece) <= max_chars:
            items[-1] += sep + piece
        else:
            items.append(piece)
    return items


def split_text(text: str, max_chars: int, first_chars: int | None = None) -> list[str]:
    """`text` as items of at most `max_chars` characters (the first of at most `first_chars`),
    cut at the largest boundary that fits: paragraph, sentence, clause, word."""
    if first_chars is not None:
        first, rest = _first_part(text, min(first_chars, max_chars))
        return [first, *split_text(rest, max_chars)] if has_visible_text(rest) else [first]
    items: list[str] = []
    for paragraph in _cut(text, _PARAGRAPH):
        parts = [paragraph] if len(paragraph) <= max_chars else _pack(_pieces(paragraph, max_chars), max_chars, " ")
        items.extend(parts)
    return _pack(items, max_chars, "\n\n")


def _first_part(text: str, max_chars: int) -> tuple[str, str]:
    """The opening sentences of `text`'s first paragraph, at most `max_chars` (or its first piece,
    cut to fit), and the rest of the text."""
    paragraphs = _cut(text, _PARAGRAPH)
    pieces = _pieces(paragraphs[0], max_chars)
    first, k = pieces[0], 1
    while k < len(pieces) and len(first) + 1 + len(pieces[k]) <= max_chars:
        first, k = f"{first} {pieces[k]}", k + 1
    return first, "\n\n".join(p for p in [" ".join(pieces[k:]), *paragraphs[1:]] if p)
