"""Codec decodes as CUDA graphs: off the GPU the codec decodes as before; on a GPU the
replayed graph gives the eager decode's very samples, from a worker thread's stream."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from server.engine import decode_graphs
from server.engine.codec import Codec


def test_wanted_on_cuda_only_and_switchable(monkeypatch):
    monkeypatch.delenv("CHORUS_DECODE_GRAPHS", raising=False)
    assert decode_graphs.wanted(torch.device("cuda")) and not decode_graphs.wanted(torch.device("cpu"))
    monkeypatch.setenv("CHORUS_DECODE_GRAPHS", "0")
    assert not decode_graphs.wanted(torch.device("cuda"))


def test_cpu_codec_decodes_eagerly(model):
    codec = Codec(model)
    assert codec.graphs is None
    tokens = torch.randint(0, 1024, (model.config.num_audio_codebook, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model.audio_tokenizer.decode(tokens.unsqueeze(0)).audio_values[0].float().numpy()
    assert np.array_equal(codec.decode(tokens), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_is_the_eager_decode(tiny_checkpoint):
    from server.checkpoint import load_omnivoice

    model = load_omnivoice(str(tiny_checkpoint), "cuda", "float32")
    codec = Codec(model)
    assert codec.graphs is not None
    gen = torch.Generator().manual_seed(2)
    clips = [torch.randint(0, 1024, (model.config.num_audio_codebook, t), generator=gen).cuda() for t in (7, 40)]
    eager = [codec.decode(c) for c in clips]  # the default stream: always eager
    got: dict[int, list[np.ndarray]] = {}

    def worker():
        with torch.cuda.stream(torch.cuda.Stream()):
            for i, clip in enumerate(clips * 3):  # eager, capture + replay, replay
                got.setdefault(i % len(clips), []).append(codec.decode(clip))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    for i, outs in got.items():
        assert all(np.array_equal(out, eager[i]) for out in outs)
    assert codec.graphs.stats.captures == 2 and codec.graphs.stats.replays == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_warmed_lengths_replay_the_eager_decode(tiny_checkpoint):
    from server.checkpoint import load_omnivoice
    from server.engine.finisher import Finisher

    model = load_omnivoice(str(tiny_checkpoint), "cuda", "float32")
    codec = Codec(model)
    finisher = Finisher(codec, torch.device("cuda"), lambda command: None)
    try:
        assert finisher.warm_decodes(model.config.num_audio_codebook, range(20, 23)) == [3, 3]
        clip = torch.randint(0, 1024, (model.config.num_audio_codebook, 21),
                             generator=torch.Generator().manual_seed(3)).cuda()
        eager = codec.decode(clip)  # the default stream: always eager
        replays = codec.graphs.stats.replays

        def decode():
            with torch.cuda.stream(finisher._streams.current()):
                return codec.decode(clip)

        outs = [finisher._pool.submit(decode).result() for _ in range(4)]
        assert all(np.array_equal(out, eager) for out in outs)
        assert codec.graphs.stats.replays == replays + 4
    finally:
        finisher.shutdown()


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: what the decode function does while
    this graph captures is recorded as a closure, and replay runs it again."""

    capturing: _FakeGraph | None = None

    def __init__(self):
        self.recorded = None

    def capture_begin(self, pool=None, capture_error_mode=None):
        assert capture_error_mode == "thread_local"  # never stop other threads' work
        _FakeGraph.capturing = self

    def capture_end(self):
        _FakeGraph.capturing = None

    def replay(self):
        self.recorded()


def test_the_policy_eager_then_capture_then_replay(monkeypatch):
    """First sight of a length eager, second captured, then replayed (reading the new
    codes); a capture that fails leaves its length eager for good; the legacy default
    stream and over-long clips are never captured; the graph count is capped."""
    side, default = object(), object()
    stream = {"now": side}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream["now"])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)

    def decode_fn(codes):
        out = codes.float() * 2
        graph = _FakeGraph.capturing
        if graph is not None:
            if codes.shape[-1] == 13:
                raise RuntimeError("not capturable")
            graph.recorded = lambda: out.copy_(codes.float() * 2)  # codes: the static input
        return out

    graphs = decode_graphs.DecodeGraphs(decode_fn, max_frames=50, max_graphs=2)

    def clip(frames, fill):
        return torch.full((1, 4, frames), fill, dtype=torch.long)

    for fill in (1, 2, 3):  # length 7: eager, capture + replay, replay
        assert torch.equal(graphs.decode(clip(7, fill)), clip(7, fill).float() * 2)
    stats = graphs.stats
    assert (stats.eager, stats.captures, stats.replays) == (1, 1, 2)

    for fill in (1, 2, 3):  # length 13 cannot be captured: eager every time after the failure
        assert torch.equal(graphs.decode(clip(13, fill)), clip(13, fill).float() * 2)
    assert stats.failures == 1 and stats.captures == 1 and _FakeGraph.capturing is None

    for _ in range(3):  # over max_frames: never captured
        graphs.decode(clip(60, 1))
    stream["now"] = default
    for _ in range(3):  # the legacy default stream: never captured
        graphs.decode(clip(9, 1))
    stream["now"] = side
    for frames in (20, 20, 30, 30, 30):  # 20 fills the cap of 2 graphs; 30 stays eager
        graphs.decode(clip(frames, 1))
    assert stats.captures == 2 and stats.replays == 3


class _FakeStream:
    def synchronize(self):
        pass


def test_start_up_warming_captures_short_lengths_on_every_worker_thread(monkeypatch):
    """`Finisher.warm_decodes` captures each length on each of its threads (a thread replays
    only its own graphs), so a later decode of a warmed length replays wherever it runs; a
    length that cannot be captured stays eager, and the others are still warmed."""
    from server.engine.finisher import Finisher

    side, default = _FakeStream(), _FakeStream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    # _FakeGraph.capturing is one global: a capture holds this lock from begin to end, and an
    # eager decode on the other thread waits for it instead of recording into that graph
    lock = threading.RLock()

    def decode_fn(codes):
        with lock:
            out = codes.float() * 2
            graph = _FakeGraph.capturing
            if graph is not None:
                if codes.shape[-1] == 13:
                    raise RuntimeError("not capturable")
                graph.recorded = lambda: out.copy_(codes.float() * 2)
            return out

    class FakeCodec:
        graphs = decode_graphs.DecodeGraphs(decode_fn)

    original_capture = decode_graphs.DecodeGraphs._capture

    def serial_capture(self, mine, codes):
        with lock:
            return original_capture(self, mine, codes)

    monkeypatch.setattr(decode_graphs.DecodeGraphs, "_capture", serial_capture)
    finisher = Finisher(FakeCodec(), torch.device("cpu"), lambda command: None, workers=2)
    try:
        counts = finisher.warm_decodes(4, frame_counts=range(10, 16))
        stats = FakeCodec.graphs.stats
        assert counts == [5, 5]  # 10..15 but 13 on both threads
        assert stats.captures == 10 and stats.failures == 2 and stats.replays == 10  # a capture replays once
        eager_before = stats.eager
        clips = [torch.full((1, 4, frames), 3, dtype=torch.long) for frames in (10, 12, 15, 13)]

        def decode(clip):  # as `Codec.decode` runs it
            with torch.inference_mode():
                return FakeCodec.graphs.decode(clip)

        outs = [finisher._pool.submit(decode, clip).result() for clip in clips * 2]
        assert all(torch.equal(out, clip.float() * 2) for out, clip in zip(outs, clips * 2))
        assert stats.replays == 16 and stats.eager == eager_before + 2  # 13 stays eager
    finally:
        finisher.shutdown()


def test_warming_is_nothing_without_decode_graphs():
    from server.engine.finisher import Finisher

    class NoGraphs:
        graphs = None

    finisher = Finisher(NoGraphs(), torch.device("cpu"), lambda command: None)
    assert finisher.warm_decodes(8) == []
    finisher.shutdown()
