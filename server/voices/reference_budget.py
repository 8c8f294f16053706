"""Bytes of one-shot reference audio held while it is prepared, all requests together.

A `synthesize` or `stream_open` with `reference.audio` waits for a decode and an encode
before it is accepted, out of `--max-queue`'s sight, holding its base64 text and then the
decoded samples. `ReferenceBudget` counts that text from the request's start until its voice
is encoded (`--max-references-bytes`); beyond it the request gets `busy` before anything is
decoded. One reference alone is always admitted (its size is `--max-reference-bytes`' job).
"""

from __future__ import annotations


class ReferenceBudget:
    def __init__(self, max_bytes: int | None):
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, n: int) -> bool:
        """Reserve `n` bytes; False (nothing reserved) when they do not fit."""
        if self.max_bytes is not None and self.held and self.held + n > self.max_bytes:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n
