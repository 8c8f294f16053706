"""Text streamed in (`stream_open` / `stream_append` / `stream_flush` / `stream_close`) against a
real `chorus serve` and a real `websockets` client: segments spoken in order, each audio frame
placed in the stream, the `segment` frames' text and offsets, one `done`, cancel mid-stream,
bad frames, and every stream limit on a server started with small limits."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
import soundfile as sf

from tests.conftest import make_reference_clip
from tests.support.chorus_client import END_TYPES, Audio, Outcome, Session

FAST = {"num_step": 4, "seed": 3}
ANSWER = ("Sure, I can help with that. Dr. Smith arrives at 3.5 p.m. on Friday! "
          "Would you like me to book a table? The restaurant is on Main St. near the station.")


def tokens_of(text: str) -> list[str]:
    """An LLM-like token stream: word pieces of 1-4 characters, spaces kept."""
    pieces, i, sizes = [], 0, [3, 1, 4, 2]
    while i < len(text):
        n = sizes[len(pieces) % len(sizes)]
        pieces.append(text[i : i + n])
        i += n
    return pieces


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


SAMPLE_BYTES = {"pcm_s16le": 2, "f32le": 4, "mulaw": 1, "alaw": 1}


def check_stream(outcome: Outcome, *, encoding: str = "pcm_s16le", rate: int = 24000) -> list[dict]:
    """What the protocol promises about a stream that ended with `done`; returns its segments."""
    frames = outcome.frames
    assert isinstance(frames[0], dict) and frames[0] == {"type": "accepted", "id": outcome.id, "chunks": None,
                                                         "target_seconds": []}
    assert outcome.end["type"] == "done", outcome.end
    assert sum(1 for f in frames if isinstance(f, dict) and f["type"] in ("accepted", *END_TYPES)) == 2
    segments = outcome.of("segment")
    assert [s["segment"] for s in segments] == list(range(len(segments)))
    offset = 0
    for k, seg in enumerate(segments):
        # this segment's audio: after the previous segment frame, before its own, contiguous
        start = frames.index(segments[k - 1]) if k else 0
        mine = [f for f in frames[start : frames.index(seg)] if isinstance(f, Audio)]
        assert mine and all(a.header["segment"] == k for a in mine)
        assert seg["offset_samples"] == offset
        for a in mine:
            h = a.header
            assert h["offset_samples"] == offset and h["encoding"] == encoding and h["sample_rate"] == rate
            assert len(a.payload) == h["samples"] * SAMPLE_BYTES[encoding] > 0
            offset += h["samples"]
        assert seg["samples"] == offset - seg["offset_samples"] and mine[-1].header["final"]
    assert frames[-2] is segments[-1]  # done right after the last segment frame
    done = outcome.end
    assert done["chunks"] == len(outcome.audio)
    assert abs(done["audio_seconds"] - offset / rate) < 1e-3
    return segments


async def stream_text(session: Session, sid: str, pieces: list[str], close: bool = True, **fields) -> None:
    await session.stream(sid, pieces, close, **{"options": FAST, **fields})


def test_token_stream_is_spoken_sentence_by_sentence_in_order(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "s1", tokens_of(ANSWER))
        out = (await s.collect(["s1"]))["s1"]
        await s.close()
        return out

    segments = check_stream(run(main()))
    assert [seg["text"] for seg in segments] == [
        "Sure, I can help with that.", "Dr. Smith arrives at 3.5 p.m. on Friday!",
        "Would you like me to book a table?", "The restaurant is on Main St. near the station.",
    ]


def test_chinese_text_is_cut_at_its_punctuation(chorus_server):
    text = "你好。今天天气很好！我们去公园吧？价格是3.5元"

    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "zh", list(text), language="zh", encoding="f32le")
        out = (await s.collect(["zh"]))["zh"]
        await s.close()
        return out

    segments = check_stream(run(main()), encoding="f32le")
    assert [seg["text"] for seg in segments] == ["你好。", "今天天气很好！", "我们去公园吧？", "价格是3.5元"]


def test_mulaw_at_8000_hz_offsets_count_the_samples_sent(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "m", tokens_of("Telephone audio. Eight thousand a second."), encoding="mulaw")
        await stream_text(s, "w", tokens_of("Wideband. At sixteen."), encoding="pcm_s16le", sample_rate=16000)
        out = await s.collect(["m", "w"])
        await s.close()
        return out

    out = run(main())
    assert len(check_stream(out["m"], encoding="mulaw", rate=8000)) == 2
    assert len(check_stream(out["w"], rate=16000)) == 2


def test_initial_text_flush_and_progress(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        s.outcomes["f"] = Outcome("f")
        await s.send({"type": "stream_open", "id": "f", "text": "Half a sent", "options": FAST})
        await s.send({"type": "stream_flush", "id": "f"})
        first = await s.wait_for("f", "segment")  # spoken before any more text comes
        await s.send({"type": "stream_append", "id": "f", "text": "ence and the rest"})
        await s.send({"type": "stream_close", "id": "f"})
        out = (await s.collect(["f"]))["f"]
        await s.close()
        return first, out

    first, out = run(main())
    segments = check_stream(out)
    assert first["text"] == "Half a sent"
    assert [seg["text"] for seg in segments] == ["Half a sent", "ence and the rest"]
    progress = out.of("progress")
    assert {(f["segment"], f["step"]) for f in progress} == {(k, n) for k in (0, 1) for n in range(1, 5)}


def test_streams_and_requests_share_a_connection(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "a", tokens_of("One. Two. Three."))
        await s.synthesize("r", "A plain request.", options=FAST, progress=False)
        await stream_text(s, "b", tokens_of("Four! Five?"), voice=None, instruct="female, low pitch")
        out = await s.collect(["a", "r", "b"])
        await s.close()
        return out

    out = run(main())
    assert [g["text"] for g in check_stream(out["a"])] == ["One.", "Two.", "Three."]
    assert [g["text"] for g in check_stream(out["b"])] == ["Four!", "Five?"]
    assert out["r"].end["type"] == "done" and all("segment" not in a.header for a in out["r"].audio)


def test_cloned_voice_stream(chorus_server):
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(1.5), 16000, format="WAV", subtype="PCM_16")
    reference = {"audio": base64.b64encode(buf.getvalue()).decode(), "text": "A reference."}

    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "v", tokens_of("First line. Second line."), reference=reference)
        out = (await s.collect(["v"]))["v"]
        await s.close()
        return out

    assert len(check_stream(run(main()))) == 2


def test_cancel_mid_stream(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "c", tokens_of("First sentence here. Second one is coming"), close=False)
        await s.wait_for("c", "segment")
        await s.send({"type": "cancel", "id": "c"})
        out = (await s.collect(["c"]))["c"]
        await s.send({"type": "stream_append", "id": "c", "text": "late."})  # a late frame: dropped
        await s.send({"type": "ping"})
        while (frame := await s.next_frame()) != {"type": "pong"}:
            assert isinstance(frame, dict) and frame.get("id") != "c", frame
        await stream_text(s, "c", ["Same id again."])  # the id is free once the stream ended
        again = (await s.collect(["c"]))["c"]
        await s.close()
        return out, again

    out, again = run(main())
    assert out.end == {"type": "cancelled", "id": "c"}
    assert sum(1 for f in out.frames if isinstance(f, dict) and f["type"] in END_TYPES) == 1
    assert check_stream(again)[0]["text"] == "Same id again."


def test_bad_stream_frames_are_answered(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await s.send({"type": "stream_append", "id": "nope", "text": "x"})
        unknown = await s.expect_error("invalid_request", "nope")
        await s.send({"type": "stream_open", "id": "o", "options": {"num_step": 99}})
        knob = await s.expect_error("invalid_request", "o")
        await s.send({"type": "stream_open", "id": "o", "voice": "missing"})
        missing = await s.expect_error("voice_not_found", "o")
        await s.send({"type": "stream_append", "id": "o"})
        no_text = await s.expect_error("invalid_request", "o")
        await stream_text(s, "d", ["Hello."], close=False)
        await s.send({"type": "stream_open", "id": "d"})
        dup = await s.expect_error("duplicate_id", "d")
        await s.send({"type": "stream_close", "id": "d"})
        await s.send({"type": "stream_append", "id": "d", "text": "after close"})
        out = (await s.collect(["d"]))["d"]
        await s.close()
        return unknown, knob, missing, no_text, dup, out

    unknown, knob, _, no_text, dup, out = run(main())
    assert "no open stream" in unknown["message"]
    assert knob["message"].startswith("options.num_step")
    assert no_text["message"] == "text: required"
    assert "already in flight" in dup["message"]
    # an append after stream_close ends the stream with an error (or, if it had ended, is dropped)
    assert out.end["type"] in ("done", "error")
    if out.end["type"] == "error":
        assert out.end["code"] == "invalid_request" and "after stream_close" in out.end["message"]


@pytest.fixture(scope="module")
def small_limits(start_inproc, tmp_path_factory):
    server = start_inproc(tmp_path_factory.mktemp("stream-limits"), "--stream-idle-seconds", "2",
                          "--stream-max-buffered-chars", "120", "--stream-max-seconds", "3", "--max-inflight", "2")
    yield server
    server.stop()


def test_idle_stream_ends_with_stream_idle(small_limits):
    async def main():
        s = await Session.open(small_limits.ws_url)
        await stream_text(s, "i", ["A sentence", ". "], close=False)
        out = (await s.collect(["i"]))["i"]
        await s.close()
        return out

    out = run(main())
    assert out.end["type"] == "error" and out.end["code"] == "stream_idle"
    assert out.of("segment")[0]["text"] == "A sentence."  # what came was spoken first


async def _overfill(s: Session) -> None:
    await stream_text(s, "s", ["word " * 30], close=False)  # 150 characters, no sentence end


async def _outlast(s: Session) -> None:
    await stream_text(s, "s", ["Short."], close=False)
    for _ in range(10):  # keeps it from going idle, past the 3 s limit
        await asyncio.sleep(0.4)
        await s.send({"type": "stream_append", "id": "s", "text": " more"})


@pytest.mark.parametrize(("feed", "says"), [(_overfill, "over the limit of 120"), (_outlast, "3 s")],
                         ids=["buffered-text", "duration"])
def test_a_stream_past_a_limit_is_stream_too_long_and_the_connection_goes_on(small_limits, feed, says):
    async def main():
        s = await Session.open(small_limits.ws_url)
        await feed(s)
        out = (await s.collect(["s"]))["s"]
        await s.send({"type": "ping"})
        after = [await s.next_frame()]
        while after[-1] != {"type": "pong"}:  # the connection goes on
            after.append(await s.next_frame())
        await s.close()
        return out, after[:-1]

    out, before_pong = run(main())
    assert out.end["type"] == "error" and out.end["code"] == "stream_too_long"
    assert says in out.end["message"]
    # only answers to appends sent after the end (the duration case) may come before the pong
    assert all(isinstance(f, dict) and f["type"] == "error" and f.get("id") == "s" for f in before_pong), before_pong


def test_streams_count_against_the_connection_limit(small_limits):
    async def main():
        s = await Session.open(small_limits.ws_url)
        await stream_text(s, "x", [], close=False)
        await stream_text(s, "y", [], close=False)
        s.outcomes.pop("z", None)
        await s.send({"type": "stream_open", "id": "z"})
        refused = await s.expect_error("too_many_requests", "z")
        for sid in ("x", "y"):
            await s.send({"type": "cancel", "id": sid})
        out = await s.collect(["x", "y"])
        await s.close()
        return refused, out

    refused, out = run(main())
    assert "limit 2" in refused["message"]
    assert [o.end["type"] for o in out.values()] == ["cancelled", "cancelled"]


def test_stream_closed_without_text_is_done_without_audio(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        await stream_text(s, "e", ["", "  "])
        out = (await s.collect(["e"]))["e"]
        await s.close()
        return out

    out = run(main())
    assert [f["type"] for f in out.frames] == ["accepted", "done"]
    assert out.end["chunks"] == 0 and out.end["audio_seconds"] == 0
