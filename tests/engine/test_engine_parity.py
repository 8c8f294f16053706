"""The packed engine gives exactly the reference `generate()`'s tokens and audio.

Each reference run is alone (batch of one); Chorus runs the same requests packed together
with others, joining at different steps, with mixed knobs. With both temperatures 0
decoding is deterministic, so tokens must be equal, not merely close.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.model.backbone import OmniVoiceBackbone
from server.engine.model.canvas import build_packed_canvas
from server.engine.types import GenerationOptions, SynthesisRequest, VoicePrompt
from server.engine.work import CanvasItem
from tests.support.engine_helpers import GREEDY, Collector, reference_generate

TEXTS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "A somewhat longer sentence, so that this canvas is clearly longer than the others in the step.",
    "Short one!",
    "Numbers like 42 and names like Ada Lovelace are fine too.",
]


@pytest.fixture(scope="module")
def voice(reference_model, reference_clip):
    clip, sr = reference_clip
    prompt = reference_model.create_voice_clone_prompt((torch.from_numpy(clip), sr), ref_text="A short reference")
    return prompt, VoicePrompt(tokens=prompt.ref_audio_tokens, text=prompt.ref_text, rms=prompt.ref_rms)


def _opts(**kw) -> GenerationOptions:
    return GenerationOptions(**{**GREEDY, "num_step": 12, **kw})


def _reference_kwargs(opts: GenerationOptions) -> dict:
    return dict(num_step=opts.num_step, guidance_scale=opts.guidance_scale, t_shift=opts.t_shift,
                layer_penalty_factor=opts.layer_penalty_factor, position_temperature=opts.position_temperature,
                class_temperature=opts.class_temperature, denoise=opts.denoise,
                postprocess_output=opts.postprocess, audio_chunk_duration=opts.chunk_seconds,
                audio_chunk_threshold=opts.chunk_threshold, speed=opts.speed, duration=opts.duration)


def _assert_same_as_reference(model, collector, rid, text, opts, voice=None, instruct=None, language=None,
                              check_audio=True):
    ref_tokens, ref_audio = reference_generate(
        model, text, voice_clone_prompt=voice, instruct=instruct, language=language, **_reference_kwargs(opts)
    )
    ours = collector.tokens(rid)
    assert len(ours) == len(ref_tokens)
    for mine, theirs in zip(ours, ref_tokens):
        np.testing.assert_array_equal(mine, theirs)
    if check_audio:
        audio = collector.audio(rid)
        assert len(audio) == 1
        np.testing.assert_array_equal(audio[0], ref_audio)


def test_packed_forward_matches_reference_forward(reference_model, voice):
    model = reference_model
    _, vp = voice
    items = []
    for text, ref, g in [("Hello there.", None, 2.0), ("A second, longer canvas here.", vp, 0.0),
                         ("Third one with guidance.", vp, 3.0)]:
        inputs = model._prepare_inference_inputs(text, 30 + len(items) * 7, ref.text if ref else None,
                                                 ref.tokens if ref else None, "en", None, True)
        ids, mask = inputs["input_ids"][0], inputs["audio_mask"][0]
        t_len = 30 + len(items) * 7
        tokens = ids[:, -t_len:].clone()
        tokens[:, ::3] = torch.randint(0, 1024, tokens[:, ::3].shape, generator=torch.Generator().manual_seed(1))
        items.append(CanvasItem(f"i{len(items)}", ids[:, :-t_len], mask[:-t_len], tokens, g))
    canvas = build_packed_canvas(items, "cpu")
    assert canvas.doc_lens == [items[0].cond_len, items[0].target_len, items[1].cond_len,
                               items[2].cond_len, items[2].target_len]
    assert canvas.total_len == sum(canvas.doc_lens)  # no padding
    llm_cfg = model.llm.config
    logits = OmniVoiceBackbone(model, TorchAttention(llm_cfg.head_dim**-0.5))(canvas)
    assert logits.dtype == torch.float32
    assert logits.shape[0] == sum(i.target_len for i in items) + items[0].target_len + items[2].target_len

    def reference_logits(ids, mask):
        n = ids.shape[-1]
        full = torch.ones(1, 1, n, n, dtype=torch.bool)
        with torch.inference_mode():
            out = model(input_ids=ids.unsqueeze(0), audio_mask=mask.unsqueeze(0), attention_mask=full).logits
        return out[0].permute(1, 0, 2).float()  # (S, C, V)

    for index, item in enumerate(items):
        cond, uncond = canvas.slice_logits(logits, index)
        ids = torch.cat([item.prefix_ids, item.tokens], dim=1)
        mask = torch.cat([item.prefix_audio_mask, torch.ones(item.target_len, dtype=torch.bool)])
        expected = reference_logits(ids, mask)[-item.target_len:]
        torch.testing.assert_close(cond, expected, atol=1e-4, rtol=0)
        if item.does_cfg:
            expected_u = reference_logits(item.tokens, torch.ones(item.target_len, dtype=torch.bool))
            torch.testing.assert_close(uncond, expected_u, atol=1e-4, rtol=0)
        else:
            assert uncond is None


def test_one_request(engine, reference_model):
    c = Collector()
    opts = _opts()
    engine.submit(SynthesisRequest("one", TEXTS[1], options=opts, stream="whole"), c)
    c.wait(["one"])
    assert c.outcome("one") == "done"
    _assert_same_as_reference(reference_model, c, "one", TEXTS[1], opts)
    steps = c.progress("one")
    assert [p.step for p in steps] == list(range(1, 13)) and steps[-1].fraction == 1.0


def test_five_requests_joining_at_different_steps(engine, reference_model):
    """Each request enters while the previous ones are mid-way (step 3 of the last)."""
    c = Collector()
    opts = [_opts(num_step=12), _opts(num_step=10), _opts(num_step=12, guidance_scale=0.0),
            _opts(num_step=8, t_shift=0.5), _opts(num_step=12, layer_penalty_factor=1.0)]
    requests = [SynthesisRequest(f"r{i}", TEXTS[i], options=opts[i], stream="whole") for i in range(5)]
    submitted = {"next": 1}

    def chain(progress):
        index = submitted["next"]
        if progress.request_id == f"r{index - 1}" and progress.step == 3 and index < 5:
            submitted["next"] += 1
            engine.submit(requests[index], c)

    c.on_progress = chain
    start = len(engine.step_log)
    engine.submit(requests[0], c)
    c.wait([r.request_id for r in requests])
    assert submitted["next"] == 5
    steps = list(engine.step_log)[start:]
    assert max(s.items for s in steps) >= 3  # they really shared steps
    assert sum(s.admitted for s in steps) == 5
    for req in requests:
        assert c.outcome(req.request_id) == "done"
        _assert_same_as_reference(reference_model, c, req.request_id, req.text, req.options)


def test_mixed_guidance_cloning_steps_and_design(engine, reference_model, voice):
    prompt, vp = voice
    cases = [
        ("m0", TEXTS[0], _opts(guidance_scale=0.0), None, None, "en"),
        ("m1", TEXTS[1], _opts(num_step=20), vp, None, None),
        ("m2", TEXTS[2], _opts(num_step=6, guidance_scale=3.0), None, "female, low pitch, british accent", None),
        ("m3", TEXTS[3], _opts(guidance_scale=0.0, denoise=False), vp, None, "English"),
        ("m4", TEXTS[4], _opts(speed=1.5), None, None, None),
        ("m5", TEXTS[1], _opts(duration=1.2, postprocess=False), vp, None, None),
    ]
    c = Collector()
    start = len(engine.step_log)
    for rid, text, opts, v, instruct, lang in cases:
        engine.submit(SynthesisRequest(rid, text, language=lang, instruct=instruct, voice=v, options=opts,
                                       stream="whole"), c)
    c.wait([case[0] for case in cases])
    assert max(s.items for s in list(engine.step_log)[start:]) >= 4
    for rid, text, opts, v, instruct, lang in cases:
        assert c.outcome(rid) == "done", c.finished[rid]
        _assert_same_as_reference(reference_model, c, rid, text, opts, voice=prompt if v else None,
                                  instruct=instruct, language=lang)


LONG_TEXT = ("This is the first sentence of a long paragraph. Here comes a second sentence, a bit longer. "
             "And a third one follows it! Is there a fourth? Yes, and a fifth closes the paragraph.")


@pytest.mark.parametrize("with_voice", [False, True])
def test_long_text_chunks_like_the_reference(engine, reference_model, voice, with_voice):
    prompt, vp = voice
    opts = _opts(chunk_threshold=2.0, chunk_seconds=2.5)
    c = Collector()
    accepted = engine.submit(SynthesisRequest("long", LONG_TEXT, voice=vp if with_voice else None, options=opts,
                                              stream="whole"), c)
    assert accepted.chunks >= 3
    c.wait(["long"])
    assert c.outcome("long") == "done"
    _assert_same_as_reference(reference_model, c, "long", LONG_TEXT, opts, voice=prompt if with_voice else None)
    # chunk streaming: the same tokens, each chunk post-processed on its own, in order
    c2 = Collector()
    engine.submit(SynthesisRequest("long2", LONG_TEXT, voice=vp if with_voice else None, options=opts), c2)
    c2.wait(["long2"])
    for mine, theirs in zip(c2.tokens("long2"), c.tokens("long")):
        np.testing.assert_array_equal(mine, theirs)
    chunks = [e for e in c2.events["long2"] if type(e).__name__ == "ChunkAudio"]
    assert sorted(e.chunk for e in chunks) == list(range(accepted.chunks))
    assert [e.final for e in sorted(chunks, key=lambda e: e.chunk)] == [False] * (accepted.chunks - 1) + [True]


def test_seeded_request_same_alone_and_in_a_crowd(engine, voice):
    _, vp = voice
    opts = GenerationOptions(num_step=10, seed=1234)  # default temperatures: random
    alone = Collector()
    engine.submit(SynthesisRequest("s", TEXTS[2], options=opts), alone)
    alone.wait(["s"])
    crowd = Collector()
    for i in range(6):
        engine.submit(SynthesisRequest(f"c{i}", TEXTS[i % 5], voice=vp if i % 2 else None,
                                       options=GenerationOptions(num_step=6 + i, seed=None)), crowd)
    engine.submit(SynthesisRequest("s", TEXTS[2], options=opts), crowd)
    crowd.wait(["s"] + [f"c{i}" for i in range(6)])
    np.testing.assert_array_equal(alone.tokens("s")[0], crowd.tokens("s")[0])
    np.testing.assert_array_equal(alone.audio("s")[0], crowd.audio("s")[0])
    other = Collector()
    engine.submit(SynthesisRequest("s", TEXTS[2], options=GenerationOptions(num_step=10, seed=99)), other)
    other.wait(["s"])
    assert not np.array_equal(other.tokens("s")[0], alone.tokens("s")[0])


def test_voice_encoding_equals_reference(engine, reference_model, reference_clip):
    clip, sr = reference_clip
    ours = engine.encode_voice(clip, sr, "A short reference").result(timeout=60)
    theirs = reference_model.create_voice_clone_prompt((torch.from_numpy(clip), sr), ref_text="A short reference")
    assert torch.equal(ours.tokens, theirs.ref_audio_tokens)
    assert ours.text == theirs.ref_text and ours.rms == pytest.approx(theirs.ref_rms)


@pytest.mark.parametrize("text,ref,lang,instruct,denoise", [
    ("Hello there.", False, None, None, True),
    ("With a voice [laughter] and tags.", True, "en", None, True),
    ("No denoise with a voice.", True, None, None, False),
    ("Designed 你好 voice.", False, "zh", "female, low pitch", True),
])
def test_host_built_canvas_equals_reference_prepare_inputs(reference_model, voice, text, ref, lang, instruct, denoise):
    from server.engine.planning.utterances import build_utterance
    from server.engine.work import ChunkPlan, RequestPlan, RequestState

    _, vp = voice
    model = reference_model
    request = SynthesisRequest("c", text, options=GenerationOptions(denoise=denoise))
    plan = RequestPlan(lang, instruct, [ChunkPlan(text, 17)], None, chained=False)
    state = RequestState(request=request, plan=plan, sink=None, seq=0, seed=0)
    utt = build_utterance(model, state, 0, vp if ref else None, torch.device("cpu"))
    expected = model._prepare_inference_inputs(text, 17, vp.text if ref else None, vp.tokens if ref else None,
                                               lang, instruct, denoise)
    ids = torch.cat([utt.item.prefix_ids, utt.item.tokens], dim=1)
    assert torch.equal(ids, expected["input_ids"][0])
    mask = torch.cat([utt.item.prefix_audio_mask, torch.ones(17, dtype=torch.bool)])
    assert torch.equal(mask, expected["audio_mask"][0])
    assert utt.item.prefix_audio_mask_host.tolist() == utt.item.prefix_audio_mask.tolist()
