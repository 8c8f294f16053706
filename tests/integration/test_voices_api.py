"""The voice library over HTTP against a real server: upload, use, list, restart, delete.
The restart is of the process: a voice added through one server is served, from disk, by a
`chorus serve` process started afterwards on the same folder."""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.conftest import make_reference_clip
from tests.support.chorus_client import Session, check_request
from tests.support.serverproc import ChorusServer

TEXT = "A voice for the library."


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    server = start_inproc(tmp_path_factory.mktemp("voices-server"))
    yield server
    server.stop()


def audio_file(fmt: str, subtype: str | None = None, seconds: float = 2.0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(seconds), 16000, format=fmt, subtype=subtype)
    return buf.getvalue()


def upload(url: str, data: bytes, filename: str = "clip.wav", **fields) -> httpx.Response:
    return httpx.post(url + "/v1/voices", files={"audio": (filename, data, "application/octet-stream")},
                      data=fields, timeout=120)


def synthesize_with(url: str, voice: str) -> dict:
    async def go():
        s = await Session.open(url)
        await s.synthesize("v", "Spoken in the stored voice.", voice=voice, options={"num_step": 6, "seed": 5})
        out = await s.collect()
        await s.close()
        return out["v"]

    return asyncio.run(go())


def test_upload_use_list_restart_delete(start_inproc, tiny_checkpoint, tmp_path):
    server = start_inproc(tmp_path)
    try:
        vid, voice, first = uploaded_and_used(server)
    finally:
        server.stop()
    process = ChorusServer(tiny_checkpoint, tmp_path).start()  # the same voices folder, a fresh process
    try:
        restarted(process, vid, voice, first)
    finally:
        process.stop()


def uploaded_and_used(server) -> tuple[str, dict, object]:
    r = upload(server.url, audio_file("WAV", "PCM_16"), text=TEXT, name="Ada L.")
    assert r.status_code == 201, r.text
    voice = r.json()
    assert set(voice) == {"id", "name", "text", "seconds", "created_at", "builtin", "kept", "expires_at"}
    assert voice["builtin"] is False and voice["kept"] is False and voice["expires_at"] is None
    assert voice["id"].startswith("ada-l-") and voice["name"] == "Ada L." and voice["text"] == TEXT
    assert 0 < voice["seconds"] <= 2.0
    vid = voice["id"]

    first = synthesize_with(server.ws_url, vid)
    check_request(first, num_step=6)
    assert httpx.get(server.url + f"/v1/voices/{vid}").json() == voice
    assert voice in httpx.get(server.url + "/v1/voices").json()["voices"]
    return vid, voice, first


def restarted(server: ChorusServer, vid: str, voice: dict, first) -> None:
    assert httpx.get(server.url + f"/v1/voices/{vid}").json() == voice
    again = synthesize_with(server.ws_url, vid)
    assert again.payload == first.payload  # the stored tokens, not a re-encode

    r = httpx.delete(server.url + f"/v1/voices/{vid}")
    assert r.status_code == 204 and r.content == b""
    r = httpx.get(server.url + f"/v1/voices/{vid}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "voice_not_found"
    assert httpx.delete(server.url + f"/v1/voices/{vid}").status_code == 404
    assert vid not in {v["id"] for v in httpx.get(server.url + "/v1/voices").json()["voices"]}
    gone = synthesize_with(server.ws_url, vid)
    assert gone.end["code"] == "voice_not_found"


@pytest.mark.parametrize("fmt, subtype, filename", [("FLAC", "PCM_16", "a.flac"), ("OGG", "VORBIS", "a.ogg"),
                                                    ("MP3", "MPEG_LAYER_III", "a.mp3")])
def test_other_upload_formats(server, fmt, subtype, filename):
    r = upload(server.url, audio_file(fmt, subtype), filename, text=TEXT)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == r.json()["id"] and r.json()["id"].startswith("voice-")


def test_upload_errors(server):
    url = server.url
    cases = [
        (upload(url, audio_file("WAV", "PCM_16")), 422, "invalid_request", "text: a transcript is required"),
        (upload(url, b"definitely not audio" * 20, text=TEXT), 415, "invalid_request", "audio: not a readable"),
        (upload(url, b"", text=TEXT), 422, "invalid_request", "audio: empty file"),
        (upload(url, audio_file("WAV", "PCM_16"), text=TEXT, name=" "), 422, "invalid_request", "name: must be"),
        (upload(url, np.zeros(16000, np.float32).tobytes(), text=TEXT), 415, "invalid_request", "audio: "),
        (httpx.post(url + "/v1/voices", data={"text": TEXT}, files={"other": ("x", b"x")}), 422,
         "invalid_request", "audio: required"),
        (httpx.post(url + "/v1/voices", json={"text": TEXT}), 415, "invalid_request", "send multipart/form-data"),
    ]
    for r, status, code, message in cases:
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == code and error["message"].startswith(message), error


def test_ids_cannot_escape_the_folder(server):
    (server.voices_dir / "secret.npz").write_bytes(b"outside the tokens folder")
    for path in ["..%2Fsecret", "..%2F..%2Findex", "%2E%2E", "secret", "tokens%2F..%2Fsecret"]:
        r = httpx.get(server.url + f"/v1/voices/{path}")
        assert r.status_code == 404, (path, r.text)
        assert httpx.delete(server.url + f"/v1/voices/{path}").status_code == 404
    assert (server.voices_dir / "secret.npz").exists() and (server.voices_dir / "index.sqlite3").exists()


def test_corrupt_stored_voice_fails_that_request_alone(server):
    r = upload(server.url, audio_file("WAV", "PCM_16", seconds=1.5), text=TEXT, name="broken")
    vid = r.json()["id"]
    (server.voices_dir / "tokens" / f"{vid}.npz").write_bytes(b"corrupted on disk")

    async def go():
        s = await Session.open(server.ws_url)
        await s.synthesize("ok", "Fine request.", options={"num_step": 4})
        await s.synthesize("bad", "Uses the broken voice.", voice=vid)
        out = await s.collect()
        await s.close()
        return out

    out = asyncio.run(go())
    assert out["bad"].end["code"] == "internal"
    check_request(out["ok"], num_step=4)
    r = httpx.post(server.url + "/v1/audio/speech", json={"input": "hi", "voice": vid}, timeout=60)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
