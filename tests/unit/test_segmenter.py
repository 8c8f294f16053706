"""The text-stream segmenter: sentences and clauses cut as text arrives, in English and Chinese;
numbers, abbreviations and initials do not end a sentence; whatever the pieces' sizes, the
segments are the same."""

from __future__ import annotations

import random
from itertools import chain

import pytest

from server.streaming.segmenter import Segmenter, weight


def segments_of(pieces: list[str], **kwargs) -> tuple[list[str], list[str]]:
    """(segments released while feeding, segments the final flush releases)."""
    seg = Segmenter(**kwargs)
    out: list[str] = []
    for piece in pieces:
        out += seg.feed(piece)
    return out, seg.flush()


def split_randomly(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        pieces.append(text[i : i + n])
        i += n
    return pieces


ENGLISH = [
    ("Hello there. How are you? I'm fine!", ["Hello there.", "How are you?", "I'm fine!"]),
    ("Dr. Smith paid $3.50 for it. Then he left.", ["Dr. Smith paid $3.50 for it.", "Then he left."]),
    ("Version 2.0.1 ships today. See example.com for more.", ["Version 2.0.1 ships today.",
                                                            "See example.com for more."]),
    ("Mr. and Mrs. J. K. Rowling met at St. Paul's. Lovely.", ["Mr. and Mrs. J. K. Rowling met at St. Paul's.",
                                                              "Lovely."]),
    ("Fruit, e.g. apples, i.e. the red ones. Yes.", ["Fruit, e.g. apples, i.e. the red ones.", "Yes."]),
    ("Meet at 5 p.m. today. Or at 3 p.m. Shall we?", ["Meet at 5 p.m. today.", "Or at 3 p.m.", "Shall we?"]),
    ('He said "stop." She did. (Really!) Wow...', ['He said "stop."', "She did.", "(Really!)", "Wow..."]),
    ("Wait... what?! No way.", ["Wait...", "what?!", "No way."]),
    ("First line\nsecond line", ["First line", "second line"]),
    ("Pi is about 3.14159. It never ends", ["Pi is about 3.14159.", "It never ends"]),
]
CHINESE = [
    ("你好。今天天气很好！我们去公园吧？好的", ["你好。", "今天天气很好！", "我们去公园吧？", "好的"]),
    ("价格是3.5元。“真的吗？”他问。", ["价格是3.5元。", "“真的吗？”", "他问。"]),
    ("第一；第二；结束", ["第一；", "第二；", "结束"]),
]


@pytest.mark.parametrize("text,expected", ENGLISH + CHINESE)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segments_do_not_depend_on_how_the_text_is_cut(text, expected, seed):
    released, rest = segments_of(split_randomly(text, seed))
    assert released + rest == expected
    whole, whole_rest = segments_of([text])
    assert whole + whole_rest == expected


def test_a_sentence_is_released_as_soon_as_the_next_character_shows_it_ended():
    seg = Segmenter()
    assert seg.feed("Hello the") == [] and seg.feed("re") == [] and seg.feed(".") == []
    assert seg.feed(" ") == ["Hello there."]
    assert seg.buffered == 0
    assert seg.feed("Dr") == [] and seg.feed(". ") == []  # "Dr." is no end: a name follows
    assert seg.feed("Who") == [] and seg.feed(" came.") == [] and seg.feed(" It") == ["Dr. Who came."]
    assert seg.feed(" costs 3.") == [] and seg.feed("5 now.") == [] and seg.feed("\n") == ["It costs 3.5 now."]
    assert seg.feed("你好。") == [] and seg.feed("我") == ["你好。"]  # CJK: no space needed
    assert seg.feed("很好！”") == [] and seg.feed("他") == ["我很好！”"]  # the closing quote stays


def test_flush_releases_what_is_buffered():
    seg = Segmenter()
    assert seg.feed("Half a sent") == []
    assert seg.buffered == len("Half a sent")
    assert seg.flush() == ["Half a sent"] and seg.buffered == 0
    assert seg.flush() == []


def test_pieces_with_nothing_to_say_join_the_next_segment():
    seg = Segmenter()
    assert seg.feed("Yes.\n") == ["Yes."]
    assert seg.feed('"\n') == []  # a stray closing quote on its own line
    assert seg.feed("Next one.\n") == ['" Next one.']
    assert seg.feed(" ... ") == [] and seg.flush() == []


def test_a_long_sentence_is_cut_at_clauses():
    clause = "this clause has quite a few words in it"
    text = ", ".join([clause] * 12) + "."
    released, rest = segments_of(split_randomly(text, 3))
    segments = released + rest
    assert len(segments) > 1 and " ".join(segments) == text
    assert all(s.endswith((",", ".")) for s in segments)
    assert all(weight(s) <= 300 for s in segments)
    assert all(weight(s) <= 150 for s in segments[:-1])


def test_a_long_chinese_sentence_is_cut_at_its_commas():
    text = "这是一个很长的句子，" * 12 + "结束。"
    released, rest = segments_of(list(text))
    segments = released + rest
    assert "".join(segments) == text and len(segments) > 2
    assert all(s.endswith(("，", "。")) for s in segments)
    assert all(weight(s) <= 150 for s in segments[:-1])


def test_text_without_marks_is_cut_at_spaces_or_anywhere():
    words = " ".join(f"word{i}" for i in range(100))
    segments = list(chain.from_iterable(segments_of([words])))
    assert " ".join(segments) == words and all(weight(s) <= 300 for s in segments)
    assert all(not s.startswith(" ") and not s.endswith(" ") for s in segments)
    cjk = "字" * 250
    segments = list(chain.from_iterable(segments_of([cjk])))
    assert "".join(segments) == cjk and all(weight(s) <= 300 for s in segments)
