"""Fast start: where a long text's short first chunk ends.

With `first_chunk_seconds`, the first chunk ends at the first sentence or clause boundary
past about that many seconds of audio, so the first sound of any text comes after one short
chunk; the rest is chunked as usual. Pure text arithmetic, no model.
"""

from __future__ import annotations

# Ends of sentences and clauses. Latin marks count only before a space (or the end), so
# "3.5" and "e.g.x" do not split; CJK marks need no space after them.
LATIN_MARKS = frozenset(".!?;:,…")
CJK_MARKS = frozenset("。！？；：，、")
CLOSERS = frozenset("\"')]}’”»」』）")


def first_boundary_after(text: str, min_chars: int) -> int | None:
    """The index just past the first sentence or clause boundary at or after `min_chars`
    characters (closing quotes and brackets stay with their sentence), or None when there is
    none before the end of the text."""
    n = len(text)
    for i in range(max(min_chars, 1) - 1, n - 1):
        ch = text[i]
        if ch not in LATIN_MARKS and ch not in CJK_MARKS:
            continue
        end = i + 1
        while end < n and text[end] in CLOSERS:
            end += 1
        if end >= n:
            return None  # the text's own end: nothing would be left for later chunks
        if ch in CJK_MARKS or text[end].isspace():
            return end
    return None


def split_first_chunk(text: str, min_chars: int) -> tuple[str, str] | None:
    """(first chunk, the rest) split at `first_boundary_after`, or None (no boundary, or
    nothing but spaces after it)."""
    cut = first_boundary_after(text, min_chars)
    if cut is None:
        return None
    first, rest = text[:cut].strip(), text[cut:].strip()
    if not first or not rest:
        return None
    return first, rest
