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
