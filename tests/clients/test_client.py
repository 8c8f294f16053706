"""`chorus_client` against a real `chorus serve` (tiny checkpoint, CPU): synthesize, text
streams, several requests on one connection, cancel, the voice library, typed errors,
pass-through of the newer protocol fields, and reconnecting after the socket closes."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import httpx
import pytest
from chorus_client import (
    Accepted,
    AudioChunk,
    BusyError,
    Cancelled,
    ChorusClient,
    ChorusError,
    ConnectionLostError,
    Done,
    InvalidRequestError,
    Reference,
    SynthesisOptions,
    TextTooLongError,
    UnauthorizedError,
    VoiceNotFoundError,
    split_url,
)
from chorus_client.errors import error_from
from chorus_client.voices import http_error
from chorus_client.wire import parse_audio, request_frame

from tests.clients.chorus_process import ChorusProcess

FAST = SynthesisOptions(num_step=4, seed=3)
ANSWER = ("Sure, I can help with that. The train leaves at nine. It takes two hours. "
          "Bring a jacket, it gets cold. Anything else?")


def run(coro):
    return asyncio.run(coro)


def test_urls_in_either_form():
    assert split_url("http://h:8000") == ("http://h:8000", "ws://h:8000/v1/stream")
    assert split_url("ws://h:8000/v1/stream") == ("http://h:8000", "ws://h:8000/v1/stream")
    assert split_url("https://tts.example.com/base/") == ("https://tts.example.com/base",
                                                          "wss://tts.example.com/base/v1/stream")


def test_synthesize_yields_ordered_audio_then_done(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            events = [e async for e in client.synthesize("Hello there. How are you?", options=FAST, progress=True)]
            return events, client.ready

    events, ready = run(go())
    assert isinstance(events[0], Accepted)
    assert isinstance(events[-1], Done)
    audio = [e for e in events if isinstance(e, AudioChunk)]
    assert [a.chunk for a in audio] == list(range(len(audio)))
    assert audio[-1].final and not any(a.final for a in audio[:-1])
    assert all(len(a.data) == 2 * a.samples and a.sample_rate == ready.sample_rate for a in audio)
    assert events[-1].chunks == len(audio)
    assert events[-1].audio_seconds == pytest.approx(sum(a.samples for a in audio) / ready.sample_rate, abs=1e-3)


def test_audio_carries_when_it_came_off_the_socket(chorus_url):
    """`received_at` is stamped by the reader as each frame arrives: after the text that asked
    for it was sent, no later than the caller sees the chunk, in arrival order."""

    async def go():
        async with ChorusClient(chorus_url) as client:
            await client.connect()
            async with client.stream(options=FAST) as stream:
                await stream.append(ANSWER)
                sent_at = time.perf_counter()
                await stream.close()
                seen = [(event, time.perf_counter()) async for event in stream]
            return sent_at, seen

    sent_at, seen = run(go())
    audio = [(e, at) for e, at in seen if isinstance(e, AudioChunk)]
    assert len(audio) > 1 and isinstance(seen[-1][0], Done)
    assert all(sent_at <= e.received_at <= at for e, at in audio)
    arrivals = [e.received_at for e, _ in audio]
    assert arrivals == sorted(arrivals)


def test_parse_audio_keeps_the_given_arrival_time():
    head = json.dumps({"id": "a", "sample_rate": 24000, "encoding": "pcm_s16le", "samples": 2}).encode()
    frame = struct.pack(">I", len(head)) + head + b"\x00\x00\x01\x00"
    assert parse_audio(frame, received_at=12.5).received_at == 12.5
    before = time.perf_counter()
    assert before <= parse_audio(frame).received_at <= time.perf_counter()


def test_requests_and_streams_share_one_connection(chorus_url):
    async def speak_stream(client):
        async with client.stream(options=FAST) as stream:
            for word in ANSWER.split(" "):
                await stream.append(word + " ")
            await stream.close()
            return await stream.collect()

    async def go():
        async with ChorusClient(chorus_url) as client:
            texts = ["One request.", "A second request, a bit longer.", "And a third."]
            results = await asyncio.gather(*[client.synthesize(t, options=FAST).collect() for t in texts],
                                           speak_stream(client))
            return results, client.connections_opened

    results, opened = run(go())
    assert opened == 1
    for result in results:
        assert result.done is not None and result.audio
        assert len(result.audio) == 2 * result.samples
    stream = results[-1]
    # segments back to back, in order, and the audio is exactly theirs
    offsets = [s.offset_samples for s in stream.segments]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for seg, nxt in zip(stream.segments, stream.segments[1:]):
        assert seg.offset_samples + seg.samples == nxt.offset_samples
    assert stream.samples == sum(s.samples for s in stream.segments)
    assert " ".join(s.text for s in stream.segments).split() == ANSWER.split()


def test_cancel_mid_stream_stops_audio_and_the_next_stream_starts_clean(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            stream = client.stream(options=SynthesisOptions(num_step=16, seed=1))
            async with stream:
                await stream.append(" ".join([ANSWER] * 4))
                await stream.close()
                before, after = [], []
                async for event in stream:
                    if isinstance(event, AudioChunk):
                        (after if stream.cancel_requested else before).append(event)
                        if not stream.cancel_requested:
                            await stream.cancel()
                    last = event
            nxt = client.stream(options=FAST, text="Next turn.")
            async with nxt:
                await nxt.close()
                second = await nxt.collect()
            return before, after, last, second

    before, after, last, second = run(go())
    assert len(before) == 1 and after == []
    assert isinstance(last, Cancelled)
    assert second.done is not None and second.chunks[0].offset_samples == 0
    assert [s.segment for s in second.segments] == [0]


def test_typed_errors_carry_the_protocol_code_and_field(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            errors = []
            for kwargs in ({"options": {"num_step": 999}}, {"voice": "no-such-voice"},
                           {"text": "x" * (client_limit := (await client.connect()).limits["max_text_chars"]) + "y"}):
                text = kwargs.pop("text", "Hello.")
                with pytest.raises(Exception) as info:
                    await client.synthesize(text, **kwargs).collect()
                errors.append(info.value)
            # the connection survives errors: a good request still works
            ok = await client.synthesize("Still here.", options=FAST).collect()
            return errors, ok, client_limit

    (bad_option, no_voice, too_long), ok, _ = run(go())
    assert isinstance(bad_option, InvalidRequestError) and bad_option.field == "options.num_step"
    assert isinstance(no_voice, VoiceNotFoundError) and no_voice.code == "voice_not_found"
    assert isinstance(too_long, TextTooLongError)
    assert ok.done is not None


def test_newer_protocol_fields_pass_through(chorus_url):
    frame = request_frame("stream_open", "s1", options=SynthesisOptions(first_chunk_seconds=1.5, seed=2),
                          timestamps="word", keep_voice=True)
    assert frame == {"type": "stream_open", "id": "s1", "options": {"first_chunk_seconds": 1.5, "seed": 2},
                     "timestamps": "word", "keep_voice": True}
    assert "timestamps" not in request_frame("synthesize", "r1", text="Hi")

    async def go():
        async with ChorusClient(chorus_url) as client:
            outcomes = {}
            for name, kwargs in (("timestamps", {"timestamps": "word"}), ("keep_voice", {"keep_voice": True})):
                try:
                    outcomes[name] = await client.synthesize("Hello there.", options=FAST, **kwargs).collect()
                except InvalidRequestError as exc:
                    outcomes[name] = exc
            return outcomes

    for name, outcome in run(go()).items():
        if isinstance(outcome, InvalidRequestError):  # a server of an earlier wave names the field it lacks
            assert outcome.field == name
        elif name == "timestamps":
            assert outcome.words and all(w.end_samples >= w.start_samples for ws in outcome.words for w in ws.words)
        else:
            assert outcome.done.voice_id


def test_voice_library_upload_use_delete(chorus_url, reference_wav):
    async def go():
        async with ChorusClient(chorus_url) as client:
            voice = await client.upload_voice(reference_wav, "A short test clip.", name="client-test-voice")
            listed = [v.id for v in await client.list_voices()]
            fetched = await client.voices.get(voice.id)
            spoken = await client.synthesize("In the saved voice.", voice=voice.id, options=FAST).collect()
            cloned = await client.synthesize("In a one-shot clone.", options=FAST,
                                             reference=Reference(reference_wav, "A short test clip.")).collect()
            await client.delete_voice(voice.id)
            after = [v.id for v in await client.list_voices()]
            with pytest.raises(VoiceNotFoundError) as gone:
                await client.delete_voice(voice.id)
            return voice, listed, fetched, spoken, cloned, after, gone.value

    voice, listed, fetched, spoken, cloned, after, gone = run(go())
    assert voice.name == "client-test-voice" and voice.seconds and voice.seconds > 1
    assert voice.id in listed and voice.id not in after
    assert fetched.id == voice.id
    assert spoken.done is not None and cloned.done is not None
    assert gone.status == 404


def test_the_http_client_is_made_on_the_first_voice_call_only(chorus_url):
    """An agent that only streams builds no HTTP client (its pool and TLS context cost more
    than the rest of the client); the first voice-library call makes it, `close` ends it."""

    async def go():
        client = ChorusClient(chorus_url)
        await client.synthesize("Only speech.", options=FAST).collect()
        streamed_only = client._http
        await client.list_voices()
        made = client._http
        await client.close()
        return streamed_only, made, client._http

    streamed_only, made, closed = run(go())
    assert streamed_only is None and isinstance(made, httpx.AsyncClient) and made.is_closed and closed is None


def test_busy_and_http_errors_keep_the_retry_hint():
    busy = error_from({"type": "error", "id": "r1", "code": "busy", "message": "full", "retry_after_ms": 250})
    assert isinstance(busy, BusyError) and busy.retry_after_ms == 250 and busy.request_id == "r1"
    response = httpx.Response(503, headers={"Retry-After": "2"},
                              json={"error": {"code": "busy", "message": "the server is full"}})
    http = http_error(response)
    assert isinstance(http, BusyError) and http.retry_after_ms == 2000 and http.status == 503
    unknown = error_from({"code": "something_new", "message": "?"})
    assert type(unknown) is ChorusError and unknown.code == "something_new"


def test_ping(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            await client.ping()
            await client.ping()
            return client.connections_opened

    assert run(go()) == 1


@pytest.fixture(scope="module")
def keyed_server(client_checkpoint, tmp_path_factory):
    """A server with an API key and a small frame limit (an oversized frame closes the socket: 1009)."""
    server = ChorusProcess(client_checkpoint, tmp_path_factory.mktemp("keyed"), "--api-key", "sekret",
                           "--max-frame-bytes", "64K").start()
    yield server
    server.stop()


def test_api_key(keyed_server):
    async def go():
        async with ChorusClient(keyed_server.url, api_key="wrong", reconnect_attempts=0) as bad:
            with pytest.raises(UnauthorizedError):
                await bad.synthesize("Hello.", options=FAST).collect()
            with pytest.raises(UnauthorizedError) as http:
                await bad.list_voices()
        async with ChorusClient(keyed_server.url, api_key="sekret") as good:
            result = await good.synthesize("Hello.", options=FAST).collect()
            voices = await good.list_voices()
        return http.value, result, voices

    http_error, result, voices = run(go())
    assert http_error.status == 401
    assert result.done is not None and isinstance(voices, list)


def test_reconnects_after_the_server_closes_the_socket(keyed_server, reference_wav):
    async def go():
        async with ChorusClient(keyed_server.url, api_key="sekret") as client:
            first = await client.synthesize("Before.", options=FAST).collect()
            running = client.stream(options=FAST)
            await running.start()
            # a frame over the server's --max-frame-bytes: the server closes with 1009
            big = Reference(reference_wav * 3, "An oversized reference.")
            with pytest.raises(ConnectionLostError) as lost:
                await client.synthesize("Too big.", reference=big, options=FAST).collect()
            with pytest.raises(ConnectionLostError):
                await running.collect()  # the stream in flight on that socket ends too
            after = await client.synthesize("After.", options=FAST).collect()
            return first, lost.value, after, client.connections_opened

    first, lost, after, opened = run(go())
    assert "1009" in str(lost)
    assert first.done is not None and after.done is not None
    assert opened == 2


def test_reconnects_after_a_server_restart(keyed_server):
    async def go():
        async with ChorusClient(keyed_server.url, api_key="sekret", reconnect_attempts=10) as client:
            before = await client.synthesize("Before the restart.", options=FAST).collect()
            keyed_server.stop()  # the drain closes the socket (1001)
            await asyncio.to_thread(keyed_server.start)  # the same port
            after = await client.synthesize("After the restart.", options=FAST).collect()
            return before, after, client.connections_opened

    before, after, opened = run(go())
    assert before.done is not None and after.done is not None
    assert opened == 2


@pytest.mark.parametrize("encoding,width", [("f32le", 4), ("mulaw", 1)])
def test_encodings_and_rates(chorus_url, encoding, width):
    async def go():
        async with ChorusClient(chorus_url) as client:
            return await client.synthesize("Hello there.", encoding=encoding, sample_rate=16000,
                                           options=FAST).collect()

    result = run(go())
    assert all(c.encoding == encoding and c.sample_rate == 16000 for c in result.chunks)
    assert len(result.audio) == width * result.samples
