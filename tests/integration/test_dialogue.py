"""Dialogues through a real server: a three-speaker script on the WebSocket in script order (a
`line` frame before each line's audio, offsets without gaps, the pauses as silence), its lines
sharing the engine's steps, the same over HTTP as one file (decoded) and as sse, and the caps
and bad input, each with a clear error."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.chorus_client import Outcome, Session, metric_value

FAST = {"num_step": 4, "seed": 8}
SCRIPT = [{"voice": "alloy", "text": "Welcome to the show."}, {"voice": "echo", "text": "Thanks for having me!"},
          {"text": "Let us begin."}]


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("dialogue"), "--max-dialogue-lines", "4", "--max-text-chars", "2000",
                     "--max-dialogue-chars", "4000")
    yield s
    s.stop()


async def _dialogue(url: str, **fields) -> Outcome:
    session = await Session.open(url)
    try:
        session.outcomes["d"] = Outcome("d")
        await session.send({"type": "dialogue", "id": "d", **fields})
        return (await asyncio.wait_for(session.collect(["d"]), 300))["d"]
    finally:
        await session.close()


def _steps_with_several(server) -> float:
    """Steps that held more than one chunk, since start."""
    total = metric_value(server.url, "chorus_items_per_step_count", engine="engine0")
    return total - metric_value(server.url, "chorus_items_per_step_bucket", engine="engine0", le="1.0")


def test_three_speakers_in_order_with_their_pauses_sharing_steps(server):
    asyncio.run(_dialogue(server.ws_url, lines=SCRIPT[:2], options=FAST))  # the built-in voices made once
    shared_before = _steps_with_several(server)
    out = asyncio.run(_dialogue(server.ws_url, lines=SCRIPT, pause_ms=250, options=FAST, timestamps="word"))
    assert out.end["type"] == "done", out.end
    lines = out.of("line")
    assert [(line["line"], line["voice"], line["text"]) for line in lines] == \
        [(k, line.get("voice"), line["text"]) for k, line in enumerate(SCRIPT)]
    offset = 0
    for audio in out.audio:  # back to back, each frame where the one before ended
        assert audio.header["offset_samples"] == offset
        offset += audio.header["samples"]
    assert sum(a.header["samples"] for a in out.audio) / 24000 == pytest.approx(out.end["audio_seconds"], abs=0.01)
    pauses = [a for a in out.audio if a.header["line"] == -1]
    assert len(pauses) == 2 and all(a.header["samples"] == 6000 and not a.samples.any() for a in pauses)
    order = [f"line{f['line']}" if isinstance(f, dict) and f["type"] == "line" else
             f"audio{f.header['line']}" if not isinstance(f, dict) else f["type"] for f in out.frames]
    for k in range(3):  # a line's frame, then its audio, all before the next line's frame
        first_audio = order.index(f"audio{k}")
        last_audio = len(order) - 1 - order[::-1].index(f"audio{k}")
        assert order.index(f"line{k}") < first_audio
        assert k == 2 or last_audio < order.index(f"line{k + 1}")
    starts = [line["offset_samples"] for line in lines]
    assert starts[0] == 0 and starts[1] > starts[0] and starts[2] > starts[1]
    words = out.of("words")
    assert [w["line"] for w in words] == [0, 1, 2]
    assert all(starts[w["line"]] <= w["words"][0]["start_samples"] for w in words)
    assert _steps_with_several(server) > shared_before  # its lines were stepped together


def test_the_first_line_runs_alone_until_it_is_heard(server):
    """Line 0 steps alone until its first audio (the script's first sound as soon as a lone
    line's); the later lines join only then, so a two-line script whose first line is one chunk
    never shares a step."""
    asyncio.run(_dialogue(server.ws_url, lines=SCRIPT[:2], options=FAST))  # the built-in voices made once
    shared_before = _steps_with_several(server)
    out = asyncio.run(_dialogue(server.ws_url, lines=SCRIPT[:2], options=FAST))
    assert out.end["type"] == "done", out.end
    assert _steps_with_several(server) == shared_before


def test_over_http_as_one_file_and_as_events(server):
    body = {"lines": SCRIPT, "pause_ms": 200, "response_format": "wav", "normalize_text": False, **FAST}
    whole = httpx.post(server.url + "/v1/audio/dialogue", json=body, timeout=300)
    assert whole.status_code == 200 and whole.headers["content-type"] == "audio/wav", whole.text[:300]
    audio, rate = sf.read(io.BytesIO(whole.content), dtype="float32")
    assert rate == 24000 and len(audio) > 3 * 0.2 * rate
    events = httpx.post(server.url + "/v1/audio/dialogue", json={**body, "stream_format": "sse", "response_format":
                                                                   "pcm"}, timeout=300)
    parsed = [json.loads(line[6:]) for line in events.text.splitlines() if line.startswith("data: ")]
    assert [e["line"] for e in parsed if e["type"] == "speech.audio.line"] == [0, 1, 2]
    assert parsed[-1]["type"] == "speech.audio.done"


@pytest.mark.parametrize("body, status, code, field", [
    ({"lines": []}, 422, "invalid_request", "lines"),
    ({"lines": [{"text": "One."}, {"text": "  "}]}, 422, "invalid_request", "lines[1].text"),
    ({"lines": [{"text": "x"}] * 5}, 422, "invalid_request", "lines"),
    ({"lines": [{"text": "a " * 1000}, {"text": "b " * 1000}, {"text": "c."}]}, 413, "text_too_long", "lines"),
    ({"lines": [{"text": "Hi."}, {"text": "a" * 2001}]}, 413, "text_too_long", "lines[1].text"),
    ({"lines": [{"text": "Hi.", "voice": "aloy"}]}, 404, "voice_not_found", "lines[0].voice"),
    ({"lines": [{"text": "Hi.", "voice": "alloy"}, {"text": "Yo.", "voice": "ech"}]}, 404, "voice_not_found",
     "lines[1].voice"),
    ({"lines": [{"text": "Hi.", "options": {"num_step": 0}}]}, 422, "invalid_request", "lines[0].options.num_step"),
    ({"lines": [{"text": "Hi."}, {"text": "Yo.", "instruct": "0"}]}, 422, "invalid_request", "lines[1].instruct"),
    ({"lines": [{"text": "Hi.", "speaker": "x"}]}, 422, "invalid_request", "lines[0].speaker"),
])
def test_bad_scripts_get_clear_errors_on_both_doors(server, body, status, code, field):
    r = httpx.post(server.url + "/v1/audio/dialogue", json={**body, **FAST}, timeout=60)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"].get("field")) == (code, field), r.text
    out = asyncio.run(_dialogue(server.ws_url, **body, options=FAST))
    assert (out.end["type"], out.end["code"], out.end.get("field")) == ("error", code, field), out.end
    if code == "voice_not_found":
        assert out.end["message"].startswith(f"line {field[6]}: ") and "did you mean" in out.end["message"]


def test_a_script_longer_than_one_request_may_be_is_taken(server):
    """Each line within --max-text-chars, the script within --max-dialogue-chars, not the one cap."""
    async def go() -> dict:
        session = await Session.open(server.ws_url)
        try:
            assert session.ready["limits"]["max_dialogue_chars"] == 4000
            assert session.ready["limits"]["max_dialogue_lines"] == 4
            session.outcomes["long"] = Outcome("long")
            await session.send({"type": "dialogue", "id": "long", "lines": [{"text": "Some words. " * 150}] * 2,
                                "options": FAST})
            line = await session.wait_for("long", "line")
            await session.send({"type": "cancel", "id": "long"})
            await asyncio.wait_for(session.collect(["long"]), 120)
            return line
        finally:
            await session.close()

    assert asyncio.run(go())["line"] == 0


def test_progress_says_which_line_it_is_of(server):
    out = asyncio.run(_dialogue(server.ws_url, lines=SCRIPT[:2], options=FAST, progress=True))
    assert out.end["type"] == "done", out.end
    progress = out.of("progress")
    assert progress and {f["line"] for f in progress} == {0, 1}
    current = None
    for frame in out.frames:  # each progress frame is of the line whose `line` frame came last
        if isinstance(frame, dict) and frame["type"] == "line":
            current = frame["line"]
        elif isinstance(frame, dict) and frame["type"] == "progress":
            assert frame["line"] == current, frame


def test_a_cancelled_dialogue_ends_once_and_stops_every_line(server):
    async def go() -> dict:
        session = await Session.open(server.ws_url)
        try:
            session.outcomes["c"] = Outcome("c")
            await session.send({"type": "dialogue", "id": "c", "lines": [{"text": "A long first line. " * 6},
                                                                          {"text": "And more. " * 6}],
                                "options": {"num_step": 32}})
            await session.wait_for("c", "line")
            await session.send({"type": "cancel", "id": "c"})
            return (await asyncio.wait_for(session.collect(["c"]), 120))["c"].end
        finally:
            await session.close()

    assert asyncio.run(go())["type"] == "cancelled"
    server.wait_for(lambda: metric_value(server.url, "chorus_inflight_requests") == 0, "every line to end", 30)


def test_silence_between_lines_is_silence(server):
    out = asyncio.run(_dialogue(server.ws_url, lines=SCRIPT[:2], pause_ms=500, options=FAST))
    pause = next(a for a in out.audio if a.header["line"] == -1)
    assert pause.header["samples"] == 12000 and np.count_nonzero(pause.samples) == 0
