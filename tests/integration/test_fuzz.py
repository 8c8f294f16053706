"""Fuzzing a real `chorus serve` with Hypothesis: WebSocket frames and HTTP bodies made of
random JSON, wrong types, huge numbers, deep nesting, binary garbage, odd unicode and
truncated audio files. The server stays up and answers every fuzzed frame or body with a
well-formed reply (never a 500, never a dropped connection); meanwhile a well-behaved
client on its own connection keeps getting byte-identical audio for its seeded request."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from collections import Counter
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings, strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from server.voices.builtin import BUILTIN_NAMES
from server.wire import messages as p
from server.wire.speech_body import parse_speech_request
from tests.conftest import make_reference_clip
from tests.support.chorus_client import Session, check_request
from tests.support.serverproc import ChorusServer

FRAME_LIMIT = 256 * 1024
SERVER_TYPES = {"ready", "accepted", "progress", "done", "cancelled", "error", "pong"}
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    s = ChorusServer(tiny_checkpoint, tmp_path_factory.mktemp("fuzz"), "--max-frame-bytes", "256K",
                     "--max-reference-bytes", "64K", "--max-reference-seconds", "3", "--max-packed-tokens", "4096",
                     "--max-inflight", "8", "--max-voices", "20").start()
    yield s
    s.stop()


class WellBehaved:
    """Another client, the whole time: the same seeded request again and again. Each must
    pass every protocol check and give the same audio as the first."""

    def __init__(self, server: ChorusServer):
        self.server = server
        self.stop = threading.Event()
        self.done = 0
        self._progress = threading.Condition()
        self.failures: list[str] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        try:
            s = await Session.open(self.server.ws_url)
            first = None
            while not self.stop.is_set():
                rid = f"g{self.done}"
                await s.synthesize(rid, "A well behaved request.", options={"num_step": 3, "seed": 11})
                out = (await asyncio.wait_for(s.collect([rid]), timeout=120))[rid]
                check_request(out, num_step=3)
                first = first if first is not None else out.payload
                assert out.payload == first, "the audio changed"
                with self._progress:
                    self.done += 1
                    self._progress.notify_all()
            await s.close()
        except Exception as exc:  # noqa: BLE001 - reported by check()
            self.failures.append(repr(exc))

    def __enter__(self) -> WellBehaved:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._progress:  # at least one request passes alongside, however fast the rest went
            self._progress.wait_for(lambda: self.done >= 1 or not self.thread.is_alive(), 120)
        self.stop.set()
        self.thread.join(180)

    def wait_done(self, count: int, timeout: float = 120.0) -> None:
        """Until `count` requests have passed (or the client failed): no time decides the test."""
        with self._progress:
            self._progress.wait_for(lambda: self.done >= count or not self.thread.is_alive(), timeout)
        assert self.done >= count, (self.failures, self.done)

    def check(self) -> None:
        assert not self.thread.is_alive(), "the well-behaved client hangs"
        assert self.failures == [] and self.done >= 1, (self.failures, self.done)


def server_is_fine(server: ChorusServer) -> None:
    assert server.proc.poll() is None, "the server died"
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    assert httpx.get(server.url + "/readyz", timeout=30).status_code == 200
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-4000:]


# ---- strategies ------------------------------------------------------------------------

ODD_TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from([
    "", " ", "\x00", "\u202e\u0644\u0627 RTL", "e\u0301\u0301\u0301", "\U0001F600" * 30, "\ufeff\u2028\u2029",
    "<|denoise|><|lang_start|>", "[laughter]" * 20, "\\ud800", "x" * 6000, "a\r\nb\tc",
])
HUGE_INT = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**30)]) | st.integers()
JSON = st.recursive(
    st.none() | st.booleans() | HUGE_INT | st.floats(allow_nan=False, allow_infinity=False) | ODD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4),
    max_leaves=16,
)
OPTION_NAMES = list(p.Options.__struct_fields__) + ["num_steps", "bogus"]
FIELD_NAMES = ["text", "voice", "reference", "instruct", "language", "encoding", "stream", "progress", "options",
               "extra"]


def audio_file(fmt: str) -> bytes:
    buf = io.BytesIO()
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}[fmt]
    sf.write(buf, make_reference_clip(1.0), 16000, format=fmt, subtype=subtype)
    return buf.getvalue()


AUDIO = {fmt: audio_file(fmt) for fmt in ("WAV", "FLAC", "OGG", "MP3")}


@st.composite
def truncated_audio(draw) -> bytes:
    data = bytearray(AUDIO[draw(st.sampled_from(sorted(AUDIO)))])
    data = data[: draw(st.integers(0, len(data)))]
    for position in draw(st.lists(st.integers(0, 10**6), max_size=3)):
        if data:
            data[position % len(data)] ^= draw(st.integers(1, 255))
    return bytes(data)


@st.composite
def synthesize_like(draw) -> dict:
    """A synthesize frame with some fields right, some wrong, some missing."""
    frame: dict = {"type": "synthesize", "id": draw(st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True) | JSON)}
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=5, unique=True)):
        frame[name] = draw(JSON)
    if draw(st.booleans()):
        frame["text"] = draw(ODD_TEXT)
    if draw(st.booleans()):
        frame["options"] = {k: draw(JSON | st.integers(-5, 100) | st.floats())
                            for k in draw(st.lists(st.sampled_from(OPTION_NAMES), max_size=4, unique=True))}
    if draw(st.integers(0, 4)) == 0:
        frame["reference"] = {"audio": base64.b64encode(draw(truncated_audio())).decode(), "text": "Hi."}
        frame.pop("voice", None)
    return frame


def nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


RAW_TEXT = st.one_of(
    # deep, yet within the frame limit (a dict level is 6 bytes): over it is a 1009 close, tested below
    st.builds(nested, st.integers(1, FRAME_LIMIT // 6 - 1), st.sampled_from(["list", "dict"])),
    st.builds(lambda n: '{"type":"synthesize","id":"n","text":"x","options":{"seed":' + "9" * n + "}}",
              st.integers(1, 5000)),
    st.sampled_from(['{"type":"synthesize","id":"s","text":"\\ud800\\udc00\\udfff"}', "NaN", "Infinity",
                     '{"type":"synthesize","id":"f","text":"x","options":{"duration":1e999}}',
                     '{"type":"synthesize","id":"d","text":"x","options":{"duration":1e300,"num_step":64}}',
                     '{"type":"synthesize","id":"z","text":"x","options":{"speed":0.25,"chunk_seconds":1e-300}}',
                     '{"type": "cancel", "id": []}', '{"type": {"x": 1}}', '{"type":"ping"', "\x00" * 100]),
    ODD_TEXT,
)
FRAME = st.one_of(
    JSON.map(lambda v: json.dumps(v)),
    st.builds(lambda kind, v: json.dumps({"type": kind, "id": v}), st.sampled_from(["cancel", "ping", "nope"]), JSON),
    synthesize_like().map(json.dumps),
    RAW_TEXT,
    st.binary(max_size=2000),
)


# ---- the WebSocket ---------------------------------------------------------------------


def owed_replies(frames: list[str | bytes]) -> Counter:
    """Per id, the frames owed an `accepted` or an error with that id: those that parse as
    `synthesize`, and those refused with their id."""
    owed: Counter = Counter()
    for frame in frames:
        try:
            message = p.parse_client_message(frame) if isinstance(frame, str) else None
        except p.ProtocolError as exc:
            if exc.request_id is not None:
                owed[exc.request_id] += 1
            continue
        if isinstance(message, p.Synthesize):
            owed[message.id] += 1
    return owed


STATS: Counter = Counter()


def exchange(url: str, frames: list[str | bytes]) -> None:
    """Send the frames on one connection; check every reply; every accepted request is
    cancelled and must end exactly once; the connection must stay open throughout."""
    owed = owed_replies(frames)
    accepted: set[str] = set()
    ended: set[str] = set()
    got_pong = False
    with connect(url, max_size=None, open_timeout=60) as ws:
        assert json.loads(ws.recv(timeout=60))["type"] == "ready"
        for frame in frames:
            ws.send(frame)
        ws.send('{"type":"ping"}')
        while not (got_pong and not +owed and accepted <= ended):
            try:
                reply = ws.recv(timeout=60)
            except TimeoutError:
                raise AssertionError(f"no reply within 60 s; owed {+owed}, pending {accepted - ended}") from None
            if isinstance(reply, bytes):
                header, payload = p.split_audio_frame(reply)
                assert header["id"] in accepted - ended and len(payload) == header["samples"] * (
                    2 if header["encoding"] == "pcm_s16le" else 4)
                continue
            msg = json.loads(reply)
            kind, rid = msg["type"], msg.get("id")
            assert kind in SERVER_TYPES, msg
            STATS[kind if kind != "error" else msg["code"]] += 1
            if kind == "pong":
                got_pong = True
            elif kind == "accepted":
                assert rid not in accepted - ended and owed[rid] > 0, msg
                owed[rid] -= 1
                accepted.add(rid)
                ended.discard(rid)
                ws.send(json.dumps({"type": "cancel", "id": rid}))
            elif kind == "error":
                assert msg["code"] in p.ERROR_CODES and isinstance(msg["message"], str) and msg["message"], msg
                # never `internal`, so never the end of an accepted request: a refusal (a
                # second frame with an id in flight gets duplicate_id, before or after the
                # first one's `accepted`)
                assert msg["code"] not in ("internal", "unauthorized"), msg
                if rid is not None:
                    assert owed[rid] > 0, msg
                    owed[rid] -= 1
            elif kind in ("done", "cancelled"):
                assert rid in accepted - ended, msg
                ended.add(rid)


def test_websocket_fuzz(server):
    @FUZZ
    @given(frames=st.lists(FRAME, min_size=1, max_size=6))
    def fuzz(frames):
        exchange(server.ws_url, frames)

    with WellBehaved(server) as good:
        fuzz()
    good.check()
    server_is_fine(server)
    assert STATS["accepted"] > 0 and STATS["bad_message"] > 0 and STATS["invalid_request"] > 0, STATS


def test_a_frame_over_the_limit_closes_1009_and_only_that_connection(server):
    with WellBehaved(server) as good, connect(server.ws_url, max_size=None) as ws:
        ws.recv()
        good.wait_done(1)
        with pytest.raises(ConnectionClosed) as info:  # the close may come while it is sent
            ws.send('{"type":"ping","x":"' + "y" * FRAME_LIMIT + '"}')
            while True:
                ws.recv(timeout=60)
        assert info.value.rcvd.code == 1009
        good.wait_done(good.done + 1)  # the other connection goes on after the close
    good.check()
    server_is_fine(server)


# ---- HTTP ------------------------------------------------------------------------------

SPEECH_BODY = st.one_of(
    st.binary(max_size=3000),
    RAW_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={
        "input": ODD_TEXT | JSON, "model": JSON, "voice": ODD_TEXT | JSON, "instructions": ODD_TEXT | JSON,
        "response_format": st.sampled_from(["wav", "pcm", "flac", "mp3", ""]) | JSON,
        "speed": JSON | st.floats(0, 5), "num_step": st.integers(-3, 70) | JSON, "duration": JSON | st.floats(),
        "seed": HUGE_INT | JSON, "language": ODD_TEXT, "extra": JSON,
    }).map(lambda d: json.dumps(d).encode()),
)


def check_http(r: httpx.Response, ok: set[int]) -> None:
    assert r.status_code in ok | {400, 404, 405, 413, 415, 422, 503}, (r.status_code, r.text[:300])
    if r.status_code >= 400 and r.status_code != 405:
        error = r.json()["error"]
        assert error["code"] in p.ERROR_CODES and error["code"] not in ("internal", "unauthorized"), error
        assert isinstance(error["message"], str) and "object at 0x" not in error["message"], error


def test_http_fuzz(server):
    http = httpx.Client(base_url=server.url, timeout=120)

    @FUZZ
    @given(body=SPEECH_BODY, content_type=st.sampled_from(["application/json", "text/plain", "application/x-www"]))
    def speech(body, content_type):
        check_http(http.post("/v1/audio/speech", content=body, headers={"content-type": content_type}), {200})

    @FUZZ
    @given(audio=truncated_audio() | st.binary(max_size=3000), text=st.none() | ODD_TEXT, name=st.none() | ODD_TEXT,
           as_file=st.booleans())
    def upload(audio, text, name, as_file):
        data = {k: v for k, v in (("text", text), ("name", name)) if v is not None}
        files = {"audio": ("clip.bin", audio, "application/octet-stream")} if as_file else None
        if not as_file:
            data["audio"] = audio.decode("latin-1")
        r = http.post("/v1/voices", data=data, files=files)
        check_http(r, {201})
        if r.status_code == 201:
            assert http.delete(f"/v1/voices/{r.json()['id']}").status_code == 204

    @FUZZ
    @given(voice_id=ODD_TEXT | st.sampled_from(sorted(BUILTIN_NAMES)), method=st.sampled_from(["GET", "DELETE"]))
    def lookup(voice_id, method):
        r = http.request(method, "/v1/voices/" + quote(voice_id, safe=""))
        if method == "DELETE" and voice_id in BUILTIN_NAMES:  # refused, as docs/protocol.md says
            assert (r.status_code, r.json()["error"]["code"]) == (403, "invalid_request"), r.text[:300]
            return
        check_http(r, {200, 204})

    with WellBehaved(server) as good:
        speech()
        upload()
        lookup()
    good.check()
    http.close()
    server_is_fine(server)


def test_deeply_nested_json_is_bad_message_not_a_crash():
    for data in (nested(100_000, "list"), nested(100_000, "dict")):
        with pytest.raises(p.ProtocolError) as info:
            p.parse_client_message(data)
        assert (info.value.code, info.value.message) == ("bad_message", "not valid JSON: nested too deeply")
        with pytest.raises(p.ProtocolError) as info:
            parse_speech_request(data.encode())
        assert info.value.code == "bad_message"


def test_no_sample_is_lost_to_the_fuzz(server):
    """After all of it, a fresh client gets the same audio as before any fuzzing would."""
    async def go():
        s = await Session.open(server.ws_url)
        await s.synthesize("after", "A well behaved request.", options={"num_step": 3, "seed": 11})
        out = (await s.collect(["after"]))["after"]
        await s.close()
        return out

    out = asyncio.run(go())
    check_request(out, num_step=3)
    assert np.isfinite(out.samples).all()
