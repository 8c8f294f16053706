"""The finisher's decoded, post-processed audio is the reference's, sample for sample."""

from __future__ import annotations

import queue

import numpy as np
import torch
from omnivoice.models.omnivoice import OmniVoiceGenerationConfig
from omnivoice.utils.audio import cross_fade_chunks

from server.engine.codec import Codec
from server.engine.finisher import ChunkDecoded, Finisher, WholeReady


def test_finisher_post_processes_as_the_reference(reference_model):
    codec = Codec(reference_model)
    results: queue.Queue = queue.Queue()
    finisher = Finisher(codec, torch.device("cpu"), results.put)
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
        # each job's time is measured where it ran (for the bench's stage timings)
        assert finisher.post_jobs == 2 and len(finisher.post_ms) == 2 and min(finisher.post_ms) > 0
    finally:
        finisher.shutdown()


def test_decode_streams_have_the_highest_priority_unless_turned_off(monkeypatch, reference_model):
    """A decode under load must not wait behind the steps' blocks (its request's first audio
    waits for it); the finisher asks for the highest stream priority, an ordinary one when told."""
    from server.engine.worker_streams import HIGHEST_PRIORITY

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

    from server.engine import finisher as finisher_module
    from server.engine.codec import post_process

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
