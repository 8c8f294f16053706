"""Engine failures as clients see them: the real app and a real engine (tiny checkpoint)
whose forward pass fails on chosen requests. A failure tied to one request ends that
request alone with `internal` (WebSocket) or 500 `internal` (HTTP); out-of-memory steps
are retried smaller and nobody notices; the connection and the engine carry on."""

from __future__ import annotations

import json
import time

import pytest
import torch
from litestar.testing import TestClient

from server.app import create_app
from server.config import EngineSettings, ServerConfig
from server.engine.model.runner import backbone_for
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.pool import EnginePool
from server.engine.scheduling.output import ScheduledBatch
from server.wire import messages as p

HOLD_LIMIT_S = 60.0  # a hold that never fills ends here, so a broken engine fails the test, not hangs it


class Faults:
    """Which items the forward pass fails on (by request id)."""

    def __init__(self) -> None:
        self.http = False  # fail HTTP requests (ids `h1`, `h2`, ...)
        self.oom_left = 0  # raise CUDA-style out-of-memory on this many multi-item forwards
        self.oom_sizes: list[int] = []  # the item counts of the forwards that ran out of memory
        self.hold_until = 0  # no step is scheduled until this many utterances are queued
        self.held_since: float | None = None

    def fails(self, request_id: str) -> bool:
        return request_id.endswith("/bad") or (self.http and request_id.startswith("h"))


@pytest.fixture(scope="module")
def faulty(tiny_checkpoint, tmp_path_factory):
    from tests.support.engine_helpers import load_model

    model, settings = load_model(tiny_checkpoint), EngineSettings()
    faults = Faults()
    real_forward = backbone_for(model, settings.attention).forward

    def schedule(now=None):
        """Hold the step boundary, not the forward: a forward's items are fixed by then, and
        a request admitted a moment later would miss the step the test means to share."""
        if faults.hold_until:
            faults.held_since = faults.held_since or time.monotonic()
            if len(engine.scheduler) < faults.hold_until and time.monotonic() - faults.held_since < HOLD_LIMIT_S:
                return ScheduledBatch([], 0)  # the loop takes commands and comes back
            faults.hold_until, faults.held_since = 0, None  # past the limit: the test's asserts say why
        return real_schedule(now)

    @torch.inference_mode()
    def forward(canvas):
        ids = [item.item_id.split("#")[0] for item in canvas.items]
        if any(faults.fails(i) for i in ids):
            raise RuntimeError("simulated failure tied to one item")
        if faults.oom_left and len(ids) > 1:
            faults.oom_left -= 1
            faults.oom_sizes.append(len(ids))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        logits = real_forward(canvas)
        for index, rid in enumerate(ids):
            if rid.endswith("/nan"):
                start = canvas.cond_offsets[index]
                logits[start : start + 2] = float("nan")
        return logits

    engine = EngineLoop(model, settings, backbone=forward)  # the forward its steps run
    real_schedule = engine.scheduler.schedule
    engine.scheduler.schedule = schedule
    engine.start()
    cfg = ServerConfig(voices_dir=tmp_path_factory.mktemp("voices"), model_name="tiny")
    with TestClient(create_app(cfg, engine=EnginePool([engine])), base_url="http://test.localhost") as client:
        yield client, faults
    engine.stop()


def run_ws(client: TestClient, requests: dict[str, dict]) -> dict[str, dict]:
    """Send every request on one socket; return each one's end frame (and a pong after)."""
    with client.websocket_connect("/v1/stream") as ws:
        assert ws.receive_json()["type"] == "ready"
        for rid, fields in requests.items():
            ws.send_text(json.dumps({"type": "synthesize", "id": rid, "progress": False, **fields}))
        ends: dict[str, dict] = {}
        while len(ends) < len(requests):
            message = ws.receive()
            if message.get("bytes"):
                header, _ = p.split_audio_frame(message["bytes"])
                assert header["id"] not in ends
                continue
            frame = json.loads(message["text"])
            if frame["type"] in ("done", "error", "cancelled"):
                assert frame["id"] not in ends, f"two ends for {frame['id']}"
                ends[frame["id"]] = frame
        ws.send_text('{"type": "ping"}')
        assert ws.receive_json() == {"type": "pong"}  # the connection lives on
    return ends


def test_a_failing_request_gets_internal_and_the_rest_finish(faulty):
    client, _ = faulty
    opts = {"options": {"num_step": 4}}
    ends = run_ws(client, {"good1": {"text": "First sentence.", **opts}, "bad": {"text": "Fails.", **opts},
                           "nan": {"text": "Non-finite.", **opts}, "good2": {"text": "Second one.", **opts}})
    assert ends["bad"]["code"] == "internal" and "engine failed on this request" in ends["bad"]["message"]
    assert ends["nan"]["code"] == "internal" and "non-finite" in ends["nan"]["message"]
    assert ends["good1"]["type"] == "done" and ends["good2"]["type"] == "done"
    # the engine still serves
    assert run_ws(client, {"after": {"text": "Still here.", **opts}})["after"]["type"] == "done"


def test_http_engine_failure_is_500_internal(faulty):
    client, faults = faulty
    faults.http = True
    try:
        r = client.post("/v1/audio/speech", json={"input": "Fails.", "num_step": 3})
    finally:
        faults.http = False
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal" and "engine failed" in r.json()["error"]["message"]
    assert client.post("/v1/audio/speech", json={"input": "Works.", "num_step": 3}).status_code == 200


def test_out_of_memory_steps_are_retried_smaller(faulty):
    client, faults = faulty
    faults.oom_left = 3
    faults.hold_until = 4  # so the four share steps: 4 items, then halves of 2, run out of memory
    opts = {"options": {"num_step": 4}}
    ends = run_ws(client, {f"r{i}": {"text": f"Sentence number {i}.", **opts} for i in range(4)})
    assert faults.oom_sizes == [4, 2, 2]  # the shared step, then each half of it
    assert {e["type"] for e in ends.values()} == {"done"}, ends
