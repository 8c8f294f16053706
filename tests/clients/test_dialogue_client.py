"""`ChorusClient.dialogue()` against a real `chorus serve` (tiny checkpoint, CPU): a three-speaker
script comes back in order, each line announced by a `Line` before its audio, frames back to back
on the dialogue's clock with the pauses between lines as silence, progress and word timings said
to be each line's; `collect()`; cancel; the server's refusals as typed errors naming the line."""

from __future__ import annotations

import asyncio

import pytest
from chorus_client import (
    AudioChunk,
    Cancelled,
    ChorusClient,
    Dialogue,
    DialogueLine,
    Done,
    InvalidRequestError,
    Line,
    Progress,
    SynthesisOptions,
    VoiceNotFoundError,
    Words,
)
from chorus_client.wire import dialogue_frame

FAST = SynthesisOptions(num_step=4, seed=5)
SCRIPT = [
    DialogueLine("Welcome to the show.", voice="alloy"),
    DialogueLine("Thanks for having me!", voice="echo", options={"speed": 1.1}),
    DialogueLine("Let us begin.", voice="alloy"),
]


def run(coro):
    return asyncio.run(coro)


def test_the_frame_takes_lines_in_any_form():
    first = DialogueLine("Hi.", voice="alloy", instruct="female", options=SynthesisOptions(speed=1.2))
    frame = dialogue_frame("d1", [first, ("echo", "Hello."), {"voice": None, "text": "Me too."}],
                           pause_ms=150, options=FAST, timestamps="word")
    assert frame == {"type": "dialogue", "id": "d1", "pause_ms": 150, "options": {"num_step": 4, "seed": 5},
                     "timestamps": "word",
                     "lines": [{"voice": "alloy", "text": "Hi.", "instruct": "female", "options": {"speed": 1.2}},
                               {"voice": "echo", "text": "Hello."}, {"voice": None, "text": "Me too."}]}
    assert "progress" not in dialogue_frame("d2", [("alloy", "Hi.")])  # left at None: not sent
    with pytest.raises(TypeError):
        dialogue_frame("d3", ["just text"])  # type: ignore[list-item]


def test_three_speakers_in_order_with_lines_pauses_progress_and_words(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            request = client.dialogue(SCRIPT, pause_ms=200, options=FAST, progress=True, timestamps="word")
            assert isinstance(request, Dialogue)
            return [event async for event in request], client.ready.sample_rate

    events, rate = run(go())
    assert isinstance(events[-1], Done)
    lines = [e for e in events if isinstance(e, Line)]
    assert [(e.line, e.voice, e.text) for e in lines] == [(k, s.voice, s.text) for k, s in enumerate(SCRIPT)]
    audio = [e for e in events if isinstance(e, AudioChunk)]
    # back to back on the dialogue's clock, the last one final
    position = 0
    for chunk in audio:
        assert chunk.offset_samples == position and len(chunk.data) == 2 * chunk.samples
        position += chunk.samples
    assert audio[-1].final and not any(c.final for c in audio[:-1])
    assert events[-1].audio_seconds == pytest.approx(position / rate, abs=1e-3)
    # each line's `Line` comes before its audio and says where that audio starts
    for line in lines:
        first = next(c for c in audio if c.line == line.line and c.samples)
        assert events.index(line) < events.index(first)
        assert first.offset_samples == line.offset_samples
        assert line.offset_seconds == pytest.approx(line.offset_samples / rate)
    # the pauses: 200 ms of silence between lines, none after the last
    pauses = [c for c in audio if c.line == -1]
    assert len(pauses) == len(SCRIPT) - 1
    assert all(c.samples == 200 * rate // 1000 and not any(c.data) for c in pauses)
    spoken = [c.line for c in audio if c.samples and c.line != -1]
    assert spoken == sorted(spoken)
    # progress is each line's (the frames do not say: the client does, from the line before them)
    progress = [e for e in events if isinstance(e, Progress)]
    assert {p.line for p in progress} == {0, 1, 2}
    for p in progress:
        assert events.index(lines[p.line]) < events.index(p)
    # word timings on the dialogue's clock, inside their line's audio
    words = [e for e in events if isinstance(e, Words)]
    assert {w.line for w in words} == {0, 1, 2}
    for w in words:
        start = lines[w.line].offset_samples
        end = max(c.offset_samples + c.samples for c in audio if c.line == w.line)
        assert all(start <= t.start_samples <= t.end_samples <= end for t in w.words), (w, start, end)


def test_collect_gathers_the_lines_and_audio(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            return await client.dialogue([("alloy", "One line."), ("echo", "And another.")], options=FAST).collect()

    result = run(go())
    assert [line.line for line in result.lines] == [0, 1]
    assert result.done is not None and not result.cancelled
    assert len(result.audio) == 2 * result.samples
    assert result.done.audio_seconds == pytest.approx(result.samples / 24000, abs=1e-3)


def test_cancel_ends_every_line(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            request = client.dialogue([("alloy", "First of many lines, long enough to take a while."),
                                       ("echo", "Second, never heard."), ("alloy", "Third, never heard.")],
                                      options=SynthesisOptions(num_step=16))
            seen = []
            async for event in request:
                seen.append(event)
                if isinstance(event, Line):
                    await request.cancel()
            # the connection goes on
            after = await client.dialogue([("alloy", "Still here.")], options=FAST).collect()
            return seen, after

    seen, after = run(go())
    assert isinstance(seen[-1], Cancelled)
    assert not any(isinstance(e, AudioChunk) for e in seen)  # nothing after the cancel is handed over
    assert after.done is not None


def test_async_with_cancels_a_dialogue_left_early(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            async with client.dialogue([("alloy", "Left early."), ("echo", "Never heard.")], options=FAST) as d:
                async for event in d:
                    if isinstance(event, AudioChunk):
                        break
            return d.ended

    assert run(go())


def test_refusals_are_typed_and_name_the_line(chorus_url):
    async def refused(lines, **fields):
        async with ChorusClient(chorus_url) as client:
            with pytest.raises(Exception) as info:
                await client.dialogue(lines, options=FAST, **fields).collect()
            return info.value

    empty = run(refused([("alloy", "Fine."), ("echo", "   ")]))
    assert isinstance(empty, InvalidRequestError) and empty.field == "lines[1].text"
    knob = run(refused([DialogueLine("Fine.", voice="alloy", options={"num_step": 999})]))
    assert isinstance(knob, InvalidRequestError) and knob.field == "lines[0].options.num_step"
    unknown = run(refused([("alloy", "Fine."), ("nobody-at-all", "Who?")]))
    assert isinstance(unknown, VoiceNotFoundError) and "nobody-at-all" in unknown.message
    pause = run(refused([("alloy", "Fine.")], pause_ms=999_999))
    assert isinstance(pause, InvalidRequestError) and pause.field == "pause_ms"


def test_a_retried_dialogue_hands_each_line_over_once():
    """A dialogue sent again after `busy` may get its first `Line` twice: the caller gets it once."""
    dialogue = Dialogue(None, "d1", {}, None)  # type: ignore[arg-type]
    first = Line("d1", 0, "alloy", "Hi.", 0)
    assert dialogue._shaped(first) is first
    assert dialogue._shaped(Line("d1", 0, "alloy", "Hi.", 0)) is None
    step = dialogue._shaped(Progress("d1", 0, 1, 4, 0.25))
    assert isinstance(step, Progress) and step.line == 0
