"""A stand-in for the protocol's third-wave frames that `chorus serve` does not send yet
(`words` with `timestamps`, `done.voice_id` with `keep_voice`), written from
docs/PROTOCOL's text: a real `websockets` server that answers `synthesize` and text streams
with one silent segment per request, its `words` frame (words spread evenly over the
segment) and `done`. Only the client-side mapping of those frames is tested against it;
everything else is tested against the real server."""

from __future__ import annotations

import json
import struct
from contextlib import asynccontextmanager

from websockets.asyncio.server import ServerConnection, serve

SAMPLES_PER_WORD = 4000


def audio_frame(header: dict, payload: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + payload


async def speak(ws: ServerConnection, request: dict, text: str, *, stream: bool) -> None:
    rid, rate = request["id"], request.get("sample_rate", 24000)
    words = text.split()
    samples = SAMPLES_PER_WORD * len(words)
    header = {"type": "audio", "id": rid, "chunk": 0, "final": True, "sample_rate": rate,
              "encoding": "pcm_s16le", "samples": samples}
    if stream:
        header.update(segment=0, offset_samples=0)
    await ws.send(audio_frame(header, b"\x00\x00" * samples))
    timed = [{"text": w, "start_samples": i * SAMPLES_PER_WORD, "end_samples": (i + 1) * SAMPLES_PER_WORD - 1}
             for i, w in enumerate(words)]
    if request.get("timestamps"):
        frame = {"type": "words", "id": rid, "source": "model", "words": timed}
        if stream:
            frame["segment"] = 0
        await ws.send(json.dumps(frame))
    if stream:
        await ws.send(json.dumps({"type": "segment", "id": rid, "segment": 0, "text": text, "offset_samples": 0,
                                  "samples": samples}))
    done = {"type": "done", "id": rid, "chunks": 1, "audio_seconds": samples / rate, "timings": {}}
    if request.get("keep_voice"):
        done["voice_id"] = f"kept-{rid}"
    await ws.send(json.dumps(done))


async def handle(ws: ServerConnection) -> None:
    await ws.send(json.dumps({"type": "ready", "protocol": 1, "model": "third-wave", "sample_rate": 24000,
                              "encodings": ["pcm_s16le"], "sample_rates": [16000, 24000], "limits": {}}))
    streams: dict[str, tuple[dict, list[str]]] = {}
    async for message in ws:
        msg = json.loads(message)
        kind, rid = msg["type"], msg.get("id")
        if kind == "synthesize":
            await ws.send(json.dumps({"type": "accepted", "id": rid, "chunks": 1, "target_seconds": [1.0]}))
            await speak(ws, msg, msg["text"], stream=False)
        elif kind == "stream_open":
            streams[rid] = (msg, [msg.get("text", "")])
            await ws.send(json.dumps({"type": "accepted", "id": rid, "chunks": None, "target_seconds": []}))
        elif kind == "stream_append":
            streams[rid][1].append(msg["text"])
        elif kind == "stream_close":
            request, pieces = streams.pop(rid)
            await speak(ws, request, "".join(pieces), stream=True)
        elif kind == "cancel":
            streams.pop(rid, None)
            await ws.send(json.dumps({"type": "cancelled", "id": rid}))


@asynccontextmanager
async def third_wave_server():
    """The server's base URL while the block runs."""
    async with serve(handle, "127.0.0.1", 0, process_request=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"
