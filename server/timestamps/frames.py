"""The `words` frame: a chunk's (a stream's segment's) words with their sample spans."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

TimestampKind = Literal["word", "char"]
Source = Literal["model", "aligned"]


class Span(Struct, array_like=False):
    text: str
    start_samples: int
    end_samples: int


class WordsMsg(Struct, tag="words", tag_field="type", omit_defaults=True):
    id: str
    source: Source
    words: list[Span]
    segment: int | None = None  # streams only
    line: int | None = None  # dialogues only
    chars: list[Span] | None = None  # with `"timestamps": "char"`
