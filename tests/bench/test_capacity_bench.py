"""The capacity curve's arithmetic: the voice agent's first-sentence piece, its playback clock,
and the capacity fraction read from the levels; and one voice agent (a `chorus_client`
client) speaking against a real server."""

from __future__ import annotations

import random
import time

import pytest

from bench.agents import PIECE_CHARS, PlaybackClock, first_sentence_piece, voice_agent_answer
from bench.capacity import _agents_share, capacity_fraction


def test_the_first_sentence_is_complete_at_the_whitespace_after_its_mark():
    pieces = ["Sure", "! Th", "at i", "s it."]
    assert first_sentence_piece(pieces) == 1
    assert first_sentence_piece(["Yes.", " No."]) == 1  # the mark ends a piece: the space comes next
    assert first_sentence_piece(["One sentence."]) is None  # only the close completes it


def test_answers_have_two_to_four_sentences_of_seven_to_eighteen_words():
    rng = random.Random(5)
    for _ in range(50):
        text = voice_agent_answer(rng)
        sentences = [s for s in text.replace("!", ".").replace("?", ".").split(". ") if s]
        assert 2 <= len(sentences) <= 4
        for s in sentences:
            assert 7 <= len(s.rstrip(".").split()) <= 18
        pieces = [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]
        assert "".join(pieces) == text and first_sentence_piece(pieces) is not None


def test_playback_stalls_once_per_late_frame_and_resumes_from_it():
    clock = PlaybackClock()
    assert clock.arrive(10.0, 0, 24000) == 0.0  # the first frame starts playback
    assert clock.arrive(10.5, 24000, 24000) == 0.0  # due at 11.0: early
    assert clock.arrive(12.25, 48000, 24000) == pytest.approx(0.25)  # due at 12.0
    assert clock.arrive(13.2, 72000, 24000) == 0.0  # the clock moved with the stall: due at 13.25
    assert clock.ends_at(96000, 24000) == pytest.approx(14.25)


def test_the_capacity_is_the_highest_level_up_to_which_every_level_passed():
    levels = [{"fraction": f, "agents": {"passed": ok}} for f, ok in ((0.1, True), (0.2, True), (0.3, False),
                                                                      (0.4, True))]
    assert capacity_fraction(levels) == 0.2
    assert capacity_fraction(levels[2:]) is None


def test_a_voice_agent_speaks_through_the_client_and_is_timed(chorus_server):
    """The capacity curve's agent share as it runs a level, for one agent and one turn or two:
    each turn ends `done`, its first audio is timed after the first sentence went out, its
    audio is what the frames' offsets span, and any stall is a positive lateness."""
    turns = _agents_share(chorus_server.ws_url, [0], seed=1, until=time.perf_counter() + 3.0, starts=[0.0],
                          options={"num_step": 2})
    assert turns and all(t["outcome"] == "done" for t in turns)
    for t in turns:
        assert t["first_sentence_at"] is not None and t["first_audio_at"] > t["first_sentence_at"]
        assert t["first_audio_ms"] == pytest.approx((t["first_audio_at"] - t["first_sentence_at"]) * 1000)
        assert t["audio_seconds"] > 0 and all(u > 0 for u in t["underruns"])
