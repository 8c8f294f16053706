"""A client that reads its audio at least as fast as it plays is never taken for one that does
not read: a 48 kHz `f32le` request queues megabytes ahead of playback, far past a small
`--max-outbox-bytes`, and a client reading at twice real time gets all of it and `done`.
A client that reads slower than it plays, past the same limit, is still given up (1008)."""

from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

import pytest

from server.wire.messages import split_audio_frame
from tests.support.raw_ws import connect_ws, masked_text_frame, read_frame

SAFETY_S = 120
RATE = 48000
REQUEST = {"type": "synthesize", "id": "r", "encoding": "f32le", "sample_rate": RATE, "progress": False,
           "text": " ".join(f"Sentence number {i}." for i in range(12)),
           "options": {"num_step": 2, "duration": 24.0, "chunk_threshold": 0, "chunk_seconds": 2}}


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    # a frame holds a few seconds of audio: a paced reader takes nothing while it plays one,
    # for less than --send-timeout
    s = start_inproc(tmp_path_factory.mktemp("outbox"), "--max-outbox-bytes", "1M", "--send-timeout", "5")
    yield s
    s.stop()


def _read_paced(server, speed: float) -> tuple[float, dict | None, int | None]:
    """Ask for REQUEST and read it at `speed` x real time: (audio seconds read, its end frame,
    the close code when the server closed first)."""
    s = connect_ws(urlsplit(server.url).port, rcvbuf=64 * 1024)
    s.sendall(masked_text_frame(json.dumps(REQUEST)))
    began, audio_s = time.monotonic(), 0.0
    while True:
        try:
            opcode, payload = read_frame(s)
        except (ConnectionError, OSError):  # dropped without a close frame
            s.close()
            return audio_s, None, 1006
        if opcode == 8:  # close
            s.close()
            return audio_s, None, int.from_bytes(payload[:2], "big")
        if opcode == 2:
            header, _ = split_audio_frame(payload)
            audio_s += header["samples"] / header["sample_rate"]
            time.sleep(max(0.0, began + audio_s / speed - time.monotonic()))  # read no faster than `speed`
            continue
        frame = json.loads(payload)
        if frame.get("id") == "r" and frame["type"] in ("done", "cancelled", "error"):
            s.close()
            return audio_s, frame, None


def test_a_reader_at_twice_real_time_gets_all_its_audio(server):
    audio_s, end, close = _read_paced(server, speed=2.0)
    assert close is None and end is not None and end["type"] == "done", (audio_s, end, close)
    assert abs(audio_s - end["audio_seconds"]) < 0.01 and audio_s > 20
    assert "does not read what it is sent" not in server.log()


def test_a_reader_slower_than_real_time_is_still_given_up(server):
    audio_s, end, close = _read_paced(server, speed=0.5)
    assert close in (1008, 1006) and end is None, (audio_s, end, close)  # closed, or dropped
    assert "does not read what it is sent" in server.log() or "took nothing we sent" in server.log()
