"""Chunking by positions gives the reference's `chunk_text_punctuation` chunks exactly."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from bench.mixes import long_paragraph, make_text
from server.engine.planning.text_chunks import chunk_text_punctuation, sentence_spans
from server.engine.upstream_names import (
    ABBREVIATIONS,
    CLOSING_MARKS,
    SPLIT_PUNCTUATION,
    chunk_text_punctuation as reference_chunks,
)
from tests.engine.test_packed_len_bound import TEXTS

CURATED = [
    "",
    " ",
    ".",
    "...",
    "\"Hello.\" she said. 'Fine,' he said!",
    "Dr. Smith met Mr. Jones at 3.5 p.m. on Jan. 5, e.g. today. Then vs. them etc. done.",
    "Mr.Smith. No. 5 is fine.No.",
    "  leading spaces. trailing spaces.   ",
    ".,;:!? starts with marks. ”) closers first.",
    "你好，世界。今天天气很好（真的），我们去公园散步吧！好吗？」】》",
    "Tabs\tand\nline\u3000breaks.\u00a0Non-breaking.\u2028Separators. Done",
    "One sentence without an end",
    "A.B.C. i.e. e.g. Etc. approx. fig. def. Sept. St. Mt. Ft. Rd.",
    "\"\"\"''' ”’ ) ] 》 > 」 】",
    "Ends with a closer.\"",
    "x" * 50 + ". " + "y" * 3 + ". " + "z" * 80 + ".",
    *TEXTS,
]

ALPHABET = (sorted(SPLIT_PUNCTUATION | CLOSING_MARKS) + list("abcXYZ 你好…") + [" ", " ", "\t", "\n", "\u3000",
            "\u00a0", "\u2028"])


def _same(text: str, chunk_len: int, min_chunk_len: int | None) -> None:
    got = chunk_text_punctuation(text, chunk_len, min_chunk_len)
    assert got == reference_chunks(text, chunk_len, min_chunk_len), (chunk_len, min_chunk_len)


@pytest.mark.parametrize("text", CURATED)
def test_curated_texts_chunk_as_the_reference_does(text):
    for chunk_len in (0, 1, 3, 10, 40, 200, 10_000):
        for min_chunk_len in (None, 0, 1, 3, 12):
            _same(text, chunk_len, min_chunk_len)


def test_the_bench_paragraphs_chunk_as_the_reference_does():
    for seed in range(20):
        text = long_paragraph(seed, 60.0) if seed % 2 else make_text(random.Random(seed), 20.0)
        for chunk_len in (50, 150, 284, 600):
            _same(text, chunk_len, 3)


@st.composite
def _texts(draw) -> str:
    """Characters from an alphabet rich in marks and spaces, with abbreviations dropped in."""
    pieces = draw(st.lists(st.one_of(st.text(alphabet=ALPHABET, max_size=12),
                                     st.sampled_from(sorted(ABBREVIATIONS))), max_size=40))
    return "".join(pieces)


@settings(max_examples=400, deadline=None)
@given(text=_texts(), chunk_len=st.integers(-1, 120), min_chunk_len=st.one_of(st.none(), st.integers(0, 20)))
def test_random_texts_chunk_as_the_reference_does(text, chunk_len, min_chunk_len):
    _same(text, chunk_len, min_chunk_len)


@settings(max_examples=200, deadline=None)
@given(text=_texts())
def test_sentences_are_consecutive_runs_of_the_text(text):
    spans = sentence_spans(text)
    assert [start for start, _ in spans] == [0, *(end for _, end in spans)][: len(spans)]
    assert (spans[-1][1] if spans else 0) == len(text)
    assert all(start < end for start, end in spans)
