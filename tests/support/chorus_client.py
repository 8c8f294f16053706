"""A small protocol client for tests (real `websockets`), and the protocol's invariants.

`Session.collect(ids)` reads frames until each id has ended and returns every frame per
id, in arrival order; `check_request` asserts what docs/protocol.md promises about them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

from server.wire.messages import split_audio_frame

END_TYPES = ("done", "cancelled", "error")
DTYPES = {"pcm_s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}


@dataclass
class Audio:
    header: dict[str, Any]
    payload: bytes

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(self.payload, DTYPES[self.header["encoding"]])


@dataclass
class Outcome:
    id: str
    frames: list[dict[str, Any] | Audio] = field(default_factory=list)

    @property
    def end(self) -> dict[str, Any]:
        last = self.frames[-1]
        assert isinstance(last, dict) and last["type"] in END_TYPES, last
        return last

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if isinstance(f, dict) and f["type"] == kind]

    @property
    def audio(self) -> list[Audio]:
        return [f for f in self.frames if isinstance(f, Audio)]

    @property
    def payload(self) -> bytes:
        return b"".join(a.payload for a in self.audio)

    @property
    def samples(self) -> np.ndarray:
        return np.concatenate([a.samples for a in self.audio]) if self.audio else np.zeros(0)


class Session:
    """One WebSocket connection."""

    def __init__(self, ws: websockets.ClientConnection, ready: dict[str, Any]):
        self.ws = ws
        self.ready = ready
        self.unmatched: list[dict[str, Any]] = []  # frames for no pending id (pong, id-less errors)
        self.outcomes: dict[str, Outcome] = {}

    @classmethod
    async def open(cls, url: str, **kwargs) -> Session:
        ws = await websockets.connect(url, max_size=None, **kwargs)
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        return cls(ws, ready)

    async def close(self) -> None:
        await self.ws.close()

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def synthesize(self, id: str, text: str, **fields) -> None:
        self.outcomes[id] = Outcome(id)
        await self.send({"type": "synthesize", "id": id, "text": text, **fields})

    async def stream(self, id: str, pieces: list[str], close: bool = True, **fields) -> None:
        """Open text stream `id` (no progress frames unless `fields` ask), append `pieces`, and
        close it unless `close` is False."""
        self.outcomes[id] = Outcome(id)
        await self.send({"type": "stream_open", "id": id, "progress": False, **fields})
        for piece in pieces:
            await self.send({"type": "stream_append", "id": id, "text": piece})
        if close:
            await self.send({"type": "stream_close", "id": id})

    async def next_frame(self) -> dict[str, Any] | Audio:
        raw = await self.ws.recv()
        if isinstance(raw, bytes):
            header, payload = split_audio_frame(raw)
            return Audio(header, payload)
        return json.loads(raw)

    async def collect(self, ids: list[str] | None = None) -> dict[str, Outcome]:
        """Read until every id in `ids` (default: all pending) has an end frame (read now or
        before: an id that already ended is not waited for again)."""
        waiting = set(ids if ids is not None else self.outcomes)
        for i in list(waiting):
            outcome = self.outcomes.setdefault(i, Outcome(i))
            if outcome.frames and isinstance(outcome.frames[-1], dict) and outcome.frames[-1]["type"] in END_TYPES:
                waiting.discard(i)
        while waiting:
            frame = await self.next_frame()
            fid = frame.header["id"] if isinstance(frame, Audio) else frame.get("id")
            if fid not in self.outcomes:
                self.unmatched.append(frame)  # type: ignore[arg-type]
                continue
            self.outcomes[fid].frames.append(frame)
            if isinstance(frame, dict) and frame["type"] in END_TYPES:
                waiting.discard(fid)
        return {i: self.outcomes[i] for i in (ids if ids is not None else self.outcomes)}

    async def wait_for(self, id: str, kind: str) -> dict[str, Any]:
        """Read until a frame of `kind` for `id` arrives (other frames are kept)."""
        outcome = self.outcomes[id]
        while True:
            frame = await self.next_frame()
            fid = frame.header["id"] if isinstance(frame, Audio) else frame.get("id")
            if fid in self.outcomes:
                self.outcomes[fid].frames.append(frame)
            else:
                self.unmatched.append(frame)  # type: ignore[arg-type]
            if fid == id and isinstance(frame, dict) and frame["type"] in (kind, *END_TYPES):
                assert frame["type"] == kind, f"{id} ended before {kind}: {outcome.frames[-1]}"
                return frame

    async def occupy(self, ids: list[str], text: str, **fields) -> None:
        """Submit a request for each id and wait until each is stepping (its first `progress`):
        work that holds its slots while a test hits a limit."""
        for rid in ids:
            await self.synthesize(rid, text, **fields)
        for rid in ids:
            await self.wait_for(rid, "progress")

    async def expect_error(self, code: str, id: str | None = None) -> dict[str, Any]:
        """The next id-`id` error frame (frames of other requests are kept, not lost)."""
        while True:
            frame = await self.next_frame()
            fid = frame.header["id"] if isinstance(frame, Audio) else frame.get("id")
            if isinstance(frame, dict) and frame["type"] == "error" and fid == id:
                if id is not None and id in self.outcomes and not self.outcomes[id].frames:
                    self.outcomes.pop(id)  # refused before it was accepted
                assert frame["code"] == code, frame
                return frame
            if fid in self.outcomes:
                self.outcomes[fid].frames.append(frame)
            else:
                self.unmatched.append(frame)  # type: ignore[arg-type]


async def request_once(url: str, id: str, text: str, **fields) -> Outcome:
    """One request on a connection of its own (no progress frames unless asked), read to its end."""
    session = await Session.open(url)
    try:
        await session.synthesize(id, text, **{"progress": False, **fields})
        return (await session.collect([id]))[id]
    finally:
        await session.close()


async def stream_once(url: str, pieces: list[str], id: str = "s", **fields) -> Outcome:
    """One text stream on a connection of its own (`Session.stream`), read to its end."""
    session = await Session.open(url)
    try:
        await session.stream(id, pieces, **fields)
        return (await session.collect([id]))[id]
    finally:
        await session.close()


def check_request(outcome: Outcome, *, num_step: int, encoding: str = "pcm_s16le", stream: str = "chunk",
                  progress: bool = True, sample_rate: int = 24000) -> None:
    """Everything docs/protocol.md promises about one successful request's frames."""
    frames = outcome.frames
    assert frames and isinstance(frames[0], dict) and frames[0]["type"] == "accepted", frames[:1]
    accepted = frames[0]
    chunks = accepted["chunks"]
    assert chunks >= 1 and len(accepted["target_seconds"]) == chunks
    done = outcome.end
    assert done["type"] == "done", done
    assert sum(1 for f in frames if isinstance(f, dict) and f["type"] in ("accepted", *END_TYPES)) == 2

    # progress: at most one per chunk and step; all of them when asked for, none otherwise
    prog = outcome.of("progress")
    if progress:
        seen = [(f["chunk"], f["step"]) for f in prog]
        assert len(seen) == len(set(seen))
        assert set(seen) == {(c, s) for c in range(chunks) for s in range(1, num_step + 1)}
        assert all(f["num_steps"] == num_step for f in prog)
        fractions = [f["fraction"] for f in prog]
        assert all(0 < x <= 1 for x in fractions) and fractions == sorted(fractions) and fractions[-1] == 1.0
    else:
        assert prog == []

    # audio: in text order, final on the last, header sample counts equal the payload
    audio = outcome.audio
    expected_frames = 1 if stream == "whole" else chunks
    assert [a.header["chunk"] for a in audio] == list(range(expected_frames))
    assert [a.header["final"] for a in audio] == [False] * (expected_frames - 1) + [True]
    for a in audio:
        h = a.header
        assert (h["type"], h["sample_rate"], h["encoding"]) == ("audio", sample_rate, encoding)
        assert h["samples"] > 0 and len(a.payload) == h["samples"] * DTYPES[encoding].itemsize
        if progress and stream == "chunk":  # a chunk's audio follows all of its progress
            position = frames.index(a)
            assert all(frames.index(f) < position for f in prog if f["chunk"] == h["chunk"])
    assert frames.index(audio[-1]) == len(frames) - 2  # done right after the final audio
    assert done["chunks"] == expected_frames
    total = sum(a.header["samples"] for a in audio)
    assert abs(done["audio_seconds"] - total / sample_rate) < 1e-3
    t = done["timings"]
    assert 0 <= t["queue_ms"] <= t["total_ms"] and 0 <= t["first_audio_ms"] <= t["total_ms"]


def metric_value(base_url: str, sample: str, **labels: str) -> float:
    """One sample of `GET /metrics` (0 when absent), e.g. `chorus_requests_total`."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0
