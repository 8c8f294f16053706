"""Fast start: where a long text's short first chunk ends.

With `first_chunk_seconds`, the first chunk ends at a sentence or clause boundary about that
many seconds of audio into the text (`first_chunk_end` says which), so the first sound of any
text comes after one short chunk; the rest is chunked as usual. Pure text arithmetic, no model.
"""

from __future__ import annotations

# Ends of sentences and clauses. Latin marks count only before a space (or the end), so
# "3.5" and "e.g.x" do not split; CJK marks need no space after them.
LATIN_MARKS = frozenset(".!?;:,…")
CJK_MARKS = frozenset("。！？；：，、")
CLOSERS = frozenset("\"')]}’”»」』）")


# A boundary up to this many times the asked length is taken as "about" it; when the first
# boundary past the asked length is later than that, the last one past `EARLIEST` of it (before
# the asked length) is taken instead: a text whose first sentence is a little shorter than the
# asked seconds should not wait for a long second sentence.
LATEST = 1.5
EARLIEST = 0.5


def boundaries(text: str):
    """Indices just past each sentence or clause boundary (closing quotes and brackets stay
    with their sentence), except one at the text's own end: nothing would be left after it."""
    n = len(text)
    for i in range(n - 1):
        ch = text[i]
        if ch not in LATIN_MARKS and ch not in CJK_MARKS:
            continue
        end = i + 1
        while end < n and text[end] in CLOSERS:
            end += 1
        if end >= n:
            return
        if ch in CJK_MARKS or text[end].isspace():
            yield end


def first_chunk_end(text: str, asked_chars: int) -> int | None:
    """Where a first chunk of about `asked_chars` characters ends: the first boundary at or
    past them if it comes within `LATEST` times them; else the last boundary from `EARLIEST`
    of them on, before them; else the first boundary past them however far; None when the
    text has no boundary past `EARLIEST` of them."""
    asked = max(asked_chars, 1)
    earlier = None
    for end in boundaries(text):
        if end < EARLIEST * asked:
            continue
        if end < asked:
            earlier = end
        elif end <= LATEST * asked or earlier is None:
            return end
        else:
            return earlier
    return earlier


def split_first_chunk(text: str, asked_chars: int) -> tuple[str, str] | None:
    """(first chunk, the rest) split at `first_chunk_end`, or None (no boundary, or
    nothing but spaces after it)."""
    cut = first_chunk_end(text, asked_chars)
    if cut is None:
        return None
    first, rest = text[:cut].strip(), text[cut:].strip()
    if not first or not rest:
        return None
    return first, rest
