"""The service layer's own logic against a scripted engine: ordering and failure paths."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from litestar.testing import TestClient

from server.app import create_app
from server.config import ServerConfig
from server.engine.types import Accepted, ChunkAudio, Finished, Progress, SynthesisRequest
from server.metrics import Metrics
from server.turns.service import ServiceError, SynthesisService
from server.voices import VoiceStore
from server.wire import messages as p
from tests.support.fake_engine import FakeEngine


def run_one(service: SynthesisService, request: SynthesisRequest) -> list:
    async def go() -> list:
        events: list = []
        done = asyncio.Event()

        def deliver(event) -> None:
            events.append(event)
            if isinstance(event, Finished):
                done.set()

        await service.submit(request, deliver, "test")
        await done.wait()
        return events

    return asyncio.run(go())


@pytest.fixture
def service(tmp_path):
    return SynthesisService(FakeEngine(), VoiceStore(tmp_path / "v"), Metrics(), max_queue=4)


def test_audio_is_released_in_text_order(service):
    events = run_one(service, SynthesisRequest("r1", "One. Two. Three. Four."))
    audio = [e for e in events if isinstance(e, ChunkAudio)]
    assert [a.chunk for a in audio] == [0, 1, 2, 3] and [a.final for a in audio] == [False] * 3 + [True]
    assert isinstance(events[-1], Finished) and events[-1].outcome == "done"
    # every progress event of chunk 0 came before its audio
    first_audio = events.index(audio[0])
    assert all(events.index(e) < first_audio for e in events if isinstance(e, Progress) and e.chunk == 0)
    assert service.inflight == 0


def test_error_drops_held_audio_and_ends_once(service):
    events = run_one(service, SynthesisRequest("r1", "fail. b. c."))
    assert not any(isinstance(e, ChunkAudio) for e in events)  # chunk 2 came first and was held
    assert [e.outcome for e in events if isinstance(e, Finished)] == ["error"]
    text = service.metrics.render().decode()
    assert 'chorus_requests_total{endpoint="test",outcome="error"} 1.0' in text


class SteppedBeforeAnswered(FakeEngine):
    """Runs a request to its end before `submit` returns: its events reach the event loop ahead
    of its `Accepted`, as a real engine's do when it steps while the plan's answer crosses
    from the planner thread."""

    def submit(self, request, sink) -> Accepted:
        sink(Progress(request.request_id, 0, 1, 1, 1.0))
        sink(ChunkAudio(request.request_id, 0, np.zeros(100, np.float32), self.sample_rate, final=True))
        sink(Finished(request.request_id, "done", None, 100 / 24000, 1.0, 2.0, 3.0))
        return Accepted(request.request_id, 1, [1.0])


def test_no_event_reaches_the_caller_before_it_has_its_accepted(tmp_path):
    service = SynthesisService(SteppedBeforeAnswered(), VoiceStore(tmp_path / "v"), Metrics(), max_queue=4)

    async def go() -> list[str]:
        seen: list[str] = []
        done = asyncio.Event()

        def deliver(event) -> None:
            seen.append(type(event).__name__)
            if isinstance(event, Finished):
                done.set()

        await service.submit(SynthesisRequest("r1", "Hi."), deliver, "test")
        seen.append("accepted")  # what a door sends first, before it next awaits
        await done.wait()
        return seen

    assert asyncio.run(go()) == ["accepted", "Progress", "ChunkAudio", "Finished"]
    assert service.inflight == 0


def test_rejections_and_busy(service):
    with pytest.raises(ServiceError) as info:
        run_one(service, SynthesisRequest("r1", "reject me"))
    assert (info.value.code, info.value.message) == ("invalid_request", "instruct: not a known voice attribute")
    service.max_queue = 0
    with pytest.raises(ServiceError) as info:
        run_one(service, SynthesisRequest("r2", "Hi."))
    assert info.value.code == "busy"


def test_internal_error_reaches_the_websocket_and_the_connection_lives_on(tmp_path):
    cfg = ServerConfig(voices_dir=tmp_path / "voices", model_name="fake")
    with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://test.localhost") as client, \
            client.websocket_connect("/v1/stream") as ws:
        assert ws.receive_json()["type"] == "ready"
        ws.send_text(json.dumps({"type": "synthesize", "id": "bad", "text": "fail now. and more.", "progress": False}))
        ws.send_text(json.dumps({"type": "synthesize", "id": "good", "text": "One. Two.", "progress": False}))
        ends, audio = {}, []
        while len(ends) < 2:
            message = ws.receive()
            if message.get("bytes"):
                header, payload = p.split_audio_frame(message["bytes"])
                audio.append((header["id"], header["chunk"], len(payload)))
                continue
            frame = json.loads(message["text"])
            if frame["type"] in ("done", "error", "cancelled"):
                ends[frame["id"]] = frame
        assert ends["bad"]["code"] == "internal" and "boom" in ends["bad"]["message"]
        assert ends["good"]["type"] == "done" and ends["good"]["chunks"] == 2
        assert [a for a in audio if a[0] == "good"] == [("good", 0, 200), ("good", 1, 400)]
        ws.send_text('{"type": "ping"}')
        assert ws.receive_json() == {"type": "pong"}
