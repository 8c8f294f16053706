"""SIGTERM while a live client is still reading a long request: its queued audio goes on
reaching it while the drain window lasts, so with a window long enough it gets every frame
and `done`; with a short one, what could not be sent by the window's end is replaced by an
explicit `cancelled` with a reason. Never silence: the close (1001) always comes after the
request's one end frame. A real `chorus serve` process (signals)."""

from __future__ import annotations

import json
import os
import signal
import time
from urllib.parse import urlsplit

import pytest

from server.wire.messages import split_audio_frame
from tests.support.raw_ws import connect_ws, masked_text_frame, read_frame
from tests.support.serverproc import ChorusServer

SAFETY_S = 120
READ_BYTES_PER_S = 768 * 1024  # the client's pace: four times real time, slower than the audio is made
REQUEST = {"type": "synthesize", "id": "long", "encoding": "f32le", "sample_rate": 48000, "progress": False,
           "text": " ".join(f"This is sentence number {i} of a long request." for i in range(20)),
           "options": {"num_step": 2, "duration": 90.0}}  # about 17 MB of audio


@pytest.fixture
def server(tiny_checkpoint, tmp_path, request):
    s = ChorusServer(tiny_checkpoint, tmp_path, "--drain-seconds", request.param).start()
    yield s
    s.stop()


def _read_through_sigterm(server: ChorusServer) -> tuple[float, list[dict], int | None]:
    """Ask for REQUEST, SIGTERM at its first audio, read at READ_BYTES_PER_S till the close:
    (audio seconds read, the request's JSON frames after `accepted`, the close code)."""
    s = connect_ws(urlsplit(server.url).port, rcvbuf=256 * 1024)
    s.sendall(masked_text_frame(json.dumps(REQUEST)))
    began, read, audio_s, frames, signalled = time.monotonic(), 0, 0.0, [], False
    while True:
        opcode, payload = read_frame(s)
        read += len(payload)
        time.sleep(max(0.0, began + read / READ_BYTES_PER_S - time.monotonic()))
        if opcode == 8:
            s.close()
            return audio_s, frames, int.from_bytes(payload[:2], "big")
        if opcode == 9:  # the server's keepalive ping: answer it, as any client does
            mask = os.urandom(4)
            s.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
            continue
        if opcode == 2:
            header, _ = split_audio_frame(payload)
            audio_s += header["samples"] / header["sample_rate"]
            if not signalled:
                server.send_signal(signal.SIGTERM)
                signalled = True
        else:
            frame = json.loads(payload)
            if frame.get("id") == "long" and frame["type"] != "accepted":
                frames.append(frame)


@pytest.mark.parametrize("server", ["120"], indirect=True)
def test_a_live_reader_gets_all_its_audio_within_the_drain_window(server):
    audio_s, frames, close = _read_through_sigterm(server)
    assert [f["type"] for f in frames] == ["done"], frames
    assert abs(audio_s - frames[0]["audio_seconds"]) < 0.01 and audio_s > 60
    assert close == 1001
    assert server.wait(timeout=SAFETY_S) == 0


@pytest.mark.parametrize("server", ["1"], indirect=True)
def test_what_the_drain_window_cannot_send_ends_with_an_explicit_cancelled(server):
    audio_s, frames, close = _read_through_sigterm(server)
    assert len(frames) == 1, frames  # one end, and before the close
    end = frames[0]
    if end["type"] == "done":  # (a machine fast enough to send it all within the window)
        assert abs(audio_s - end["audio_seconds"]) < 0.01
    else:  # the drain's own cancel, or what the window could not send: said why
        assert end["type"] == "cancelled" and end["reason"].startswith("shutdown: "), end
    assert close == 1001
    assert server.wait(timeout=SAFETY_S) == 0
    assert "Traceback" not in server.log()
