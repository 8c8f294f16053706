"""Text streams seen from inside a real engine (tiny checkpoint, the real app, Litestar's
TestClient): every segment after the first is conditioned on the first segment's finished
tokens in automatic and design mode (the canvas the engine steps holds them as its reference
audio, and the first segment's text as the reference text), a reference voice is every
segment's voice, and a stream never has more segments in the engine than its limit."""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from server.app import create_app
from server.config import EngineSettings, ServerConfig, StreamLimits
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.pool import EnginePool
from server.engine.types import ChunkTokens, Finished
from server.wire import messages as p

SEGMENT_LIMIT = 2


class Watch:
    """What the engine got: each request, its first chunk's finished tokens, each canvas built,
    and the most segments of one stream live at once."""

    def __init__(self, engine: EngineLoop):
        self.requests: dict[str, object] = {}
        self.tokens: dict[str, np.ndarray] = {}
        self.canvases: dict[str, torch.Tensor] = {}
        self.live: set[str] = set()
        self.most_live = 0
        self.lock = threading.Lock()
        real_submit, real_add = engine.submit, engine.scheduler.add

        def submit(request, sink, **admission):
            def watched(event):
                with self.lock:
                    if isinstance(event, ChunkTokens) and event.chunk == 0:
                        self.tokens[event.request_id] = event.tokens
                    if isinstance(event, Finished):
                        self.live.discard(event.request_id)
                sink(event)

            with self.lock:
                self.requests[request.request_id] = request
                self.live.add(request.request_id)
                self.most_live = max(self.most_live, len(self.live))
            return real_submit(request, watched, **admission)

        def add(utt):
            self.canvases[utt.state.request_id] = utt.item.prefix_ids.detach().cpu().clone()
            return real_add(utt)

        engine.submit = submit
        engine.scheduler.add = add


@pytest.fixture(scope="module")
def app_engine(tiny_checkpoint, tmp_path_factory):
    from tests.support.engine_helpers import load_model

    engine = EngineLoop(load_model(tiny_checkpoint), EngineSettings())
    watch = Watch(engine)
    engine.start()
    cfg = ServerConfig(voices_dir=tmp_path_factory.mktemp("voices"), model_name="tiny",
                       stream=StreamLimits(max_segments_inflight=SEGMENT_LIMIT))
    with TestClient(create_app(cfg, engine=EnginePool([engine])), base_url="http://test.localhost") as client:
        yield client, watch
    engine.stop()


def speak(client: TestClient, open_fields: dict, pieces: list[str]) -> tuple[list[dict], list[dict]]:
    """One stream on its own socket; returns its segment frames and audio headers."""
    with client.websocket_connect("/v1/stream") as ws:
        assert ws.receive_json()["type"] == "ready"
        ws.send_text(json.dumps({"type": "stream_open", "id": "s", "progress": False, **open_fields}))
        for piece in pieces:
            ws.send_text(json.dumps({"type": "stream_append", "id": "s", "text": piece}))
        ws.send_text(json.dumps({"type": "stream_close", "id": "s"}))
        segments, audio = [], []
        while True:
            message = ws.receive()
            if message.get("bytes"):
                audio.append(p.split_audio_frame(message["bytes"])[0])
                continue
            frame = json.loads(message["text"])
            if frame["type"] == "segment":
                segments.append(frame)
            elif frame["type"] in ("done", "error", "cancelled"):
                assert frame["type"] == "done", frame
                return segments, audio


def segment_ids(watch: Watch, count: int) -> list[str]:
    """The engine ids of the last stream's segments, in order."""
    ids = [rid for rid in watch.requests if rid.endswith("/s/0")]
    prefix = ids[-1][: -len("0")]
    return [f"{prefix}{k}" for k in range(count)]


SENTENCES = ["The first sentence sets the voice.", " Then a second one.", " A third!", " And the fourth?"]


@pytest.mark.parametrize("fields", [{}, {"instruct": "female, low pitch"}], ids=["automatic", "design"])
def test_every_later_segment_is_conditioned_on_the_first(app_engine, fields):
    client, watch = app_engine
    segments, _ = speak(client, {**fields, "options": {"num_step": 4, "seed": 11}},
                        re.findall(r"\S+|\s+", "".join(SENTENCES)))  # word by word
    assert [s["text"] for s in segments] == [s.strip() for s in SENTENCES]
    ids = segment_ids(watch, len(SENTENCES))
    first = watch.requests[ids[0]]
    assert first.voice is None and first.instruct == fields.get("instruct")
    first_tokens = watch.tokens[ids[0]]
    for rid in ids[1:]:
        request = watch.requests[rid]
        assert request.instruct == fields.get("instruct")
        voice = request.voice
        assert voice.text == segments[0]["text"] and voice.rms is None
        assert np.array_equal(np.asarray(voice.tokens), first_tokens)
        # the canvas the engine stepped: its reference audio columns are the first segment's tokens
        canvas = watch.canvases[rid]
        assert torch.equal(canvas[:, -first_tokens.shape[1]:], torch.from_numpy(first_tokens).long())


def test_a_reference_voice_is_every_segments_voice(app_engine, reference_clip):
    import base64
    import io

    import soundfile as sf

    client, watch = app_engine
    clip, rate = reference_clip
    buf = io.BytesIO()
    sf.write(buf, clip, rate, format="WAV", subtype="PCM_16")
    reference = {"audio": base64.b64encode(buf.getvalue()).decode(), "text": "A reference voice."}
    segments, _ = speak(client, {"reference": reference, "options": {"num_step": 4}}, SENTENCES)
    ids = segment_ids(watch, len(SENTENCES))
    voices = [watch.requests[rid].voice for rid in ids]
    assert all(v is voices[0] for v in voices) and voices[0].text == "A reference voice."
    assert voices[0].rms is not None  # the reference's own loudness, as for any cloned request
    assert len(segments) == len(SENTENCES)


def test_segments_in_flight_stay_within_the_limit(app_engine):
    client, watch = app_engine
    watch.most_live = 0
    text = " ".join(f"Sentence number {k} is here." for k in range(8))
    segments, audio = speak(client, {"voice": None, "options": {"num_step": 4}}, [text])
    assert len(segments) == 8
    assert watch.most_live == SEGMENT_LIMIT  # reached, never passed
    # the deadline hint: the first segment is due now; segments submitted once audio flows are
    # due when playback reaches them, later ones later
    dues = [watch.requests[rid].due_at for rid in segment_ids(watch, 8)]
    assert dues[0] is None and dues[-1] is not None
    known = [d for d in dues if d is not None]
    assert known == sorted(known)
    assert [a["segment"] for a in audio] == sorted(a["segment"] for a in audio)
