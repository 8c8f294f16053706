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
