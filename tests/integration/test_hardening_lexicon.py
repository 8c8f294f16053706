"""The pronunciation lexicon under attack, through a real server: many entries (compiled once,
capped), an entry whose expansion would pass the text limit (refused as the lexicon writes it,
before tokenising), an entry that folds oddly (`İ`), and `say` values that are not what they
claim. Liveness bounds are generous (a loaded 2-core machine); before these fixes each case
stalled the server for tens of seconds or answered `internal`."""

from __future__ import annotations

import asyncio
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.chorus_client import Session, request_once, stream_once
from tests.support.health_probe import NO_HANG_S, HealthProbe

LIVE_S = 2.0  # /healthz answers within this while attacked
SLOW_S = 20.0  # eight short requests and a voice list beside them, all answered
FAST = {"num_step": 2, "seed": 5}


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("lexicon"))
    yield s
    s.stop()


def _add(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/pronunciations", json=body, timeout=NO_HANG_S)


def _spoken(server, outcome) -> str:
    """The text the engine was given (a kept voice's text is its first chunk's)."""
    assert outcome.end["type"] == "done", outcome.end
    return httpx.get(f"{server.url}/v1/voices/{outcome.end['voice_id']}").json()["text"]


@pytest.fixture
def crowded(start_inproc, tmp_path):
    s = start_inproc(tmp_path, "--max-pronunciations", "1010")
    yield s
    s.stop()


def test_a_thousand_entries_compile_once_and_stall_nobody(crowded):
    server = crowded
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: _add(server.url, {"text": f"Word{i} phrase{i}", "say": f"say {i}"})
                              .status_code, range(1000)))
    assert codes == [201] * 1000
    assert _add(server.url, {"text": "Hello", "say": "Howdy"}).status_code == 201  # a change: compiled again

    async def requests() -> list[dict]:
        async def one(i: int) -> dict:
            return (await request_once(server.ws_url, f"r{i}", "Hello. Word7 phrase7 too.", options=FAST,
                                       keep_voice=i == 0)).end

        async with httpx.AsyncClient(timeout=NO_HANG_S) as http:
            ends, voices = await asyncio.gather(asyncio.gather(*(one(i) for i in range(8))),
                                                http.get(server.url + "/v1/voices"))
        assert voices.status_code == 200
        return list(ends)

    with HealthProbe(server.url) as probe:
        began = time.monotonic()
        ends = asyncio.run(requests())
        took = time.monotonic() - began
    assert [end["type"] for end in ends] == ["done"] * 8, ends
    assert took < SLOW_S, f"eight short requests and a voice list took {took:.1f} s"
    assert httpx.get(f"{server.url}/v1/voices/{ends[0]['voice_id']}").json()["text"] == "Howdy. say 7 too."
    assert probe.slowest < LIVE_S, f"/healthz took {probe.slowest * 1000:.0f} ms"
    # the cap, checked as an entry is added
    for i in range(1010 - 1001):
        assert _add(server.url, {"text": f"Filler{i}", "say": "x"}).status_code == 201
    full = _add(server.url, {"text": "One too many", "say": "x"})
    assert full.status_code == 422 and "--max-pronunciations" in full.json()["error"]["message"], full.text


def test_an_expansion_past_the_spoken_limit_is_refused_before_tokenising(server, tmp_path):
    expanding = _add(server.url, {"text": "zq", "say": " ".join(["b"] * 150)})
    assert expanding.status_code == 201, expanding.text
    text = " ".join(["zq"] * 1666)  # under 5000 characters as written, 500,000 as spoken

    async def flood() -> list[dict]:
        session = await Session.open(server.ws_url)
        try:
            for i in range(16):
                await session.synthesize(f"x{i}", text, options=FAST)
            outcomes = await asyncio.wait_for(session.collect([f"x{i}" for i in range(16)]), NO_HANG_S)
            return [outcome.end for outcome in outcomes.values()]
        finally:
            await session.close()

    with HealthProbe(server.url) as probe:
        ends = asyncio.run(flood())
        http = httpx.post(server.url + "/v1/audio/speech", json={"input": text, "response_format": "pcm", **FAST},
                          timeout=NO_HANG_S)
    assert {(e["type"], e["code"], e.get("field")) for e in ends} == {("error", "text_too_long", "text")}, ends
    assert "as spoken" in ends[0]["message"]
    assert http.status_code == 413 and http.json()["error"]["field"] == "input", http.text
    assert probe.slowest < LIVE_S, f"/healthz took {probe.slowest * 1000:.0f} ms"
    assert httpx.delete(f"{server.url}/v1/pronunciations/{expanding.json()['id']}").status_code == 204


def test_an_entry_that_folds_oddly_breaks_no_request(server):
    dotted = _add(server.url, {"text": "İ", "say": "dotted"})
    assert dotted.status_code == 201, dotted.text
    try:
        plain = asyncio.run(request_once(server.ws_url, "i", "I am here, İ too.", options=FAST, keep_voice=True))
        assert _spoken(server, plain) == "I am here, dotted too."  # `I` is not `İ` once case-folded
        http = httpx.post(server.url + "/v1/audio/speech", timeout=NO_HANG_S,
                          json={"input": "I am here.", "response_format": "pcm", **FAST})
        assert http.status_code == 200, http.text
        streamed = asyncio.run(stream_once(server.ws_url, ["I am here. ", "İ too."], keep_voice=True, options=FAST))
        assert streamed.end["type"] == "done", streamed.end
    finally:
        httpx.delete(f"{server.url}/v1/pronunciations/{dotted.json()['id']}")


@pytest.mark.parametrize("say, problem", [
    ("[K AO1 R AH0 S", "unbalanced"), ("] [laughter] [", "unbalanced"), ("K AO1 R] and [", "unbalanced"),
    ("[k ao9 r]", "CMU phone"), ("[hello world]", "CMU phone"), ("[]", "empty"),
])
def test_say_values_that_are_not_what_they_claim_are_refused(server, say, problem):
    r = _add(server.url, {"text": "Chorus", "say": say})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "say" and problem in r.json()["error"]["message"], r.text


def test_entries_are_stored_in_one_normal_form(server):
    lower = _add(server.url, {"text": "Kubernetes", "say": "[k uw1 b er0 n eh1 t iy0 z] [laughter]"})
    assert lower.status_code == 201 and lower.json()["say"] == "[K UW1 B ER0 N EH1 T IY0 Z] [laughter]", lower.text
    composed = _add(server.url, {"text": unicodedata.normalize("NFC", "Café"), "say": "kafay"})
    decomposed = _add(server.url, {"text": unicodedata.normalize("NFD", "Café"), "say": "kaffee"})
    assert composed.status_code == 201 and decomposed.status_code == 409, decomposed.text
    upper = _add(server.url, {"text": "Chorus", "say": "Korus", "voice": "ALLOY"})
    assert upper.status_code == 201 and upper.json()["voice"] == "alloy", upper.text
    spoken = asyncio.run(request_once(server.ws_url, "a", "Chorus.", voice="Alloy", options=FAST, keep_voice=True))
    assert _spoken(server, spoken) == "Korus."
    decomposed_text = asyncio.run(request_once(server.ws_url, "c", unicodedata.normalize("NFD", "Café."),
                                               options=FAST, keep_voice=True))
    assert _spoken(server, decomposed_text) == "kafay."
