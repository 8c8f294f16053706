"""Voice encoding runs off the engine thread: a synthesis request completes while a clip
encode is held mid-way (a gate, not a clock), at most two encodes run at once, the rest
wait their turn, and an engine that has stopped refuses new encodes."""

from __future__ import annotations

import threading

import pytest

from server.config import EngineSettings
from server.engine.runtime.loop import EngineLoop
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest, VoicePrompt
from tests.support.engine_helpers import Collector


class GatedCodec:
    """Wraps the real codec: each `encode_voice` waits at the gate before encoding."""

    def __init__(self, codec):
        self.codec = codec
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.entered = 0
        self.running = 0
        self.most_at_once = 0
        self.entered_event = threading.Condition(self.lock)

    def encode_voice(self, audio, sample_rate, text):
        with self.lock:
            self.entered += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.entered_event.notify_all()
        try:
            assert self.gate.wait(timeout=120), "gate never opened"
            return self.codec.encode_voice(audio, sample_rate, text)
        finally:
            with self.lock:
                self.running -= 1

    def wait_entered(self, n: int) -> None:
        with self.entered_event:
            assert self.entered_event.wait_for(lambda: self.entered >= n, timeout=60)


@pytest.fixture()
def engine(tiny_checkpoint):
    from tests.support.engine_helpers import load_model

    eng = EngineLoop(load_model(tiny_checkpoint), EngineSettings())
    gated = GatedCodec(eng.codec)
    eng.voice_encoder.codec = gated
    eng.start()
    yield eng, gated
    gated.gate.set()
    eng.stop()


def test_synthesis_completes_while_an_encode_is_held(engine, reference_clip):
    eng, gated = engine
    audio, rate = reference_clip
    future = eng.encode_voice(audio, rate, "A reference transcript.")
    gated.wait_entered(1)  # the encode is in progress, held at the gate
    c = Collector()
    eng.submit(SynthesisRequest("during", "Spoken while a voice encodes.", options=GenerationOptions(num_step=4)), c)
    c.wait(["during"])
    assert c.outcome("during") == "done" and c.audio("during")
    assert not future.done()  # the encode was still held the whole time
    gated.gate.set()
    voice = future.result(timeout=120)
    assert isinstance(voice, VoicePrompt) and voice.tokens.shape[0] == 8 and voice.text


def test_at_most_two_encodes_at_once_and_the_rest_queue(engine, reference_clip):
    eng, gated = engine
    audio, rate = reference_clip
    futures = [eng.encode_voice(audio, rate, f"Transcript {i}.") for i in range(4)]
    gated.wait_entered(2)
    with gated.lock:
        assert gated.entered == 2  # the other two wait for a free worker
    gated.gate.set()
    voices = [f.result(timeout=120) for f in futures]
    assert gated.entered == 4 and gated.most_at_once == 2
    assert all(v.tokens.shape == voices[0].tokens.shape for v in voices)


def test_a_stopped_engine_refuses_encodes(engine, reference_clip):
    eng, gated = engine
    gated.gate.set()
    eng.stop()
    future = eng.encode_voice(*reference_clip, "Too late.")
    with pytest.raises(RequestRejected) as info:
        future.result(timeout=5)
    assert info.value.code == "busy"
