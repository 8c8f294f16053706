"""DNS rebinding: a page on `attacker.example` whose name now resolves to this server sends
`Host: attacker.example:PORT` and a matching `Origin`, so the Origin check alone passes. The
Host must be one the server serves: localhost, an IP address, `--host`, `--allowed-hosts`."""

from __future__ import annotations

import asyncio
import io
import json
from urllib.parse import urlsplit

import httpx
import soundfile as sf
import websockets
from litestar.testing import TestClient

from server.app import create_app
from server.config import ServerConfig
from tests.conftest import make_reference_clip
from tests.support.fake_engine import FakeEngine


def _wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(1.0), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _ws_first_frame(server_url: str, host: str, origin: str | None) -> tuple[dict, int | None]:
    """Connect to the server's address while naming `host` (as a rebound browser does)."""
    addr = urlsplit(server_url)

    async def go():
        async with websockets.connect(f"ws://{host}/v1/stream", host=addr.hostname, port=addr.port,
                                      origin=origin) as ws:
            first = json.loads(await ws.recv())
            if first["type"] == "ready":
                return first, None
            try:
                await asyncio.wait_for(ws.recv(), 30)
            except websockets.ConnectionClosed as exc:
                return first, exc.rcvd.code if exc.rcvd else None
            return first, None

    return asyncio.run(go())


def test_a_rebound_name_gets_nothing(chorus_server):
    port = urlsplit(chorus_server.url).port
    evil = f"attacker.example:{port}"
    headers = {"Host": evil, "Origin": f"http://{evil}"}
    frame, code = _ws_first_frame(chorus_server.url, evil, f"http://{evil}")
    assert (frame["type"], frame["code"], code) == ("error", "unauthorized", 1008)
    assert "host" in frame["message"]
    r = httpx.post(chorus_server.url + "/v1/voices", headers=headers, timeout=60,
                   files={"audio": ("a.wav", _wav(), "audio/wav")}, data={"text": "Hi.", "name": "evil"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "unauthorized", r.text
    for method, path in (("GET", "/v1/voices"), ("DELETE", "/v1/voices/any-voice-1"), ("GET", "/"),
                         ("GET", "/metrics"), ("POST", "/v1/audio/speech")):
        r = httpx.request(method, chorus_server.url + path, headers=headers, json={"input": "Hi."}, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "unauthorized", (path, r.text)
    assert not any(v["name"] == "evil" for v in httpx.get(chorus_server.url + "/v1/voices").json()["voices"])


def test_local_names_and_addresses_are_served(chorus_server):
    port = urlsplit(chorus_server.url).port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost.:{port}", f"app.localhost:{port}",
                 f"[::1]:{port}", "10.1.2.3"):
        r = httpx.get(chorus_server.url + "/v1/voices", headers={"Host": host}, timeout=60)
        assert r.status_code == 200, (host, r.text)
    frame, _ = _ws_first_frame(chorus_server.url, f"localhost:{port}", f"http://localhost:{port}")
    assert frame["type"] == "ready"


def test_allowed_hosts_for_deployments(tmp_path):
    from server.config import parse_hosts

    cfg = ServerConfig(voices_dir=tmp_path / "voices", allowed_hosts=parse_hosts("tts.example.com, *.internal."))
    with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://test.localhost") as client:
        for host, status in (("tts.example.com", 200), ("TTS.example.com:8443", 200), ("a.b.internal", 200),
                             ("internal", 403), ("tts.example.com.evil.net", 403), ("example.com", 403)):
            assert client.get("/v1/voices", headers={"Host": host}).status_code == status, host
        with client.websocket_connect("/v1/stream", headers={"Host": "evil.net"}) as ws:
            assert ws.receive_json()["code"] == "unauthorized"
    cfg = ServerConfig(voices_dir=tmp_path / "voices2", allowed_hosts=("*",))
    with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://anything.example") as client:
        assert client.get("/v1/voices").status_code == 200
    cfg = ServerConfig(voices_dir=tmp_path / "voices3", host="box.lan")  # the name --host binds
    with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://box.lan:8000") as client:
        assert client.get("/v1/voices").status_code == 200
