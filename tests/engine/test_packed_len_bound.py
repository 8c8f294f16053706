"""The budget check of a long text's later chunks: an upper bound of their packed length
(no tokenising) where it fits, the exact length where it does not; refusals unchanged."""

from __future__ import annotations

import pytest

from server.engine.planning.request import plan_request
from server.engine.planning.utterances import packed_len_bound, packed_len_of
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest, VoicePrompt
from server.engine.work import RequestState
from tests.support.engine_helpers import Collector, start_engine

LONG = ("Dr. Smith measured 3.5 litres before noon. The second sentence runs on a little longer, with a "
        "clause or two, so that the text is chunked. ") * 6
TEXTS = [
    LONG,
    "你好，世界。今天天气很好，我们去公园散步吧。" * 20,
    "Emoji 🎉🎶 and marks: naïve café, Å (U+212B), क़ (U+0958), 𝅘𝅥𝅮 (U+1D160), ﬀ ligature. " * 12,
    "[laughter] Well, that was unexpected [sigh] but fine. " * 15,
    "  A line（with a note）\r\nbroken\t\tand 中文 spaced  out.  " * 15,
]


def _state(model, text: str, **options) -> RequestState:
    voice = options.pop("voice", None)
    request = SynthesisRequest("b", text, voice=voice, options=GenerationOptions(**options))
    return RequestState(request=request, plan=plan_request(model, request, 25), sink=None, seq=0, seed=0)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("options", [{}, {"first_chunk_seconds": 1.0}, {"guidance_scale": 0.0, "chunk_seconds": 4.0},
                                     {"voice": True, "chunk_seconds": 5.0}])
def test_bound_is_never_below_the_exact_length(model, text, options):
    import torch

    options = dict(options)
    if options.pop("voice", False):
        options["voice"] = VoicePrompt(tokens=torch.zeros((8, 40), dtype=torch.long), text="A short reference.",
                                       rms=0.1)
    state = _state(model, text, **options)
    assert state.num_chunks >= 2
    for index in range(state.num_chunks):
        assert packed_len_bound(state, index) >= packed_len_of(model, state, index)


def test_a_later_chunk_over_the_budget_is_refused_and_one_that_fits_by_its_exact_length_runs(model):
    opts = {"first_chunk_seconds": 1.0, "num_step": 2}
    state = _state(model, LONG, **opts)
    exact = [packed_len_of(model, state, i) for i in range(state.num_chunks)]
    later = max(range(1, state.num_chunks), key=lambda i: exact[i])
    assert exact[0] < exact[later] < packed_len_bound(state, later)

    eng = start_engine(model, max_packed_tokens=exact[later] - 1)  # chunk 0 fits, a later one does not
    try:
        with pytest.raises(RequestRejected, match=f"chunk {later} needs {exact[later]} packed tokens"):
            eng.submit(SynthesisRequest("over", LONG, options=GenerationOptions(**opts)), Collector())
    finally:
        eng.stop()

    eng = start_engine(model, max_packed_tokens=max(exact))  # every chunk fits, though not by the bound
    try:
        c = Collector()
        eng.submit(SynthesisRequest("fits", LONG, options=GenerationOptions(**opts)), c)
        c.wait(["fits"])
        assert c.outcome("fits") == "done"
    finally:
        eng.stop()
