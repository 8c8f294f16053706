"""The promises' metrics: a stream's playback clock and its underruns (a stand-in clock), and
first audio by kind, underruns and the headroom on a real server's /metrics.

The clock starts with the stream's first frame; a frame sent after its offset is due is one
underrun with its lateness, and the clock then waits for it (a player resumes where it
stalled), so the frames after a late one are judged from there.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from server.metrics import Metrics
from server.streaming import playback as playback_module
from server.streaming.pieces import Segment
from server.streaming.playback import PlaybackClock, StreamPlayback
from server.turns.events import TurnAudio
from server.wire import messages as p
from tests.support.chorus_client import Session, metric_value

RATE = 24000


def test_the_clock_counts_each_stall_once():
    clock = PlaybackClock()
    assert clock.due(1.0) is None
    assert clock.sent(0.0, now=10.0) == 0.0  # the first frame starts playback
    assert clock.due(2.0) == 12.0
    assert clock.sent(2.0, now=11.5) == 0.0  # early: on time
    assert clock.sent(4.0, now=14.5) == pytest.approx(0.5)  # half a second late: the player stalls
    assert clock.due(6.0) == pytest.approx(16.5)  # and resumes from there
    assert clock.sent(6.0, now=16.4) == 0.0
    assert (clock.underruns, clock.late_seconds) == (1, pytest.approx(0.5))


def test_a_late_segment_is_an_underrun_on_metrics(monkeypatch):
    """Two segments of 1 s each through the stream's audio out, the second sent 0.3 s after
    playback reached it: one underrun of 0.3 s in the registry."""
    now = [100.0]
    monkeypatch.setattr(playback_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    metrics = Metrics()
    sent: list[bytes] = []

    async def play() -> StreamPlayback:
        out = StreamPlayback("s1", "pcm_s16le", None, RATE, lambda msg: None, lambda data, s: sent.append(data),
                             metrics.stream_late)
        segments = [Segment(0, "One.", turn=None), Segment(1, "Two.", turn=None)]  # type: ignore[arg-type]
        second = np.zeros(RATE, dtype=np.float32)
        out.audio(segments, segments[1], TurnAudio(0, second, RATE, True))  # held: not the head
        await out.drained()
        assert not sent
        out.audio(segments, segments[0], TurnAudio(0, np.zeros(RATE, dtype=np.float32), RATE, True))
        await out.drained()
        segments[0].finished = True
        now[0] = 101.3  # playback reached the second segment at 101.0
        out.advance(segments)
        await out.drained()
        out.stop(segments)
        return out

    out = asyncio.run(play())
    headers = [p.split_audio_frame(frame)[0] for frame in sent]
    assert [(h["segment"], h["offset_samples"]) for h in headers] == [(0, 0), (1, RATE)]
    assert out.clock.underruns == 1
    assert metrics.registry.get_sample_value("chorus_stream_underruns_total") == 1.0
    assert metrics.registry.get_sample_value("chorus_stream_late_seconds_total") == pytest.approx(0.3)


def test_first_audio_by_kind_on_a_real_server(chorus_server):
    def count(kind: str) -> float:
        return metric_value(chorus_server.url, "chorus_first_audio_seconds_count", kind=kind)

    before = {kind: count(kind) for kind in ("line", "stream_first", "stream_later")}

    async def main():
        s = await Session.open(chorus_server.ws_url)
        await s.synthesize("l1", "A line of text.", options={"num_step": 4})
        await s.send({"type": "stream_open", "id": "s1", "options": {"num_step": 4}})
        await s.send({"type": "stream_append", "id": "s1", "text": "First sentence here. And a second one."})
        await s.send({"type": "stream_close", "id": "s1"})
        out = await s.collect(["l1", "s1"])
        await s.close()
        return out

    out = asyncio.run(asyncio.wait_for(main(), 180))
    assert out["l1"].end["type"] == "done" and out["s1"].end["type"] == "done"
    chorus_server.wait_for(lambda: count("line") > before["line"], "the line's first audio counted")
    assert count("stream_first") == before["stream_first"] + 1
    assert count("stream_later") == before["stream_later"] + 1
    assert -10.0 <= metric_value(chorus_server.url, "chorus_realtime_headroom") <= 1.0
    text = httpx.get(chorus_server.url + "/metrics").text
    assert "chorus_stream_underruns_total" in text and "chorus_stream_late_seconds_total" in text
