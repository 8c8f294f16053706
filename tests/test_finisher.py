"""Post-processing in worker processes gives the very same audio as in the engine process."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

from server.engine.codec import Codec
from server.engine.finisher import ChunkDecoded, Finisher, WholeReady


@pytest.mark.parametrize("processes", [0, 1])
def test_post_processing_is_identical_in_threads_and_processes(reference_model, processes):
    codec = Codec(reference_model)
    results: queue.Queue = queue.Queue()
    finisher = Finisher(codec, torch.device("cpu"), results.put, processes=processes)
    try:
        tokens = torch.randint(0, 1024, (8, 60), generator=torch.Generator().manual_seed(3))
        finisher.decode("state", 0, tokens, None, 0.05, True)
        decoded = results.get(timeout=120)
        assert isinstance(decoded, ChunkDecoded) and decoded.post_processed
        raw = codec.decode(tokens)
        np.testing.assert_array_equal(decoded.audio, codec.post_process(raw, 0.05, True))
        np.testing.assert_array_equal(decoded.tokens, tokens.numpy())

        other = codec.decode(torch.randint(0, 1024, (8, 40), generator=torch.Generator().manual_seed(4)))
        finisher.join("state", [raw, other], None, True)
        whole = results.get(timeout=120)
        assert isinstance(whole, WholeReady)
        np.testing.assert_array_equal(whole.audio, codec.post_process(codec.join([raw, other]), None, True))
        # each job's time is measured where it ran (for the bench's stage timings)
        assert finisher.post_jobs == 2 and len(finisher.post_ms) == 2 and min(finisher.post_ms) > 0
    finally:
        finisher.shutdown()


def test_engine_with_post_processing_processes_matches_the_reference(tiny_checkpoint, reference_model):
    from server.config import EngineSettings
    from server.engine.loop import EngineLoop
    from server.engine.types import GenerationOptions, SynthesisRequest
    from tests.engine_helpers import GREEDY, Collector, reference_generate

    engine = EngineLoop.load(str(tiny_checkpoint), EngineSettings(postprocess_processes=1))
    engine.start()
    try:
        c = Collector()
        text = "Post-processed in another process."
        engine.submit(SynthesisRequest("p", text, options=GenerationOptions(num_step=8, **GREEDY)), c)
        c.wait(["p"])
        assert c.outcome("p") == "done"
        _, ref_audio = reference_generate(reference_model, text, num_step=8, **GREEDY)
        np.testing.assert_array_equal(c.audio("p")[0], ref_audio)
    finally:
        engine.stop()
