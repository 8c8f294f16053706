"""Fast start (`first_chunk_seconds`): the plan's first chunk ends at a sentence or clause
boundary about that many seconds into the text, the rest is chunked as usual, the default
plan is the reference's, and an engine run gives audio for every chunk with the later
chunks' canvases built on chunk 0."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from server.engine.planning.fast_start import CJK_MARKS, EARLIEST, LATEST, LATIN_MARKS, split_first_chunk
from server.engine.planning.request import plan_request
from server.engine.runtime import later_chunks, loop as engine_loop
from server.engine.types import ChunkAudio, GenerationOptions, SynthesisRequest, VoicePrompt
from tests.support.engine_helpers import GREEDY, Collector

EN = ("Good morning, everyone, and welcome. Today we will talk about rivers: where they begin, how they "
      "carve valleys over thousands of years, and why cities grow on their banks. Rivers carry water, "
      "sediment and life from the mountains to the sea. Let us begin with a small stream in the hills.")
ZH = ("早上好，欢迎大家来到今天的讲座。今天我们要讨论河流：它们从哪里开始，它们如何在数千年里切割出山谷，"
      "以及为什么城市沿着河岸发展。河流把水、泥沙和生命从山区带到大海。让我们从山里的一条小溪开始吧。")
FRAME_RATE = 25


def _plan(model, text, voice=None, **options):
    return plan_request(model, SynthesisRequest("x", text, voice=voice, options=GenerationOptions(**options)),
                        FRAME_RATE)


def _seconds_per_char(model, text):
    return model._estimate_target_tokens(text, None, None) / len(text) / FRAME_RATE


@pytest.mark.parametrize("text", [EN, ZH], ids=["english", "chinese"])
@pytest.mark.parametrize("asked", [1.0, 2.0, 4.0])
def test_the_first_chunk_ends_at_a_boundary_about_the_asked_seconds_in(reference_model, text, asked):
    plan = _plan(reference_model, text, first_chunk_seconds=asked)
    first = plan.chunks[0].text
    assert len(plan.chunks) >= 2 and plan.chained
    assert text.startswith(first) and first[-1] in LATIN_MARKS | CJK_MARKS, first
    per_char = _seconds_per_char(reference_model, text)
    cuts = [i + 1 for i, ch in enumerate(text[:-1])
            if ch in CJK_MARKS or (ch in LATIN_MARKS and text[i + 1] == " ")]
    past = [c for c in cuts if c * per_char >= asked - per_char]
    if past and past[0] * per_char <= LATEST * asked + per_char:
        assert len(first) == past[0]  # the first boundary past the asked seconds, when it is near
    else:  # else the last one short of them (but past EARLIEST of them)
        assert EARLIEST * asked - per_char <= len(first) * per_char < asked
    # the rest is the text after it, chunked as usual (short enough here to stay whole)
    assert "".join(c.text for c in plan.chunks[1:]).replace(" ", "") == text[len(first):].replace(" ", "")
    assert plan.chunks[0].target_len / FRAME_RATE < sum(c.target_len for c in plan.chunks[1:]) / FRAME_RATE


SHORT_THEN_LONG = ("One two three four. Five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                   "sixteen seventeen. End here.")


@pytest.mark.parametrize(("asked", "first"), [
    (18, "One two three four."),  # the first boundary past the asked length, near it
    (22, "One two three four."),  # the next is past 1.5x: the one a little short of the asked length
    (45, "One two three four. Five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen."),  # nothing from half the asked length on before it: far, but the first
])
def test_a_short_first_sentence_is_taken_when_the_next_boundary_is_far(asked, first):
    assert split_first_chunk(SHORT_THEN_LONG, asked)[0] == first


def test_a_boundary_short_of_the_asked_length_splits_a_text_with_none_past_it():
    assert split_first_chunk("Well, that is that and nothing more", 8) == ("Well,", "that is that and nothing more")
    assert split_first_chunk("Well, that is that and nothing more", 12) is None  # "Well," is under half


def test_the_rest_is_chunked_by_the_usual_rule(reference_model):
    plan = _plan(reference_model, EN, first_chunk_seconds=1.0, chunk_threshold=0.0, chunk_seconds=3.0)
    default = _plan(reference_model, EN, chunk_threshold=0.0, chunk_seconds=3.0)
    assert len(plan.chunks) > 2 and plan.chunks[0].text != default.chunks[0].text
    assert all(len(c.text) < len(EN) / 2 for c in plan.chunks[1:])


def test_a_text_without_a_later_boundary_plans_as_without_fast_start(reference_model):
    for text in ["Hello there", "One short sentence."]:
        assert _plan(reference_model, text, first_chunk_seconds=0.5) == _plan(reference_model, text)
    assert split_first_chunk("Pi is 3.14159 and e is 2.71828 roughly", 3) is None


@pytest.mark.parametrize("options", [dict(), dict(chunk_threshold=0.0, chunk_seconds=3.0),
                                     dict(chunk_threshold=0.0, chunk_seconds=3.0, speed=1.5),
                                     dict(duration=9.0)])
def test_the_default_plan_is_the_references(reference_model, monkeypatch, options):
    """Without `first_chunk_seconds` the chunks (texts and sizes) are `generate()`'s own."""
    seen: list[tuple[str, int]] = []
    model = reference_model

    def fake_iterative(task, gen_config):  # record what the reference would generate
        seen.extend(zip(task.texts, task.target_lens))
        return [torch.zeros((model.config.num_audio_codebook, n), dtype=torch.long) for n in task.target_lens]

    monkeypatch.setattr(model, "_generate_iterative", fake_iterative)
    kwargs = {"audio_chunk_threshold": options.get("chunk_threshold", 30.0),
              "audio_chunk_duration": options.get("chunk_seconds", 15.0),
              "speed": options.get("speed"), "duration": options.get("duration")}
    try:
        model.generate(text=EN, num_step=2, **kwargs)
    except Exception:  # noqa: BLE001 - decoding all-zero tokens is not what this test looks at
        pass
    plan = _plan(model, EN, **options)
    assert seen and [(c.text, c.target_len) for c in plan.chunks] == seen


def test_an_engine_run_with_fast_start_builds_later_chunks_on_chunk_0(engine, monkeypatch):
    built: list[tuple[int, VoicePrompt | None, torch.Tensor]] = []
    real_build = engine_loop.build_utterance

    def recording_build(model, state, index, ref, device):
        utt = real_build(model, state, index, ref, device)
        built.append((index, ref, utt.item.prefix_ids.clone()))
        return utt

    monkeypatch.setattr(engine_loop, "build_utterance", recording_build)
    collector = Collector()
    opts = GenerationOptions(num_step=4, first_chunk_seconds=1.0, **GREEDY)
    accepted = engine.submit(SynthesisRequest("fast", EN, options=opts), collector)
    collector.wait(["fast"])
    assert collector.outcome("fast") == "done" and accepted.chunks >= 2

    audio = [e for e in collector.events["fast"] if isinstance(e, ChunkAudio)]
    assert sorted(e.chunk for e in audio) == list(range(accepted.chunks))
    assert all(e.audio.size > 0 and np.isfinite(e.audio).all() for e in audio)

    chunk0 = torch.from_numpy(np.asarray(collector.tokens("fast")[0]))
    by_index = {index: (ref, prefix) for index, ref, prefix in built}
    assert sorted(by_index) == list(range(accepted.chunks))
    assert by_index[0][0] is None  # chunk 0 has no reference
    for index in range(1, accepted.chunks):
        ref, prefix = by_index[index]
        assert ref is not None and torch.equal(ref.tokens.cpu(), chunk0)
        assert torch.equal(prefix[:, -chunk0.shape[1]:].cpu(), chunk0)  # the canvas ends with chunk 0's audio
        assert EN.startswith(ref.text) and len(ref.text) < len(EN) / 3  # the short first chunk's transcript


def _full_hold_budget(engine, monkeypatch, cap_s: float) -> None:
    """The decode-hold budget as a lone request finds it: full. The module's engine served the
    tests before this one, and their holds spent it (the longer their decodes, the slower the
    machine, the longer it takes to come back: a hold refused for want of credit)."""
    from server.engine.scheduling.hold_budget import HoldBudget

    monkeypatch.setattr(engine.scheduler, "hold_budget", HoldBudget(cap_s, engine.scheduler.hold_budget.share))


@pytest.mark.parametrize("hold", [True, False])
def test_chunk_0_goes_to_its_decoder_before_the_later_chunks_are_built(engine, monkeypatch, hold):
    """Building the later chunks' canvases must not delay chunk 0's decode (its sound is due);
    while the scheduler holds other work for that decode, they are built once its audio is out,
    and `AUDIO_OUT_S` later (the time its send gets the interpreter to itself)."""
    from server.engine.scheduling import scheduler as scheduler_module
    monkeypatch.setattr(scheduler_module, "DECODE_HOLD_SLACK_S", 0.0)  # a slow machine: chunk 0 is still due
    _full_hold_budget(engine, monkeypatch, scheduler_module.DECODE_HOLD_MAX_S)
    if not hold:  # the scheduler holds nothing for chunk 0's decode
        monkeypatch.setattr(engine.scheduler, "await_decode", lambda utt, now: False)
    order: list[tuple[str, int]] = []
    real_build, real_decode = engine_loop.build_utterance, engine.finisher.decode

    at: dict[tuple[str, int], float] = {}

    def note(what: str, index: int) -> None:
        order.append((what, index))
        at.setdefault((what, index), time.perf_counter())

    def recording_build(model, state, index, ref, device):
        note("build", index)
        return real_build(model, state, index, ref, device)

    def recording_decode(state, index, *args):
        note("decode", index)
        return real_decode(state, index, *args)

    monkeypatch.setattr(engine_loop, "build_utterance", recording_build)
    monkeypatch.setattr(engine.finisher, "decode", recording_decode)
    collector = Collector()

    def sink(event):
        if isinstance(event, ChunkAudio):
            note("audio", event.chunk)
        collector(event)

    rid = f"order-{hold}"
    opts = GenerationOptions(num_step=2, first_chunk_seconds=1.0, **GREEDY)
    accepted = engine.submit(SynthesisRequest(rid, EN, options=opts), sink)
    collector.wait([rid])
    assert collector.outcome(rid) == "done" and accepted.chunks >= 2
    assert order[:2] == [("build", 0), ("decode", 0)], order
    if hold:
        assert order[2:4] == [("audio", 0), ("build", 1)], order
        assert at[("build", 1)] - at[("audio", 0)] >= later_chunks.AUDIO_OUT_S
    else:
        assert order.index(("build", 1)) == 2, order


def test_fast_start_over_the_websocket_and_http(chorus_server):
    import asyncio

    import httpx

    from tests.support.chorus_client import Session, check_request

    async def main():
        s = await Session.open(chorus_server.ws_url)
        try:
            await s.synthesize("f", EN, options={"num_step": 2, "first_chunk_seconds": 1.5})
            await s.synthesize("d", EN, options={"num_step": 2})
            return await s.collect()
        finally:
            await s.close()

    outcomes = asyncio.run(main())
    fast, default = outcomes["f"], outcomes["d"]
    check_request(fast, num_step=2)
    assert fast.of("accepted")[0]["chunks"] >= 2 and default.of("accepted")[0]["chunks"] == 1
    assert fast.of("accepted")[0]["target_seconds"][0] < default.of("accepted")[0]["target_seconds"][0] / 3
    res = httpx.post(chorus_server.url + "/v1/audio/speech", timeout=120,
                     json={"input": EN, "num_step": 2, "first_chunk_seconds": 1.5, "response_format": "pcm"})
    assert res.status_code == 200 and len(res.content) > 0


def test_later_chunks_wait_out_chunk_0s_decode(model, monkeypatch):
    """Chunk 0's sound is what the listener waits for: the later chunks, queued as chunk 0
    takes its last step, take no step until chunk 0's audio is out, so its decode does not
    share the device with them (`Scheduler.await_decode`)."""
    from server.engine.runtime.observer import QuietObserver
    from server.engine.scheduling import scheduler as scheduler_module
    from tests.support.engine_helpers import running_engine
    monkeypatch.setattr(scheduler_module, "DECODE_HOLD_MAX_S", 60.0)  # no time-out: the order is exact
    monkeypatch.setattr(scheduler_module, "DECODE_HOLD_SLACK_S", 0.0)  # a slow machine: still only overdue work
    order: list[tuple[str, object]] = []  # steps and audio, both as the engine thread sees them

    class RecordingSteps(QuietObserver):
        def step_begin(self, index, batch):
            order.append(("step", {utt.item.item_id for utt in batch.utts}))

    collector = Collector()

    def sink(event):
        if isinstance(event, ChunkAudio):
            order.append(("audio", event.chunk))
        collector(event)

    with running_engine(model, observer=RecordingSteps()) as engine:
        _full_hold_budget(engine, monkeypatch, 60.0)  # nor a budget that runs out while chunk 0 decodes
        opts = GenerationOptions(num_step=4, first_chunk_seconds=1.0, **GREEDY)
        accepted = engine.submit(SynthesisRequest("held", EN, options=opts), sink)
        collector.wait(["held"])
    assert collector.outcome("held") == "done" and accepted.chunks >= 2
    first_audio = order.index(("audio", 0))
    steps_before = [ids for kind, ids in order[:first_audio] if kind == "step"]
    assert steps_before == [{"held#0"}] * 4  # chunk 0's four steps, alone
    later = [ids for kind, ids in order[first_audio:] if kind == "step"]
    assert {f"held#{i}" for i in range(1, accepted.chunks)} <= set().union(*later)
