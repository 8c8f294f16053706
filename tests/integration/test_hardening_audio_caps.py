"""One audio cap for everything, and reference audio counted before it is decoded:
- a text stream's segments together count toward `--max-audio-seconds`, as one request's
  chunks do (a stream past it ends with `stream_too_long`, its audio within the cap);
- one-shot references being decoded and encoded are held to `--max-references-bytes`
  server-wide (beyond it `busy`, before the decode), and given back when encoded;
- voice encodes (uploads and references) run at most `--max-voice-encodes` at once, the
  rest waiting their turn, all of them served."""

from __future__ import annotations

import asyncio
import base64
import io
import threading

import httpx
import pytest
import soundfile as sf

from tests.conftest import make_reference_clip
from tests.support.chorus_client import Audio, Session, metric_value

NO_HANG_S = 120
CAP_S = 60.0


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("audio-caps"), "--max-audio-seconds", str(CAP_S),
                     "--max-references-bytes", "2M", "--max-voice-encodes", "1")
    yield s
    s.stop()


def _stream(server, sentences: int) -> tuple[dict, float]:
    """A stream of `sentences` sentences, each planned at 25 s: its end and its audio seconds."""

    async def go():
        s = await Session.open(server.ws_url)
        text = " ".join(["One more sentence here."] * sentences)
        await s.send({"type": "stream_open", "id": "s", "text": text, "progress": False,
                      "options": {"num_step": 2, "duration": 25.0}})
        await s.send({"type": "stream_close", "id": "s"})
        out = (await asyncio.wait_for(s.collect(["s"]), NO_HANG_S))["s"]
        await s.close()
        audio = sum(f.header["samples"] / f.header["sample_rate"] for f in out.frames if isinstance(f, Audio))
        return out.end, audio

    return asyncio.run(go())


def test_a_stream_counts_toward_max_audio_seconds(server):
    end, audio = _stream(server, sentences=5)  # 125 s planned, against 60
    assert (end["type"], end["code"]) == ("error", "stream_too_long"), end
    assert "segment 2" in end["message"] and f"{CAP_S:g} s" in end["message"]
    assert audio <= CAP_S


def test_a_stream_within_the_cap_is_whole(server):
    end, audio = _stream(server, sentences=2)
    assert end["type"] == "done" and abs(end["audio_seconds"] - audio) < 0.01 and audio > 40


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(seconds, 16000), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_one_shot_references_are_budgeted_before_they_are_decoded(server):
    reference = {"audio": base64.b64encode(_wav(30.0)).decode(), "text": "Hello there."}  # 1.3 MB of base64

    async def go():
        s = await Session.open(server.ws_url)
        for i in range(4):  # in one go: they are all prepared at once
            await s.synthesize(f"r{i}", "Hi.", reference=reference, options={"num_step": 2}, progress=False)
        outcomes = await asyncio.wait_for(s.collect(), NO_HANG_S)
        await s.synthesize("after", "Hi.", reference=reference, options={"num_step": 2}, progress=False)
        after = (await asyncio.wait_for(s.collect(["after"]), NO_HANG_S))["after"]
        await s.close()
        return outcomes, after

    outcomes, after = asyncio.run(go())
    ends = [o.end for o in outcomes.values()]
    busy = [e for e in ends if e["type"] == "error"]
    assert all(e["code"] == "busy" and "--max-references-bytes" in e["message"] for e in busy), busy
    assert busy and len(busy) < len(ends)  # one fits the budget; the rest are refused before decoding
    assert all(e["type"] == "done" for e in ends if e not in busy)
    assert after.end["type"] == "done"  # the budget is given back once the voice is encoded


def test_voice_encodes_wait_their_turn(server):
    waits = metric_value(server.url, "chorus_voice_encode_waits_total")
    statuses: list[int] = []

    def upload(i: int) -> None:
        r = httpx.post(server.url + "/v1/voices", timeout=NO_HANG_S, data={"text": "Hello there.", "name": f"v{i}"},
                       files={"audio": ("a.wav", _wav(20.0), "audio/wav")})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(NO_HANG_S)
    assert statuses == [201] * 4  # every upload served...
    assert metric_value(server.url, "chorus_voice_encode_waits_total") > waits  # ...one slot at a time
    assert metric_value(server.url, "chorus_voice_encodes_running") == 0
