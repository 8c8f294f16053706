"""`normalize_text`: per request, on the WebSocket (default off), in streams (each segment once
complete) and on HTTP (default on); `true` reads English with NeMo's normaliser (numbers as a
listener expects them), `"reference"` is exactly the reference's normalisation; inline
pronunciations, pinyin and tags pass through untouched. Real servers and clients; what the
engine was given is read back through `keep_voice` (a kept voice's text is what its first
chunk spoke)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from server.text import normalize_nemo
from server.text.normalize import normalize
from tests.support.chorus_client import request_once, stream_once

SEED = {"num_step": 4, "seed": 21}


@pytest.mark.parametrize("text,language", [
    ("It costs $3.50 on 12/05, Dr. Smith said.", None),
    ("Play the [B EY1 S] at 3 pm [laughter].", "English"),
    ("我有3个苹果，ZHONG1 文 [sigh] 价格是12.5元", None),
    ("Ich habe 3 Äpfel und 12 Birnen.", "de"),
    ("Nothing to change here.", "en"),
])
def test_the_reference_normalisation_exactly(text, language):
    from omnivoice.utils.text import normalize_text as reference

    assert normalize(text, language, "reference") == reference(text, language)


def test_true_reads_english_with_nemo_and_other_languages_as_the_reference():
    assert normalize("1,000 people paid $3.50.", "en") == "one thousand people paid three dollars fifty cents."
    for text, language in [("我有3个苹果，价格是12.5元", None), ("Ich habe 3 Äpfel und 12 Birnen.", "de")]:
        assert normalize(text, language) == normalize(text, language, "reference")


def test_inline_pronunciations_tags_and_pinyin_pass_untouched():
    for choice in (True, "reference"):
        out = normalize("Say [B EY1 S] 2 times [laughter].", "en", choice)
        assert "[B EY1 S]" in out and "[laughter]" in out and "two" in out and "2" not in out
    zh = normalize("第3个字读ZHONG1，[breath]", "zh")
    assert "ZHONG1" in zh and "[breath]" in zh and "三" in zh


def test_websocket_normalises_only_when_asked(chorus_server):
    text = "I paid $3.50 on 12/05."
    spoken = normalize(text, None)
    asked = asyncio.run(request_once(chorus_server.ws_url, "n1", text, options={**SEED, "normalize_text": True}))
    written = asyncio.run(request_once(chorus_server.ws_url, "n2", spoken, options=SEED))
    plain = asyncio.run(request_once(chorus_server.ws_url, "n3", text, options=SEED))
    accepted = [o.of("accepted")[0]["target_seconds"] for o in (asked, written, plain)]
    assert accepted[0] == accepted[1] != accepted[2]  # planned from the spoken form
    assert np.array_equal(asked.samples, written.samples)  # the very same request
    assert not np.array_equal(asked.samples, plain.samples)  # the default (off) reads the text as written


def test_a_stream_normalises_each_segment_once_complete(chorus_server):
    sentences = ["The bill was $3.50 today.", "Say [B EY1 S] 2 times."]
    text = " ".join(sentences)

    # one character at a time: "$3." then "50", normalised per piece, would read "3" alone
    out = asyncio.run(stream_once(chorus_server.ws_url, list(text), keep_voice=True,
                                  options={**SEED, "normalize_text": True}))
    assert out.end["type"] == "done", out.end
    assert [seg["text"] for seg in out.of("segment")] == sentences  # captions: the words as written
    kept = httpx.get(f"{chorus_server.url}/v1/voices/{out.end['voice_id']}").json()
    assert kept["text"] == normalize(sentences[0], None)  # segment 0 was spoken normalised, whole
    first = np.concatenate([a.samples for a in out.audio if a.header["segment"] == 0])
    alone = asyncio.run(request_once(chorus_server.ws_url, "a", normalize(sentences[0], None), options=SEED))
    assert np.array_equal(first, alone.samples)
    second = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120, json={
        "input": sentences[1], "response_format": "pcm", "keep_voice": True, **SEED}).headers["x-chorus-voice-id"]
    said = httpx.get(f"{chorus_server.url}/v1/voices/{second}").json()["text"]
    assert "[B EY1 S]" in said and "two times" in said  # the pronunciation reached the model as written


def test_http_normalises_by_default_and_can_be_told_not_to(chorus_server):
    def pcm(text: str, **extra) -> bytes:
        r = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120,
                       json={"input": text, "response_format": "pcm", **SEED, **extra})
        assert r.status_code == 200, r.text
        return r.content

    text = "Call me at 3 pm."
    assert pcm(text) == pcm(normalize(text, None), normalize_text=False)
    assert pcm(text, normalize_text=False) != pcm(text)
    bad = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": "x", "normalize_text": 1})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "normalize_text"


def _kept_text(server, response: httpx.Response) -> str:
    """What the engine was given for the request (`keep_voice`: its kept voice's text)."""
    assert response.status_code == 200, response.text
    return httpx.get(f"{server.url}/v1/voices/{response.headers['x-chorus-voice-id']}").json()["text"]


def test_http_reads_numbers_as_a_listener_expects_and_keeps_the_reference_selectable(chorus_server):
    from omnivoice.utils.text import normalize_text as reference

    def given(text: str, **extra) -> str:
        return _kept_text(chorus_server, httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120, json={
            "input": text, "response_format": "pcm", "keep_voice": True, **SEED, **extra}))

    text = "1,000 people came."
    assert given(text) == "one thousand people came."  # the default: true, NeMo's for English
    assert given(text, normalize_text=True) == "one thousand people came."
    assert given(text, normalize_text="reference") == reference(text) == "thousand people came."
    assert given(text, normalize_text=False) == text
    bad = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": "x", "normalize_text": "nemo"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "normalize_text"
    assert '"reference"' in bad.json()["error"]["message"]


def test_websocket_true_reads_numbers_as_a_listener_expects(chorus_server):
    from omnivoice.utils.text import normalize_text as reference

    def given(text: str, choice) -> str:
        out = asyncio.run(request_once(chorus_server.ws_url, "k", text, keep_voice=True,
                                       options={**SEED, "normalize_text": choice}))
        assert out.end["type"] == "done", out.end
        return httpx.get(f"{chorus_server.url}/v1/voices/{out.end['voice_id']}").json()["text"]

    text = "It costs $3.50 for 1,000 people."
    assert given(text, True) == "It costs three dollars fifty cents for one thousand people."
    assert given(text, "reference") == reference(text)
    assert normalize_nemo.is_built()  # the server compiled NeMo's grammars into its cache
