"""The capacity curve's arithmetic: the voice agent's first-sentence piece, its playback clock,
and the capacity fraction read from the levels; a level's turns summed up (served, refused
`busy` and retried, late) and the summary's voiced and burst keys; and voice agents (each a
`chorus_client` client) speaking against a real server, in the chained voice and in a
built-in one, in a level that ramps and in a burst."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.agents import PIECE_CHARS, PlaybackClock, VoiceTurn, first_sentence_piece, voice_agent_answer
from bench.capacity import (
    _agents_share,
    agent_level,
    build_parser,
    burst_passed,
    capacity_fraction,
    level_report,
    summary,
)


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


@pytest.mark.parametrize("voice", [None, "alloy"], ids=["chained", "alloy"])
def test_a_voice_agent_speaks_through_the_client_and_is_timed(chorus_server, voice):
    """The capacity curve's agent share as it runs a level, for one agent and one turn or two,
    in the chained voice and in a built-in one: each turn ends `done`, its first audio is timed
    after the first sentence went out, its audio is what the frames' offsets span, and any
    stall is a positive lateness; nothing was refused, so nothing was retried."""
    turns = _agents_share(chorus_server.ws_url, [0], seed=1, until=time.perf_counter() + 3.0, starts=[0.0],
                          options={"num_step": 2}, voice=voice)
    assert turns and all(t["outcome"] == "done" for t in turns)
    for t in turns:
        assert t["first_sentence_at"] is not None and t["first_audio_at"] > t["first_sentence_at"]
        assert t["first_audio_ms"] == pytest.approx((t["first_audio_at"] - t["first_sentence_at"]) * 1000)
        assert t["served_first_audio_ms"] == pytest.approx(t["first_audio_ms"])
        assert t["busy_retries"] == 0 and t["sent_at"] <= t["first_sentence_at"]
        assert t["audio_seconds"] > 0 and all(u > 0 for u in t["underruns"])


def _turn(outcome="done", first_ms=100.0, served_ms=None, underruns=(), retries=0, waited=0.0, audio=2.0) -> dict:
    return {"started_at": 0.0, "outcome": outcome, "first_audio_ms": first_ms,
            "served_first_audio_ms": first_ms if served_ms is None else served_ms, "underruns": list(underruns),
            "audio_seconds": audio, "busy_retries": retries, "busy_waited_s": waited}


def test_a_served_turns_first_audio_runs_from_the_attempt_the_server_took():
    turn = VoiceTurn(started_at=0.0, first_sentence_at=1.0, first_audio_at=1.9, sent_at=0.2)
    assert turn.first_audio_ms == pytest.approx(900) and turn.served_first_audio_ms == pytest.approx(900)
    turn.busy_retries, turn.sent_at = 1, 1.7  # refused, sent again 0.7 s after its first sentence
    assert turn.first_audio_ms == pytest.approx(900) and turn.served_first_audio_ms == pytest.approx(200)


def test_a_level_counts_turns_served_refused_retried_and_late():
    turns = [_turn(first_ms=100), _turn(first_ms=120, underruns=[0.3]),
             _turn(first_ms=900, served_ms=150, retries=2, waited=0.7),  # refused twice, then served
             _turn(outcome="error:busy", first_ms=None, retries=3, waited=9.0),  # refused until the client gave up
             _turn(outcome="error:internal", first_ms=None, audio=0.0)]
    level = level_report(turns, agents=5, seconds=10.0, p95_ms=250)
    assert level["turns"] == 5 and level["turns_served"] == 3 and level["turns_failed"] == 2
    assert level["busy_turns"] == 2 and level["busy_retries"] == 5 and level["busy_failed_turns"] == 1
    assert level["busy_waited_s"] == pytest.approx(9.7)
    assert level["turns_with_underrun"] == 1 and level["worst_late_s"] == 0.3
    assert level["first_audio_ms"]["max"] == 900 and level["served_first_audio_ms"]["max"] == 150
    assert level["outcomes"] == {"done": 3, "error:busy": 1, "error:internal": 1}
    assert level["audio_s_per_s"] == pytest.approx(0.8) and not level["passed"]
    assert not burst_passed(level, 250)  # a served turn was late
    on_time = level_report([t for t in turns if not t["underruns"]], agents=4, seconds=10.0, p95_ms=250)
    assert burst_passed(on_time, 250)  # refusals are the admission's answer, not a broken promise
    assert not burst_passed(on_time, 140)
    assert level_report([_turn(), _turn(first_ms=200)], agents=2, seconds=5.0, p95_ms=250)["passed"]


def _level(fraction: float, passed: bool, agents: int, **extra) -> dict:
    return {"fraction": fraction, "agents": {"agents": agents, "passed": passed, **extra}}


def test_the_summary_reports_the_capacity_both_ways_and_each_burst():
    burst = level_report([_turn(first_ms=100), _turn(first_ms=700, served_ms=180, retries=1, waited=0.5),
                          _turn(outcome="error:busy", first_ms=None, retries=4, waited=9.5)],
                         agents=3, seconds=12.0, p95_ms=250)
    result = {"throughput": {"audio_s_per_s": 270.0},
              "levels": [_level(0.4, True, 108), _level(0.6, True, 162), _level(0.8, False, 216)],
              "voiced": {"voice": "alloy", "levels": [_level(0.4, True, 108), _level(0.6, False, 162)]},
              "bursts": [{"fraction": 0.6, "voice": None, "agents": burst, "passed": True},
                         {"fraction": 0.6, "voice": "alloy", "agents": burst, "passed": False}]}
    out = summary(result, "H200", "abc")
    assert out["realtime_capacity_fraction"] == 0.6 and out["agents_at_250ms"] == 162
    assert out["realtime_capacity_fraction_voiced"] == 0.4 and out["agents_at_250ms_voiced"] == 108
    assert out["voice"] == "alloy" and out["throughput_audio_s_per_s"] == 270.0
    assert out["burst_0_6_turns_served"] == 2 and out["burst_0_6_busy_turns"] == 2
    assert out["burst_0_6_busy_retries"] == 5 and out["burst_0_6_busy_failed_turns"] == 1
    assert out["burst_0_6_underrun_turns"] == 0 and out["burst_0_6_passed"] is True
    assert out["burst_0_6_p95_first_audio_ms"] <= 180 < out["burst_0_6_p95_first_audio_ms_as_heard"]
    assert out["burst_0_6_voiced_passed"] is False and out["burst_0_6_voiced_agents"] == 3
    assert list(out)[-2:] == ["gpu", "commit"]

    plain = summary({"throughput": {"audio_s_per_s": 270.0}, "levels": [_level(0.6, True, 162)]}, None, None)
    assert plain["realtime_capacity_fraction"] == 0.6 and plain["realtime_capacity_fraction_voiced"] is None
    assert plain["agents_at_250ms_voiced"] is None and not any(k.startswith("burst_") for k in plain)


def test_the_voice_and_burst_flags():
    args = build_parser().parse_args(["--fractions", "0.6,0.4", "--voice", "alloy", "--burst-fractions", "0.6"])
    assert args.fractions == [0.4, 0.6] and args.voice == "alloy" and args.voice_fractions is None
    assert args.burst_fractions == [0.6] and args.burst_seconds == 2.0
    args = build_parser().parse_args(["--fractions", "none", "--burst-fractions", "0.6,0.8"])
    assert args.fractions == [] and args.voice is None and args.burst_fractions == [0.6, 0.8]
    assert build_parser().parse_args([]).burst_fractions == []


def test_a_burst_counts_every_turn_from_the_first_join_and_a_ramp_only_those_after_it(chorus_server):
    """Two agents joining within half a second: the burst level counts their first turns (the
    burst is what it measures); the same agents ramped over as long count only the turns that
    start once all have joined."""
    args = argparse.Namespace(ramp_seconds=0.5, burst_seconds=0.5, level_seconds=1.5, client_processes=2,
                              seed=1, p95_ms=60000.0)
    options = {"num_step": 2}

    async def both():
        with ThreadPoolExecutor(2) as pool:
            burst = await agent_level(chorus_server.ws_url, 2, args, options, pool, burst=True)
            ramp = await agent_level(chorus_server.ws_url, 2, args, options, pool)
        return burst, ramp

    burst, ramp = asyncio.run(both())
    assert burst["burst"] and burst["join_seconds"] == 0.5 and burst["seconds"] == pytest.approx(2.0)
    assert burst["turns"] >= 2 and burst["turns_served"] == burst["turns"] and burst["busy_turns"] == 0
    assert not ramp["burst"] and ramp["seconds"] == pytest.approx(1.5)
    assert ramp["turns"] < burst["turns"]  # the agents' first turns began during the ramp
