"""Limits: hostile reference audio, the voice library's caps, the command line's limit flags,
and, against a real server with small limits, each limit as a client meets it."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets
from hypothesis import HealthCheck, given, settings, strategies as st

from server.audio import files as audio_io
from server.audio.files import AudioError, AudioLimits
from server.cli.main import build_parser, config_from_args
from server.voices import LibraryFull, VoiceStore
from tests.conftest import make_reference_clip
from tests.support.chorus_client import Session, check_request


def file_bytes(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


CLIP = make_reference_clip(seconds=1.0, sample_rate=16000)
FILES = {
    "wav": file_bytes(CLIP, 16000, "WAV", "PCM_16"),
    "flac": file_bytes(CLIP, 16000, "FLAC", "PCM_16"),
    "ogg": file_bytes(CLIP, 16000, "OGG", "VORBIS"),
    "mp3": file_bytes(CLIP, 16000, "MP3", "MPEG_LAYER_III"),
}


def wav_with(rate: int | None = None, channels: int | None = None, data_bytes: int | None = None) -> bytes:
    """A valid 16-bit WAV whose header then lies about its rate, channels or length."""
    head = bytearray(FILES["wav"][:44])
    if channels is not None:
        struct.pack_into("<H", head, 22, channels)
    if rate is not None:
        struct.pack_into("<I", head, 24, rate)
    if data_bytes is not None:
        struct.pack_into("<I", head, 40, data_bytes)
    return bytes(head) + FILES["wav"][44:]


# ---- hostile audio ---------------------------------------------------------------------


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(FILES)), cut=st.floats(0.0, 1.0), flip=st.lists(st.integers(0, 10**6), max_size=4))
def test_truncated_or_corrupted_files_decode_or_are_refused_cleanly(kind, cut, flip):
    data = bytearray(FILES[kind][: int(len(FILES[kind]) * cut)])
    for position in flip:  # a few corrupted bytes too
        if data:
            data[position % len(data)] ^= 0x5A
    try:
        decoded = audio_io.decode_audio(bytes(data), "reference.audio")
    except AudioError as exc:
        message = str(exc)
        assert message.startswith("reference.audio: ") and "object at 0x" not in message and "<" not in message
        return
    assert decoded.samples.dtype == np.float32 and np.isfinite(decoded.samples).all()
    assert 0 < decoded.seconds <= audio_io.MAX_REFERENCE_SECONDS


@pytest.mark.parametrize("data, message", [
    (b"RIFF\x00\x00\x00\x00WAVEjunk" * 20, "audio: not a readable wav, flac, ogg or mp3 file"),
    (wav_with(channels=1000), "audio: 1000 channels; at most 8"),
    (wav_with(rate=1_000_000), "audio: sample rate 1000000 Hz is outside"),
    (wav_with(rate=100), "audio: sample rate 100 Hz is outside"),
    (wav_with(channels=8, rate=192000), "audio: too many samples"),
])
def test_hostile_headers_are_refused(data, message):
    with pytest.raises(AudioError) as info:
        audio_io.decode_audio(data)
    assert str(info.value).startswith(message), str(info.value)


def test_unreadable_file_message_is_stable():
    with pytest.raises(AudioError) as info:
        audio_io.decode_audio(b"garbage" * 50)
    assert str(info.value) == "audio: not a readable wav, flac, ogg or mp3 file (Format not recognised)"


def test_size_and_length_limits_come_before_decoding():
    small = AudioLimits(max_bytes=1000, max_seconds=0.5)
    with pytest.raises(AudioError, match=r"^audio: \d+ bytes, over the limit of 1000 bytes"):
        audio_io.decode_audio(FILES["wav"], limits=small)
    with pytest.raises(AudioError, match=r"^reference.audio: over the limit of 1000 bytes"):
        audio_io.decode_base64_audio(base64.b64encode(FILES["wav"]).decode(), limits=small)
    with pytest.raises(AudioError, match=r"^audio: longer than 0.5 seconds"):
        audio_io.decode_audio(FILES["wav"], limits=AudioLimits(max_seconds=0.5))
    # a header claiming less than the file holds: reading stops at the limit all the same
    long_clip = file_bytes(np.zeros(16000 * 3, np.float32), 16000, "WAV", "PCM_16")
    lying = long_clip[:40] + struct.pack("<I", 0xFFFFFFFF) + long_clip[44:]
    with pytest.raises(AudioError, match="longer than 2 seconds"):
        audio_io.decode_audio(lying, limits=AudioLimits(max_seconds=2.0))


def test_decoding_is_time_bounded(monkeypatch):
    monkeypatch.setattr(audio_io, "_BLOCK_SECONDS", 0.01)
    with pytest.raises(AudioError, match="took too long to decode"):
        audio_io.decode_audio(FILES["flac"], limits=AudioLimits(timeout_s=0.0))

    def hangs(*_):
        time.sleep(3)

    async def go():
        await audio_io.decode_in_thread(hangs, what="audio", limits=AudioLimits(timeout_s=0.1))

    with pytest.raises(AudioError, match=r"^audio: took too long to decode"):
        asyncio.run(go())


# ---- voice library caps ----------------------------------------------------------------


def test_voice_library_caps_count_and_bytes(tmp_path):
    store = VoiceStore(tmp_path / "v", max_voices=2, max_bytes=1000)
    a = store.add("a", "A.", 1.0, b"x" * 400)
    store.add("b", "B.", 1.0, b"x" * 400)
    with pytest.raises(LibraryFull, match=r"^voices: the library is full \(2 voices, the limit is 2\)"):
        store.add("c", "C.", 1.0, b"x")
    store.delete(a.id)
    with pytest.raises(LibraryFull, match=r"^voices: the library is full \(400 bytes stored, the limit is 1000\)"):
        store.add("c", "C.", 1.0, b"x" * 601)
    assert store.add("c", "C.", 1.0, b"x" * 600).name == "c"
    assert len(store.list()) == 2


# ---- the command line ------------------------------------------------------------------


def test_limit_flags_reach_the_config():
    args = build_parser().parse_args([
        "serve", "--max-frame-bytes", "64K", "--max-reference-bytes", "2M", "--max-reference-seconds", "12.5",
        "--max-voices", "7", "--max-voices-bytes", "1G", "--idle-timeout", "0", "--drain-seconds", "5",
        "--allowed-origins", "https://A.example/, http://localhost:3000", "--page-embeds-key", "--api-key", "k",
    ])
    cfg = config_from_args(args)
    assert (cfg.max_frame_bytes, cfg.max_reference_bytes, cfg.max_reference_seconds) == (65536, 2 * 1024**2, 12.5)
    assert (cfg.max_voices, cfg.max_voices_bytes, cfg.idle_timeout, cfg.drain_seconds) == (7, 1024**3, 0.0, 5.0)
    assert cfg.allowed_origins == ("https://a.example", "http://localhost:3000")
    assert cfg.page_api_key == "k" and cfg.max_body_bytes == 3 * 1024**2
    defaults = config_from_args(build_parser().parse_args(["serve"]))
    assert (defaults.max_frame_bytes, defaults.max_reference_bytes) == (16 * 1024**2, 16 * 1024**2)
    assert (defaults.idle_timeout, defaults.drain_seconds, defaults.allowed_origins) == (300.0, 30.0, ())
    assert defaults.page_api_key is None
    for bad in (["--max-frame-bytes", "lots"], ["--max-reference-seconds", "0"], ["--drain-seconds", "-1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])


# ---- a real server with small limits ---------------------------------------------------


@pytest.fixture(scope="module")
def small_server(start_inproc, tmp_path_factory):
    server = start_inproc(
        tmp_path_factory.mktemp("small"), "--max-queue", "2", "--max-frame-bytes", "256K",
        "--max-reference-bytes", "64K", "--max-reference-seconds", "1.5", "--max-voices", "1",
        "--idle-timeout", "2",
    )
    yield server
    server.stop()


def wav_b64(seconds: float) -> str:
    return base64.b64encode(file_bytes(make_reference_clip(seconds), 16000, "WAV", "PCM_16")).decode()


def test_reference_limits_on_the_websocket(small_server):
    async def go():
        s = await Session.open(small_server.ws_url)
        await s.send({"type": "synthesize", "id": "big", "text": "Hi.", "reference": {
            "audio": base64.b64encode(b"\x00" * 100_000).decode(), "text": "hi"}})
        big = await s.expect_error("invalid_request", "big")
        await s.send({"type": "synthesize", "id": "long", "text": "Hi.", "reference": {"audio": wav_b64(1.9),
                                                                                      "text": "hi"}})
        long = await s.expect_error("invalid_request", "long")
        await s.synthesize("ok", "Hi.", reference={"audio": wav_b64(1.0), "text": "A short clip."},
                           options={"num_step": 3})
        ok = (await s.collect(["ok"]))["ok"]
        await s.close()
        return big, long, ok

    big, long, ok = asyncio.run(go())
    assert big["message"] == "reference.audio: over the limit of 65536 bytes"
    assert long["message"] == "reference.audio: longer than 1.5 seconds"
    check_request(ok, num_step=3)


def test_frame_limit_is_the_flag(small_server):
    async def go():
        async with websockets.connect(small_server.ws_url, max_size=None) as ws:
            await ws.recv()
            await ws.send('{"type": "ping", "pad": "' + "x" * 300_000 + '"}')
            with pytest.raises(websockets.ConnectionClosed) as info:
                while True:
                    await ws.recv()
            return info.value.rcvd.code

    assert asyncio.run(go()) == 1009


def test_upload_limits_and_a_full_library(small_server, reference_clip):
    url = small_server.url + "/v1/voices"
    clip, sr = reference_clip
    too_long = httpx.post(url, files={"audio": ("a.wav", file_bytes(clip, sr, "WAV", "PCM_16"))},
                          data={"text": "A clip."}, timeout=60)
    assert too_long.status_code == 422 and too_long.json()["error"]["message"] == "audio: longer than 1.5 seconds"
    too_big = httpx.post(url, files={"audio": ("a.wav", b"RIFF" + b"\x00" * 70_000)}, data={"text": "x"}, timeout=60)
    assert too_big.status_code == 422 and "over the limit of 65536 bytes" in too_big.json()["error"]["message"]
    body_too_big = httpx.post(url, files={"audio": ("a.wav", b"\x00" * (2 * 1024 * 1024))}, timeout=60)
    assert body_too_big.status_code == 413

    short = file_bytes(make_reference_clip(1.0), 16000, "WAV", "PCM_16")
    first = httpx.post(url, files={"audio": ("a.wav", short)}, data={"text": "A clip."}, timeout=60)
    assert first.status_code == 201, first.text
    try:
        full = httpx.post(url, files={"audio": ("a.wav", short)}, data={"text": "A clip."}, timeout=60)
        assert full.status_code == 422
        assert full.json()["error"] == {"code": "invalid_request", "message":
                                        "voices: the library is full (1 voices, the limit is 1); delete one first"}
    finally:
        assert httpx.delete(f"{url}/{first.json()['id']}", timeout=30).status_code == 204


def test_full_queue_is_busy_with_retry_after(small_server):
    heavy = {"options": {"num_step": 64, "duration": 20.0}}

    async def go():
        s = await Session.open(small_server.ws_url)
        await s.occupy(["h1", "h2"], "Hello there.", **heavy)
        await s.send({"type": "synthesize", "id": "h3", "text": "No room."})
        busy = await s.expect_error("busy", "h3")
        async with httpx.AsyncClient(timeout=60) as http:
            speech = await http.post(small_server.url + "/v1/audio/speech", json={"input": "No room."})
        for rid in ("h1", "h2"):
            await s.send({"type": "cancel", "id": rid})
        ends = await s.collect(["h1", "h2"])
        await s.close()
        return busy, speech, ends

    busy, speech, ends = asyncio.run(go())
    assert busy["message"] == "the server has 2 requests queued; try again later"
    assert speech.status_code == 503 and speech.headers["retry-after"] == "1"
    assert speech.json()["error"]["code"] == "busy"
    assert {o.end["type"] for o in ends.values()} == {"cancelled"}


def test_idle_connections_are_closed_and_pings_or_work_keep_them(small_server):
    async def idle() -> int:
        async with websockets.connect(small_server.ws_url) as ws:
            await ws.recv()  # ready
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), timeout=120)
            return info.value.rcvd.code

    async def pinging() -> bool:
        s = await Session.open(small_server.ws_url)
        for _ in range(10):  # 5 s, over twice the timeout, a ping every 0.5 s
            await s.send({"type": "ping"})
            assert await s.next_frame() == {"type": "pong"}
            await asyncio.sleep(0.5)
        # a request in flight longer than the timeout, no frame sent meanwhile
        await s.synthesize("w", "Hello there. " * 6, options={"num_step": 64, "duration": 12.0}, progress=False)
        out = (await s.collect(["w"]))["w"]
        await s.close()
        return out.end["type"] == "done"

    async def both():
        return await asyncio.gather(idle(), pinging())

    code, kept = asyncio.run(both())
    assert code == 1000 and kept
