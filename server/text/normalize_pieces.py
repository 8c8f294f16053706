"""A text cut into pieces for the normaliser's workers, so that no one call is long.

WeTextProcessing's cost grows faster than the text (a run of digits most of all), and a call
cannot be interrupted short of ending its process. Pieces of at most `MAX_PIECE_WEIGHT` (a
character weighs 1, a digit `DIGIT_WEIGHT`: the grammars spend several times longer on one)
bound every call; the workers take pieces from the requests in turn, so a long text does not hold a
short one back by more than a piece a worker. A text that fits in one piece is normalised whole,
exactly as the reference does; a longer one is cut after a sentence's end where it can be, else
at a space, else between two characters that are not both letters or digits (never inside a
bracketed span, which the normaliser holds out anyway), else at the piece's size. A piece cut off
in mid-word is followed by a space in the normalised text, so its words do not run together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PIECE_WEIGHT = 120
DIGIT_WEIGHT = 4
_SENTENCE_END = re.compile(r"[.!?。！？；;…]+[\"')\]”’]*\s+|[。！？；]")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")


@dataclass(frozen=True)
class Piece:
    text: str
    glued: bool = False  # cut in mid-word: a space goes after its normalised text


def _cut_at(text: str, start: int, limit: int, protected: list[tuple[int, int]]) -> tuple[int, bool]:
    """Where the piece that starts at `start` ends (at most `limit` characters) and whether that
    cut falls in mid-word."""
    end = start + limit

    def free(pos: int) -> bool:
        return not any(a < pos < b for a, b in protected)

    best = None
    for match in _SENTENCE_END.finditer(text, start, end):
        if match.end() > start and free(match.end()):
            best = match.end()
    if best is not None:
        return best, False
    for pos in range(end, start, -1):
        if text[pos - 1].isspace() and free(pos):
            return pos, False
    for pos in range(end, start, -1):
        if free(pos) and not (text[pos - 1].isalnum() and text[pos].isalnum()):
            return pos, False
    for a, b in protected:  # a bracketed span over the limit is a piece of its own
        if a < end < b:
            return (b if a <= start else a), False
    return end, True


def _span_within(text: str, start: int, weight: int) -> int:
    """How many characters from `start` weigh at most `weight` together."""
    total = 0
    for length, char in enumerate(text[start:], 1):
        total += DIGIT_WEIGHT if char.isdigit() else 1
        if total > weight:
            return max(1, length - 1)
    return len(text) - start


def pieces(text: str, weight: int = MAX_PIECE_WEIGHT) -> list[Piece]:
    """`text` as consecutive pieces of at most `weight` each (a bracketed span heavier than that
    stays whole); joined, their texts are `text`."""
    protected = [m.span() for m in _BRACKETS.finditer(text)]
    out: list[Piece] = []
    start = 0
    while (limit := _span_within(text, start, weight)) < len(text) - start:
        end, glued = _cut_at(text, start, limit, protected)
        out.append(Piece(text[start:end], glued))
        start = end
    if start < len(text):
        out.append(Piece(text[start:]))
    return out


def join(piece_list: list[Piece], normalised: list[str]) -> str:
    return "".join(out + (" " if piece.glued and out and not out.endswith(" ") else "")
                   for piece, out in zip(piece_list, normalised, strict=True))
