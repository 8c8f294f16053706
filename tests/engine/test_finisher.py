"""The finisher's decoded, post-processed audio is the reference's, sample for sample."""

from __future__ import annotations

import queue
import time

import numpy as np
import torch
from omnivoice.models.omnivoice import OmniVoiceGenerationConfig
from omnivoice.utils.audio import cross_fade_chunks

from server.engine.model.codec import Codec
from server.engine.runtime.finisher import ChunkDecoded, Finisher, WholeReady
from server.engine.runtime.observer import QuietObserver


class _Timings(QuietObserver):
    """The finisher's decode and post-processing calls, each with the time between begin and end."""

    def __init__(self):
        self.begun: dict[tuple[str, object], float] = {}
        self.ms: dict[str, list[tuple[object, float]]] = {"decode": [], "post": []}

    def _begin(self, what, chunk):
        self.begun[(what, chunk)] = time.perf_counter()

    def _end(self, what, chunk):
        self.ms[what].append((chunk, (time.perf_counter() - self.begun.pop((what, chunk))) * 1e3))

    def decode_begin(self, state, chunk):
        self._begin("decode", chunk)

    def decode_end(self, state, chunk):
        self._end("decode", chunk)

    def post_begin(self, state, chunk):
        self._begin("post", chunk)

    def post_end(self, state, chunk):
        self._end("post", chunk)


def test_finisher_post_processes_as_the_reference(reference_model):
    codec = Codec(reference_model)
    results: queue.Queue = queue.Queue()
    timings = _Timings()
    finisher = Finisher(codec, torch.device("cpu"), results.put, observer=timings)
    config = OmniVoiceGenerationConfig(postprocess_output=True)
    try:
        tokens = torch.randint(0, 1024, (8, 60), generator=torch.Generator().manual_seed(3))
        finisher.decode("state", 0, tokens, None, 0.05, True)
        decoded = results.get(timeout=120)
        assert isinstance(decoded, ChunkDecoded) and decoded.post_processed
        raw = codec.decode(tokens)
        expected = reference_model._post_process_audio(raw, ref_rms=0.05, gen_config=config)[0]
        np.testing.assert_array_equal(decoded.audio, expected)
        np.testing.assert_array_equal(decoded.tokens, tokens.numpy())

        other = codec.decode(torch.randint(0, 1024, (8, 40), generator=torch.Generator().manual_seed(4)))
        finisher.join("state", [raw, other], None, True)
        whole = results.get(timeout=120)
        assert isinstance(whole, WholeReady)
        joined = cross_fade_chunks([raw, other], codec.sample_rate)
        np.testing.assert_array_equal(whole.audio, reference_model._post_process_audio(joined, None, config)[0])
        # the observer hears of each job where it runs: one decode (chunk 0), two post-processings
        # (chunk 0, then the joined whole: None), each ended after it began
        assert finisher.post_jobs == 2 and finisher.decode_jobs == 1
        assert [chunk for chunk, _ in timings.ms["decode"]] == [0]
        assert [chunk for chunk, _ in timings.ms["post"]] == [0, None]
        assert min(ms for _, ms in timings.ms["post"] + timings.ms["decode"]) > 0
    finally:
        finisher.shutdown()


def test_decode_streams_have_the_highest_priority_unless_turned_off(monkeypatch, reference_model):
    """A decode under load must not wait behind the steps' blocks (its request's first audio
    waits for it); the finisher asks for the highest stream priority, an ordinary one when told."""
    from server.engine.model.worker_streams import HIGHEST_PRIORITY

    codec = Codec(reference_model)
    for env, want in (("", HIGHEST_PRIORITY), ("0", 0)):
        monkeypatch.setenv("CHORUS_DECODE_PRIORITY", env)
        finisher = Finisher(codec, torch.device("cpu"), lambda command: None)
        try:
            assert finisher._streams.priority == want
            assert finisher._streams.current() is None  # no CUDA stream off CUDA
        finally:
            finisher.shutdown()


def test_a_cold_thread_warms_its_post_processing_while_the_gpu_decodes(monkeypatch):
    """A finisher thread that has been idle ports the warm-up clip while its chunk decodes
    (the codec calls back during the decode, as on a GPU); a busy one does not; the chunk's
    own audio is the same either way, and a failing warm-up fails nothing."""
    import time

    from server.engine.model.codec import post_process
    from server.engine.runtime import finisher as finisher_module

    raw = finisher_module.warm_clip(24000)[:, ::-1].copy() * 0.5  # a "decoded" clip

    class CallbackCodec:
        sample_rate = 24000
        graphs = None

        def decode(self, tokens, while_decoding=None):
            if while_decoding is not None:
                while_decoding()
            return raw

    results: queue.Queue = queue.Queue()
    finisher = Finisher(CallbackCodec(), torch.device("cpu"), results.put, workers=1)
    tokens = torch.zeros(8, 12, dtype=torch.long)
    want = post_process(raw, None, True, 24000)
    try:
        finisher.decode("state", 0, tokens, None, None, True)  # a thread's first job: cold
        assert np.array_equal(results.get(timeout=30).audio, want) and finisher.warm_ups == 1
        finisher.decode("state", 1, tokens, None, None, True)  # right after: warm, no warm-up
        assert np.array_equal(results.get(timeout=30).audio, want) and finisher.warm_ups == 1
        time.sleep(finisher_module.COLD_AFTER_S * 2)
        finisher.decode("state", 2, tokens, None, None, None)  # raw audio wanted: nothing to warm
        assert results.get(timeout=30).post_processed is False and finisher.warm_ups == 1
        time.sleep(finisher_module.COLD_AFTER_S * 2)

        def broken(audio, *args):
            if audio is finisher._warm_clip:
                raise RuntimeError("warm-up broke")
            return post_process(audio, *args)

        monkeypatch.setattr(finisher_module, "post_process", broken)
        finisher.decode("state", 3, tokens, None, None, True)
        assert np.array_equal(results.get(timeout=30).audio, want) and finisher.warm_ups == 1
    finally:
        finisher.shutdown()


class _Event:
    """torch.cuda.Event off CUDA: already passed."""

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Stream:
    def __init__(self):
        self.waited = 0

    def wait_event(self, event):
        self.waited += 1


def _audio_for(tokens: torch.Tensor) -> torch.Tensor:
    """A (1, N) float32 "decode" that depends on every token."""
    n = tokens.shape[-1] * 240
    return (0.4 * torch.sin(torch.arange(n, dtype=torch.float32) * 0.01 + float(tokens.sum()) * 1e-3))[None, :]


class _LaneCodec:
    """Replays only lengths in `captured`; records which thread replayed or decoded."""

    sample_rate = 24000
    graphs = None

    def __init__(self, captured=(8,)):
        import threading

        self.captured = set(captured)
        self.replayed: list[tuple[object, str]] = []
        self.decoded: list[str] = []
        self.fail_replay = False
        self._thread = threading.current_thread

    def replay(self, graphs, tokens):
        if self.fail_replay:
            raise RuntimeError("replay broke")
        self.replayed.append((graphs, self._thread().name))
        return _audio_for(tokens) if tokens.shape[-1] in self.captured else None

    def decode(self, tokens, while_decoding=None):
        self.decoded.append(self._thread().name)
        return _audio_for(tokens).numpy()


def _lane_finisher(monkeypatch, codec, results):
    """A finisher whose two lanes look warmed (a stream and graphs each) off CUDA."""
    import contextlib

    from server.engine.runtime import finisher as finisher_module
    monkeypatch.setattr(finisher_module, "on", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(finisher_module, "_pinned_copy", lambda tensor: tensor.clone())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    finisher = Finisher(codec, torch.device("cpu"), results.put, workers=2)
    for lane in finisher._lanes:
        lane.stream, lane.graphs = _Stream(), f"graphs-{lane.index}"
    return finisher


def _settled(finisher) -> bool:
    import time

    deadline = time.monotonic() + 30
    while any(lane.pending for lane in finisher._lanes) and time.monotonic() < deadline:
        time.sleep(0.005)
    return not any(lane.pending for lane in finisher._lanes)


def test_an_idle_lane_decodes_from_the_engine_thread_and_a_busy_one_on_its_own(monkeypatch):
    """A finished chunk's decode is launched by the calling (engine) thread on an idle lane's
    graphs and stream; with every lane busy, or no graph for its length, the lane's thread
    decodes it. The audio, the tokens and the post-processing are the same either way."""
    import threading

    from server.engine.model.codec import post_process

    codec = _LaneCodec(captured=(8,))
    results: queue.Queue = queue.Queue()
    finisher = _lane_finisher(monkeypatch, codec, results)
    gates = [threading.Event() for _ in finisher._lanes]
    try:
        for lane, gate in zip(finisher._lanes, gates):  # hold both threads: lanes stay busy
            lane.executor.submit(gate.wait)
        gen = torch.Generator().manual_seed(5)
        chunks = {i: torch.randint(0, 1024, (8, frames), generator=gen) for i, frames in enumerate((8, 8, 8, 12))}
        for i, tokens in chunks.items():
            finisher.decode("state", i, tokens, None, 0.05, True)
        # chunks 0 and 1 each took an idle lane and were launched here; 2 and 3 found both busy
        assert codec.replayed == [("graphs-0", threading.current_thread().name),
                                  ("graphs-1", threading.current_thread().name)]
        assert finisher.launched_decodes == 2 and [lane.stream.waited for lane in finisher._lanes] == [0, 0]
        for gate in gates:
            gate.set()
        got = {}
        for _ in chunks:
            done = results.get(timeout=30)
            got[done.index] = done
        assert sorted(codec.decoded) == ["chorus-finish0_0", "chorus-finish1_0"]
        for i, tokens in chunks.items():
            assert got[i].post_processed and np.array_equal(got[i].tokens, tokens.numpy())
            assert np.array_equal(got[i].audio, post_process(_audio_for(tokens).numpy(), 0.05, True, 24000))
        assert _settled(finisher) and finisher.decode_jobs == 4

        # an idle lane without a graph for this length: it tries, then the lane's thread decodes
        finisher.decode("state", 4, chunks[3], None, None, None)
        raw = results.get(timeout=30)
        assert not raw.post_processed and np.array_equal(raw.audio, _audio_for(chunks[3]).numpy())
        assert len(codec.decoded) == 3 and finisher.launched_decodes == 2

        # raw audio wanted (stream `whole`), launched: a copy, not the launch's buffer
        assert _settled(finisher)
        finisher.decode("state", 5, chunks[0], object(), None, None)  # `ready`: the lane's stream waits on it
        raw = results.get(timeout=30)
        assert not raw.post_processed and np.array_equal(raw.audio, _audio_for(chunks[0]).numpy())
        assert finisher.launched_decodes == 3 and sum(lane.stream.waited for lane in finisher._lanes) == 1
        assert _settled(finisher)
    finally:
        for gate in gates:
            gate.set()
        finisher.shutdown()


def test_a_failed_launch_fails_its_chunk_alone_and_frees_its_lane(monkeypatch):
    from server.engine.runtime.finisher import FinishFailed

    codec = _LaneCodec()
    results: queue.Queue = queue.Queue()
    finisher = _lane_finisher(monkeypatch, codec, results)
    try:
        codec.fail_replay = True
        finisher.decode("state", 0, torch.zeros((8, 8), dtype=torch.long), None, None, True)
        failed = results.get(timeout=30)
        assert isinstance(failed, FinishFailed) and failed.index == 0 and "replay broke" in str(failed.error)
        assert not any(lane.pending for lane in finisher._lanes)
        codec.fail_replay = False
        finisher.decode("state", 1, torch.zeros((8, 8), dtype=torch.long), None, None, True)
        assert isinstance(results.get(timeout=30), ChunkDecoded) and finisher.launched_decodes == 1
    finally:
        finisher.shutdown()


def test_launching_from_the_engine_thread_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("CHORUS_DECODE_LAUNCH", "0")
    codec = _LaneCodec()
    results: queue.Queue = queue.Queue()
    finisher = _lane_finisher(monkeypatch, codec, results)
    try:
        finisher.decode("state", 0, torch.zeros((8, 8), dtype=torch.long), None, None, True)
        assert isinstance(results.get(timeout=30), ChunkDecoded)
        assert finisher.launched_decodes == 0 and codec.replayed == [] and len(codec.decoded) == 1
    finally:
        finisher.shutdown()
