"""Voices that must stop working, and kept voices that belong to someone, through real servers:
a voice deleted on one replica is unusable on another within `--voice-cache-seconds`, a kept
voice past its time-to-live or evicted by the cap is unusable at once even if it was just used,
and a kept voice is listed, used and deleted by the API key that kept it alone, within its
owner's cap. Before these fixes a deleted voice still spoke on a replica that had used it, and
any client listed, used and deleted every kept voice (and one client evicted everyone's)."""

from __future__ import annotations

import asyncio
import io
import time

import httpx
import pytest
import soundfile as sf

from tests.conftest import make_reference_clip
from tests.support.chorus_client import request_once

FAST = {"num_step": 2, "seed": 9}
CACHE_S = 2.0  # --voice-cache-seconds' default


def _clip() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(1.0), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _speak(server, voice: str, key: str | None = None) -> dict:
    url = server.ws_url + (f"?api_key={key}" if key else "")
    return asyncio.run(request_once(url, "r", "Spoken in that voice.", voice=voice, options=FAST)).end


def _keep(server, key: str | None = None) -> str:
    url = server.ws_url + (f"?api_key={key}" if key else "")
    end = asyncio.run(request_once(url, "k", "A voice to keep.", keep_voice=True, options=FAST)).end
    assert end["type"] == "done", end
    return end["voice_id"]


def _http(key: str | None) -> httpx.Client:
    return httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=120)


def test_a_voice_deleted_on_one_replica_stops_on_the_other(start_inproc, tmp_path, postgres_dsn):
    a = start_inproc(tmp_path / "a", "--voices-db", postgres_dsn)
    b = start_inproc(tmp_path / "b", "--voices-db", postgres_dsn)
    try:
        made = httpx.post(a.url + "/v1/voices", files={"audio": ("c.wav", _clip(), "audio/wav")},
                          data={"text": "A reference."}, timeout=120)
        assert made.status_code == 201, made.text
        voice = made.json()["id"]
        assert _speak(b, voice)["type"] == "done"  # b has it cached now
        assert httpx.delete(f"{a.url}/v1/voices/{voice}").status_code == 204
        time.sleep(CACHE_S + 0.5)
        assert httpx.get(f"{b.url}/v1/voices/{voice}").status_code == 404
        end = _speak(b, voice)
        assert end["type"] == "error" and end["code"] == "voice_not_found", end
    finally:
        a.stop()
        b.stop()


def test_an_expired_or_evicted_kept_voice_stops_even_if_just_used(start_inproc, tmp_path):
    server = start_inproc(tmp_path, "--kept-voice-ttl", "3", "--max-kept-voices-per-owner", "1")
    try:
        first = _keep(server)
        assert _speak(server, first)["type"] == "done"  # cached
        second = _keep(server)  # this owner's cap of one: the first makes room
        end = _speak(server, first)
        assert end["type"] == "error" and end["code"] == "voice_not_found", end
        assert _speak(server, second)["type"] == "done"
        time.sleep(3.5)  # past --kept-voice-ttl, counted from keeping (used or not)
        end = _speak(server, second)
        assert end["type"] == "error" and end["code"] == "voice_not_found", end
    finally:
        server.stop()


def test_a_kept_voice_belongs_to_the_key_that_kept_it(start_inproc, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# two tenants\nkey-of-ada\nkey-of-bob\n")
    server = start_inproc(tmp_path / "srv", "--api-keys-file", str(keys), "--max-kept-voices", "3",
                          "--max-kept-voices-per-owner", "2")
    ada, bob = _http("key-of-ada"), _http("key-of-bob")
    try:
        voice = _keep(server, "key-of-ada")
        assert len(voice) == len("kept-") + 32
        assert voice in [v["id"] for v in ada.get(server.url + "/v1/voices").json()["voices"]]
        assert voice not in [v["id"] for v in bob.get(server.url + "/v1/voices").json()["voices"]]
        assert bob.get(f"{server.url}/v1/voices/{voice}").status_code == 404
        end = _speak(server, voice, "key-of-bob")
        assert end["type"] == "error" and end["code"] == "voice_not_found", end
        assert bob.delete(f"{server.url}/v1/voices/{voice}").status_code == 404
        assert _speak(server, voice, "key-of-ada")["type"] == "done"  # bob's delete did nothing
        # bob keeps many: only bob's own make room (his cap of 2, then the global cap of 3)
        bobs = [_keep(server, "key-of-bob") for _ in range(4)]
        assert ada.get(f"{server.url}/v1/voices/{voice}").status_code == 200
        listed = [v["id"] for v in bob.get(server.url + "/v1/voices").json()["voices"] if v["kept"]]
        assert sorted(listed) == sorted(bobs[-2:]), listed
        assert ada.delete(f"{server.url}/v1/voices/{voice}").status_code == 204
    finally:
        ada.close()
        bob.close()
        server.stop()


def test_without_keys_a_kept_voice_is_listed_to_nobody(chorus_server):
    voice = _keep(chorus_server)
    assert voice not in [v["id"] for v in httpx.get(chorus_server.url + "/v1/voices").json()["voices"]]
    assert httpx.get(f"{chorus_server.url}/v1/voices/{voice}").json()["kept"] is True  # its id grants it
    assert _speak(chorus_server, voice)["type"] == "done"


@pytest.mark.parametrize("seconds", ["0"])
def test_a_zero_cache_checks_every_use(start_inproc, tmp_path, seconds):
    server = start_inproc(tmp_path, "--voice-cache-seconds", seconds)
    try:
        voice = _keep(server)
        assert _speak(server, voice)["type"] == "done"
        assert httpx.delete(f"{server.url}/v1/voices/{voice}").status_code == 204
        end = _speak(server, voice)
        assert end["type"] == "error" and end["code"] == "voice_not_found", end
    finally:
        server.stop()
