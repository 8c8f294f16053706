"""The audio a request may ask for: per request (`--max-audio-seconds`, refused from the
plan with the field), server-wide (`--max-audio-seconds-inflight`, `busy`), knobs whose
arithmetic overflowed the plan (refused, and counted in /metrics), invisible-only text; and
the later chunks' sizes of a chained (no-voice) text equal the reference's own."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from server.engine.planning.request import plan_request
from server.engine.types import GenerationOptions, SynthesisRequest
from tests.support.chorus_client import Session, metric_value
from tests.support.serverproc import ChorusServer

LIMIT_S, INFLIGHT_S = 60, 100
LONG = ("The committee met on Tuesday to discuss the budget, and after a long debate it agreed to fund "
        "the new library, the repairs to the bridge, and a study of the river. ") * 2


@pytest.fixture(scope="module")
def limited_server(tiny_checkpoint, tmp_path_factory):
    server = ChorusServer(tiny_checkpoint, tmp_path_factory.mktemp("audio-limits"),
                          "--max-audio-seconds", str(LIMIT_S), "--max-audio-seconds-inflight", str(INFLIGHT_S)).start()
    yield server
    server.stop()


def test_a_request_over_max_audio_seconds_is_refused_with_its_field(limited_server):
    async def main():
        s = await Session.open(limited_server.ws_url)
        try:
            await s.send({"type": "synthesize", "id": "d", "text": "Hello.", "options": {"duration": LIMIT_S + 1}})
            by_duration = await s.expect_error("invalid_request", "d")
            await s.send({"type": "synthesize", "id": "s", "text": LONG, "options": {"speed": 0.25}})
            by_speed = await s.expect_error("invalid_request", "s")
            # the same text at its natural speed fits
            await s.synthesize("ok", LONG, options={"num_step": 2}, progress=False)
            ok = (await s.collect(["ok"]))["ok"]
            return by_duration, by_speed, ok, s.ready
        finally:
            await s.close()

    by_duration, by_speed, ok, ready = asyncio.run(main())
    assert ready["limits"]["max_audio_seconds"] == LIMIT_S  # advertised before anything is sent
    assert by_duration["field"] == "options.duration" and f"limit of {LIMIT_S} s" in by_duration["message"]
    assert by_speed["field"] == "options.speed"
    assert ok.end["type"] == "done" and sum(ok.of("accepted")[0]["target_seconds"]) <= LIMIT_S

    res = httpx.post(limited_server.url + "/v1/audio/speech", json={"input": "Hi.", "duration": LIMIT_S + 1},
                     timeout=60)
    assert res.status_code == 422 and res.json()["error"]["field"] == "duration"


def test_the_server_wide_audio_budget_answers_busy_until_audio_is_released(limited_server):
    async def main():
        s = await Session.open(limited_server.ws_url)
        try:
            await s.synthesize("a", "Hold this one.", options={"num_step": 64, "duration": 55.0}, progress=False)
            await s.wait_for("a", "accepted")
            await s.send({"type": "synthesize", "id": "b", "text": "And this.", "options": {"duration": 50.0}})
            refused = await s.expect_error("busy", "b")
            await s.synthesize("small", "A small one fits.", options={"num_step": 2, "duration": 2.0},
                               progress=False)
            small = (await s.collect(["small"]))["small"]
            await s.send({"type": "cancel", "id": "a"})
            first = (await s.collect(["a"]))["a"]
            await s.synthesize("b2", "And this.", options={"num_step": 2, "duration": 50.0}, progress=False)
            later = (await s.collect(["b2"]))["b2"]
            return refused, small, first, later
        finally:
            await s.close()

    refused, small, first, later = asyncio.run(main())
    assert "field" not in refused and f"limit of {INFLIGHT_S} s" in refused["message"]
    assert small.end["type"] == "done"
    assert first.end["type"] == "cancelled"
    assert later.end["type"] == "done"  # the cancelled request's audio no longer counts


@pytest.mark.parametrize("knob,value", [("chunk_threshold", 1e308), ("chunk_seconds", 1e308),
                                        ("duration", 7.2e306)])
def test_huge_knobs_over_http_are_refused_and_counted(chorus_server, knob, value):
    labels = {"endpoint": "speech", "outcome": "invalid_request"}
    before = metric_value(chorus_server.url, "chorus_requests_total", **labels)
    body = {"input": "Hello there.", knob: value}
    if knob != "duration":
        body["duration"] = 3.0
    res = httpx.post(chorus_server.url + "/v1/audio/speech", json=body, timeout=60)
    assert res.status_code == 422, res.text
    assert res.json()["error"] == {**res.json()["error"], "code": "invalid_request", "field": knob}
    assert metric_value(chorus_server.url, "chorus_requests_total", **labels) == before + 1


INVISIBLE = ["\u200b", "\u200b\u200c\u200d", "\u2060\ufeff", " \u200b \u00ad ", "\u202e\u202c", "\x00\x01"]


@pytest.mark.parametrize("text", INVISIBLE, ids=[t.encode("unicode_escape").decode() for t in INVISIBLE])
def test_text_of_only_invisible_characters_is_empty(chorus_server, text):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        try:
            await s.send({"type": "synthesize", "id": "z", "text": text})
            return await s.expect_error("invalid_request", "z")
        finally:
            await s.close()

    assert asyncio.run(main())["field"] == "text"
    res = httpx.post(chorus_server.url + "/v1/audio/speech", json={"input": text}, timeout=60)
    assert res.status_code == 422 and res.json()["error"]["field"] == "input"


def test_invisible_text_is_refused_by_the_engine_too(reference_model):
    with pytest.raises(Exception) as info:
        plan_request(reference_model, SynthesisRequest("x", "\u200b\u2060"), 25)
    assert getattr(info.value, "field", None) == "text"


@pytest.mark.parametrize("options", [dict(speed=0.5), dict(speed=2.0), dict(duration=12.0)])
def test_chained_chunks_are_sized_as_the_reference_sizes_them(reference_model, monkeypatch, options):
    """Without a voice, later chunks take chunk 0 (already stretched by the speed) as their
    reference and are divided by the speed again; the reference's `_generate_chunked` does
    the same, and the plan keeps parity with it (docs/protocol.md)."""
    sizes: list[int] = []
    model = reference_model

    def fake_iterative(task, gen_config):  # record the sizes; tokens are never looked at here
        sizes.extend(task.target_lens)
        return [torch.zeros((model.config.num_audio_codebook, n), dtype=torch.long) for n in task.target_lens]

    monkeypatch.setattr(model, "_generate_iterative", fake_iterative)
    monkeypatch.setattr(model, "_decode_and_post_process", lambda *a, **k: torch.zeros(1, 10), raising=False)
    text = LONG
    try:
        model.generate(text=text, audio_chunk_threshold=0.0, audio_chunk_duration=3.0, num_step=2, **options)
    except Exception:  # noqa: BLE001 - decoding fake tokens is not what this test looks at
        pass
    assert sizes
    frame_rate = model.audio_tokenizer.config.frame_rate
    plan = plan_request(model, SynthesisRequest("x", text, options=GenerationOptions(
        chunk_threshold=0.0, chunk_seconds=3.0, **options)), frame_rate)
    assert plan.chained and [c.target_len for c in plan.chunks] == sizes


@pytest.mark.parametrize("processes", [False, True], ids=["engine-thread", "engine-process"])
def test_the_pool_budget_holds_for_engine_threads_and_processes(tiny_checkpoint, processes):
    from server.config import EngineSettings
    from server.engine.runtime.pool import EnginePool
    from server.engine.types import RequestRejected
    from tests.support.engine_helpers import Collector

    settings = EngineSettings(device="cpu", engine_processes=processes, max_audio_seconds_inflight=30.0)
    pool = EnginePool.load(str(tiny_checkpoint), settings)
    pool.start()
    try:
        sink = Collector()
        heavy = GenerationOptions(num_step=64, duration=25.0)
        pool.submit(SynthesisRequest("a", "Hold this one.", options=heavy), sink)
        with pytest.raises(RequestRejected) as info:
            pool.submit(SynthesisRequest("b", "And this.", options=GenerationOptions(duration=10.0)), sink)
        assert info.value.code == "busy" and pool.audio_budget.held_seconds == pytest.approx(25.0)
        pool.cancel("a")
        sink.wait(["a"])
        assert sink.outcome("a") == "cancelled" and "b" not in sink.finished  # the refused one is never seen
        pool.submit(SynthesisRequest("b", "And this.", options=GenerationOptions(num_step=2, duration=10.0)), sink)
        sink.wait(["b"])
        assert sink.outcome("b") == "done" and pool.audio_budget.held_seconds == 0
    finally:
        pool.stop()
