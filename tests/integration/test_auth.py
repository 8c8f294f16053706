"""Access control at every entry point of a real server with an API key and an Origin
allow-list: the WebSocket (header, `?api_key=`, Origin), every `/v1` HTTP route, and what
stays open (probes, metrics, the demo page). The page's own WebSocket with the key is in
e2e/test_connection.py."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
import websockets
from litestar.testing import TestClient

from server.api.auth import keys_match
from server.app import create_app
from server.config import ServerConfig
from tests.support.chorus_client import Session
from tests.support.fake_engine import FakeEngine

KEY = "k3y-Æ-with-unicode"
ALLOWED = "http://allowed.example:3000"
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def keyed(start_inproc, tmp_path_factory):
    server = start_inproc(tmp_path_factory.mktemp("keyed"), "--api-key", KEY, "--allowed-origins", ALLOWED)
    yield server
    server.stop()


def ws_outcome(url: str, **kwargs) -> tuple[dict | str, int | None]:
    """(the first frame, the close code if the server then closed) of one connection."""
    async def go():
        async with websockets.connect(url, **kwargs) as ws:
            first = await ws.recv()
            if '"ready"' in first:
                return first, None
            try:
                await asyncio.wait_for(ws.recv(), timeout=30)
            except websockets.ConnectionClosed as exc:
                return first, exc.rcvd.code if exc.rcvd else None
            except TimeoutError:
                return first, None
            return first, None

    import json

    first, code = asyncio.run(go())
    return json.loads(first), code


def test_websocket_key_by_header_or_query(keyed):
    from urllib.parse import quote

    bearer = {"Authorization": f"Bearer {KEY}".encode().decode("latin-1")}
    for kwargs in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}},
                   {"additional_headers": {"Authorization": "Basic " + KEY.encode().decode("latin-1")}}):
        frame, code = ws_outcome(keyed.ws_url, **kwargs)
        assert (frame["type"], frame["code"], frame["id"], code) == ("error", "unauthorized", None, 1008)
    frame, code = ws_outcome(keyed.ws_url + "?api_key=wrong")
    assert frame["code"] == "unauthorized" and code == 1008

    async def ready(url, **kwargs):
        s = await Session.open(url, **kwargs)
        await s.close()
        return s.ready["type"]

    assert asyncio.run(ready(keyed.ws_url + "?api_key=" + quote(KEY))) == "ready"
    assert asyncio.run(ready(keyed.ws_url, additional_headers=bearer)) == "ready"


def test_websocket_origin_allow_list(keyed):
    from urllib.parse import quote

    url = keyed.ws_url + "?api_key=" + quote(KEY)
    own = keyed.url  # http://127.0.0.1:PORT: the page's own origin
    for origin in (own, own.replace("127.0.0.1", "127.0.0.1") + "/", ALLOWED, ALLOWED.upper()):
        frame, _ = ws_outcome(url, origin=origin)
        assert frame["type"] == "ready", origin
    # (the scheme cannot be compared: behind a TLS proxy the page is https, the server sees http)
    for origin in (EVIL, "null", "http://127.0.0.1:1", "https://allowed.example:3000", "http://localhost"):
        frame, code = ws_outcome(url, origin=origin)
        assert (frame["code"], code) == ("unauthorized", 1008), origin
        assert "origin" in frame["message"]


ROUTES = [("GET", "/v1/voices"), ("POST", "/v1/voices"), ("GET", "/v1/voices/some-voice-1"),
          ("DELETE", "/v1/voices/some-voice-1"), ("POST", "/v1/audio/speech")]


@pytest.mark.parametrize("method, path", ROUTES)
def test_every_http_api_route_needs_the_key(keyed, method, path):
    url = keyed.url + path
    header = {"Authorization": b"Bearer " + KEY.encode()}
    for headers, params in (({}, {}), ({"Authorization": "Bearer wrong"}, {}), ({}, {"api_key": "wrong"}),
                            ({"Authorization": KEY.encode()}, {})):
        r = httpx.request(method, url, headers=headers, params=params, json={"input": ""}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (headers, params, r.text)
    for headers, params in ((header, {}), ({}, {"api_key": KEY})):
        r = httpx.request(method, url, headers=headers, params=params, json={"input": ""}, timeout=30)
        assert r.status_code not in (401, 403), (headers, params, r.text)
    # a page of another origin may not use the API, even with the key; an allowed one may
    r = httpx.request(method, url, headers={**header, "Origin": EVIL}, json={"input": ""}, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.request(method, url, headers={**header, "Origin": ALLOWED}, json={"input": ""}, timeout=30)
    assert r.status_code not in (401, 403) and r.headers["access-control-allow-origin"] == ALLOWED


def test_probes_metrics_and_the_page_stay_open(keyed):
    for path in ("/healthz", "/readyz", "/metrics", "/", "/static/app.js"):
        assert httpx.get(keyed.url + path, timeout=30).status_code == 200, path
    page = httpx.get(keyed.url + "/", timeout=30).text
    assert KEY not in page  # the page asks for the key; it is not in it
    assert re.search(r'"api_key_required": true', page) and re.search(r'"api_key": null', page)
    preflight = httpx.options(keyed.url + "/v1/voices", headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization"}, timeout=30)
    assert preflight.status_code in (200, 204) and preflight.headers["access-control-allow-origin"] == ALLOWED


def test_page_embeds_the_key_only_when_told(tmp_path):
    for embeds, expected in ((False, None), (True, KEY)):
        cfg = ServerConfig(voices_dir=tmp_path / "voices", api_key=KEY, page_embeds_key=embeds)
        with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://test.localhost") as client:
            page = client.get("/").text
            assert ('"api_key": "' + KEY.replace("Æ", "\\u00c6") + '"' in page) is (expected is not None)
            assert client.get("/v1/voices").status_code == 401


def test_keys_are_compared_whole():
    assert keys_match("secret", "secret")
    for other in ("", "secre", "secret ", "Secret", "secretsecret", "sécret"):
        assert not keys_match(other, "secret")
