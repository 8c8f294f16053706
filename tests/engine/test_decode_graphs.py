"""Codec decodes as CUDA graphs, one per bucket of lengths: off the GPU the codec decodes as
before; a clip decoded at its bucket's length with every convolution's input cut at its end
gives the exact-length decode's samples (up to float rounding, where plain padding changes
them); the policy (eager, capture, replay, start-up warming on every worker thread) holds."""

from __future__ import annotations

import threading
from itertools import pairwise

import numpy as np
import pytest
import torch
from torch import nn

from server.engine.model import decode_graphs
from server.engine.model.codec import Codec


def _on_lane(finisher, lane: int, fn, *args):
    """`fn(*args)` on that lane's thread (where its decode graphs were captured), its result."""
    return finisher._lanes[lane].executor.submit(fn, *args).result()


def test_wanted_on_cuda_only_and_switchable(monkeypatch):
    monkeypatch.delenv("CHORUS_DECODE_GRAPHS", raising=False)
    assert decode_graphs.wanted(torch.device("cuda")) and not decode_graphs.wanted(torch.device("cpu"))
    monkeypatch.setenv("CHORUS_DECODE_GRAPHS", "0")
    assert not decode_graphs.wanted(torch.device("cuda"))


def test_buckets_cover_every_length_up_to_the_limit_with_little_padding():
    buckets = decode_graphs.BUCKETS
    assert buckets[-1] == decode_graphs.MAX_FRAMES and list(buckets) == sorted(set(buckets))
    for frames in range(1, decode_graphs.MAX_FRAMES + 1):
        bucket = decode_graphs.bucket_for(frames)
        assert frames <= bucket <= max(frames + 3, frames * 1.16 + 8), frames
    assert decode_graphs.bucket_for(decode_graphs.MAX_FRAMES + 1) is None


def test_cpu_codec_decodes_eagerly(model):
    codec = Codec(model)
    assert codec.graphs is None
    tokens = torch.randint(0, 1024, (model.config.num_audio_codebook, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model.audio_tokenizer.decode(tokens.unsqueeze(0)).audio_values[0].float().numpy()
    assert np.array_equal(codec.decode(tokens), want)


def test_the_lowest_frames_of_a_bucket_are_one_more_than_the_bucket_below():
    buckets = decode_graphs.BUCKETS
    assert decode_graphs.lowest_frames(buckets[0]) == 1
    for below, bucket in pairwise(buckets):
        assert decode_graphs.lowest_frames(bucket) == below + 1
        assert decode_graphs.bucket_for(below + 1) == bucket and decode_graphs.bucket_for(below) == below


@pytest.mark.parametrize("frames", [1, 3, 5, 13, 49, 56, 101])
def test_a_masked_bucket_decode_is_the_exact_length_decode(model, frames):
    tokenizer = model.audio_tokenizer
    graphs = decode_graphs.DecodeGraphs(lambda c: tokenizer.decode(c).audio_values, tokenizer.acoustic_decoder)
    try:
        codes = torch.randint(0, 1024, (1, model.config.num_audio_codebook, frames),
                              generator=torch.Generator().manual_seed(frames))
        bucket = decode_graphs.bucket_for(frames)
        with torch.inference_mode():
            exact = tokenizer.decode(codes).audio_values
            masked = graphs._masked(codes, bucket)
            padded = torch.zeros(codes.shape[:-1] + (bucket,), dtype=codes.dtype)
            padded[..., :frames] = codes
            unmasked = tokenizer.decode(padded).audio_values[..., : exact.shape[-1]]
        assert masked.shape == exact.shape
        assert float((masked - exact).abs().max()) < 1e-5 * float(exact.abs().max()) + 1e-6
        graphs.mask.in_place = False  # the whole input multiplied by the mask: the same bits
        with torch.inference_mode():
            assert torch.equal(graphs._masked(codes, bucket), masked)
        if bucket > frames:  # what the mask is for: plain padding changes the clip's last samples
            assert float((unmasked - exact).abs().max()) > 1e-3
    finally:
        for handle in graphs.mask.handles:
            handle.remove()


@pytest.mark.gpu
def test_warmed_buckets_replay_the_masked_decode(tiny_checkpoint):
    from server.checkpoint import load_omnivoice
    from server.engine.runtime.finisher import Finisher

    model = load_omnivoice(str(tiny_checkpoint), "cuda", "float32")
    codec = Codec(model)
    assert codec.graphs is not None
    finisher = Finisher(codec, model.audio_heads.weight.device, lambda command: None)
    try:
        assert finisher.warm_decodes(model.config.num_audio_codebook, (16, 56)) == [2, 2]
        gen = torch.Generator().manual_seed(3)
        clips = [torch.randint(0, 1024, (model.config.num_audio_codebook, t), generator=gen).cuda()
                 for t in (13, 16, 50, 55)]  # all in the warmed buckets, 16 and 56
        exact = [codec.decode(c) for c in clips]  # the default stream: always eager, at its length
        with torch.inference_mode():
            masked = [codec.graphs._masked(c.unsqueeze(0), decode_graphs.bucket_for(c.shape[-1]))[0].float()
                      .cpu().numpy() for c in clips]
        replays = codec.graphs.stats.replays

        called = []

        def decode(clip):  # the host work it is given runs while the GPU decodes
            with torch.cuda.stream(finisher._streams.current()):
                return codec.decode(clip, while_decoding=lambda: called.append(1))

        outs = [_on_lane(finisher, i % 2, decode, clip) for i, clip in enumerate(clips * 2)]
        assert len(called) == len(outs)
        for out, want, close in zip(outs, masked * 2, exact * 2):
            assert np.array_equal(out, want)  # a replay is its bucket's masked decode, bit for bit
            assert np.abs(out - close).max() < 1e-4  # and the exact-length one up to rounding
        assert codec.graphs.stats.replays == replays + 8
    finally:
        finisher.shutdown()


@pytest.mark.gpu
def test_decodes_launched_from_the_engine_thread_equal_the_lanes_own(tiny_checkpoint, monkeypatch):
    """On a GPU: a chunk's decode launched by the calling thread on an idle lane (its graph
    replayed on the lane's stream behind the step's event) gives the audio and tokens the
    lane's own thread gives, for both outputs (post-processed and raw), while the calling
    thread's stream keeps writing new canvases."""
    import queue

    from server.checkpoint import load_omnivoice
    from server.engine.runtime.finisher import Finisher

    model = load_omnivoice(str(tiny_checkpoint), "cuda", "float32")
    codec = Codec(model)
    gen = torch.Generator().manual_seed(11)
    clips = [torch.randint(0, 1024, (model.config.num_audio_codebook, t), generator=gen) for t in (13, 50, 55)]
    outputs = {}
    for launch in ("1", "0"):
        monkeypatch.setenv("CHORUS_DECODE_LAUNCH", launch)
        results: queue.Queue = queue.Queue()
        finisher = Finisher(codec, model.audio_heads.weight.device, results.put)
        try:
            assert finisher.warm_decodes(model.config.num_audio_codebook, (16, 56)) == [2, 2]
            got = {}
            for i, clip in enumerate(clips * 2):
                tokens = torch.full_like(clip, 7, device="cuda")  # written on this thread's stream...
                tokens.copy_(clip.cuda(), non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()  # ... which the decode waits for
                finisher.decode("state", i, tokens, ready, 0.05 if i % 2 else None, True if i < 3 else None)
                del tokens  # the launch keeps the tokens it reads
                got_one = results.get(timeout=120)
                got[got_one.index] = (got_one.tokens, got_one.audio, got_one.post_processed)
            outputs[launch] = got
            assert finisher.launched_decodes == (6 if launch == "1" else 0)
        finally:
            finisher.shutdown()
    for i, clip in enumerate(clips * 2):
        (tokens, audio, post), (tokens0, audio0, post0) = outputs["1"][i], outputs["0"][i]
        assert np.array_equal(tokens, clip.numpy()) and np.array_equal(tokens0, clip.numpy())
        assert post == post0 == (i < 3) and np.array_equal(audio, audio0)


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


class _FakeStream:
    def synchronize(self):
        pass


def _fake_cuda(monkeypatch):
    side, default = _FakeStream(), _FakeStream()
    stream = {"now": side}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream["now"])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    return stream, side, default


def _fake_decode(uncapturable: int, lock=None):
    """Doubles the codes (one value per frame); refuses capture at the `uncapturable` bucket."""
    lock = lock or threading.RLock()

    def decode_fn(codes):
        with lock:
            out = codes.float() * 2
            graph = _FakeGraph.capturing
            if graph is not None:
                if codes.shape[-1] == uncapturable:
                    raise RuntimeError("not capturable")
                graph.recorded = lambda: out.copy_(codes.float() * 2)  # codes: the static input
            return out

    return decode_fn


def test_the_policy_eager_then_capture_then_replay(monkeypatch):
    """First sight of a bucket eager, second captured, then replayed for any length in it
    (reading the new codes); a bucket that cannot be captured stays eager for good; the
    legacy default stream and over-long clips decode eagerly at their own length."""
    stream, _side, default = _fake_cuda(monkeypatch)
    graphs = decode_graphs.DecodeGraphs(_fake_decode(uncapturable=16), nn.Sequential(), buckets=(8, 16, 24))

    def clip(frames, fill):
        return torch.full((1, 4, frames), fill, dtype=torch.long)

    def check(frames, fill):
        got = graphs.decode(clip(frames, fill))
        assert torch.equal(got, clip(frames, fill).float() * 2), (frames, fill)

    for frames, fill in ((7, 1), (5, 2), (8, 3), (6, 4)):  # bucket 8: eager, capture + replay, replays
        check(frames, fill)
    stats = graphs.stats
    assert (stats.eager, stats.captures, stats.replays) == (1, 1, 3)

    for fill in (1, 2, 3):  # bucket 16 cannot be captured: eager every time after the failure
        check(13, fill)
    assert stats.failures == 1 and stats.captures == 1 and _FakeGraph.capturing is None

    eager = stats.eager
    for _ in range(3):  # past the last bucket: never captured
        check(30, 1)
    stream["now"] = default
    for _ in range(3):  # the legacy default stream: never captured
        check(7, 1)
    assert stats.eager == eager + 6 and stats.captures == 1


def test_start_up_warming_captures_every_bucket_on_every_worker_thread(monkeypatch):
    """`Finisher.warm_decodes` captures each bucket on each of its lanes' threads (a thread
    replays only its own graphs), so a later decode of any length replays wherever it runs; a
    bucket that cannot be captured stays eager, and the others are still warmed."""
    from server.engine.runtime.finisher import Finisher

    _fake_cuda(monkeypatch)
    # _FakeGraph.capturing is one global: a capture holds this lock from begin to end, and an
    # eager decode on the other thread waits for it instead of recording into that graph
    lock = threading.RLock()

    class FakeCodec:
        sample_rate = 24000
        graphs = decode_graphs.DecodeGraphs(_fake_decode(uncapturable=16, lock=lock), nn.Sequential(),
                                            buckets=(8, 16, 24, 32))

    original_capture = decode_graphs.DecodeGraphs._capture

    def serial_capture(self, mine, codes, bucket):
        with lock:
            return original_capture(self, mine, codes, bucket)

    monkeypatch.setattr(decode_graphs.DecodeGraphs, "_capture", serial_capture)
    finisher = Finisher(FakeCodec(), torch.device("cpu"), lambda command: None, workers=2)
    try:
        assert finisher.warm_decodes(4) == [3, 3]  # 8, 24 and 32, not 16, on both threads
        stats = FakeCodec.graphs.stats
        assert stats.captures == 6 and stats.failures == 2 and stats.replays == 6  # a capture replays once
        eager_before = stats.eager
        clips = [torch.full((1, 4, frames), 3, dtype=torch.long) for frames in (1, 8, 23, 31, 13)]

        def decode(clip):  # as `Codec.decode` runs it
            with torch.inference_mode():
                return FakeCodec.graphs.decode(clip)

        outs = [_on_lane(finisher, i % 2, decode, clip) for i, clip in enumerate(clips * 2)]
        assert all(torch.equal(out, clip.float() * 2) for out, clip in zip(outs, clips * 2))
        assert stats.replays == 6 + 8 and stats.eager == eager_before + 2  # 13 (bucket 16) stays eager
    finally:
        finisher.shutdown()


def test_warming_is_nothing_without_decode_graphs():
    from server.engine.runtime.finisher import Finisher

    class NoGraphs:
        sample_rate = 24000
        graphs = None

    finisher = Finisher(NoGraphs(), torch.device("cpu"), lambda command: None)
    assert finisher.warm_decodes(8) == []
    finisher.shutdown()
