"""The part of the reference `OmniVoice` instance the engine uses, as a typed surface.

The engine drives the reference model itself (its modules, tokenizers, codec and helpers), so
its canvases, estimates and audio stay the reference's. `ReferenceModel` names exactly what it
reads and calls; an `omnivoice.OmniVoice` loaded by `server.checkpoint.load_omnivoice` is one.
Private methods among them are also checked at boot (`upstream.py`).

The engine changes an instance in two places, both once, when an engine is made on it: the
duration estimator's per-character sum becomes a table lookup with the same result
(`planning/char_weights.py`: `DurationEstimator.calculate_total_weight` is replaced on that
instance), and on CUDA the codec's Snake activations run as one Triton kernel each
(`kernels/snake.py`: the modules' `forward`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class ReferenceConfig(Protocol):
    audio_mask_id: int  # the MASK token id; also the size of each codebook's real vocabulary
    num_audio_codebook: int
    audio_vocab_size: int  # per codebook, MASK included


class DurationEstimator(Protocol):
    """`omnivoice.utils.duration.RuleDurationEstimator`: what `_estimate_target_tokens` asks."""

    calculate_total_weight: Callable[[str], float]  # replaced by the table's sum (see above)

    def _get_char_weight(self, char: str) -> float: ...


class AudioTokenizer(Protocol):
    """The reference's codec (a transformers DAC-style model): decode codes, encode voices."""

    device: torch.device
    config: Any  # `frame_rate`: codec frames per second of audio
    acoustic_decoder: torch.nn.Module  # what the decode graphs capture

    def decode(self, codes: torch.Tensor) -> Any: ...  # `.audio_values`: (1, channels, N)


class ReferenceModel(Protocol):
    config: ReferenceConfig
    llm: Any  # the Qwen3 body: `.config`, `.layers`, `.norm`, `.rotary_emb`
    audio_heads: torch.nn.Linear  # hidden -> codebooks x vocab; its weight's device is the model's
    audio_embeddings: torch.nn.Embedding
    codebook_layer_offsets: torch.Tensor
    audio_tokenizer: AudioTokenizer
    text_tokenizer: Any  # a transformers fast tokenizer
    duration_estimator: DurationEstimator
    sampling_rate: int
    _asr_pipe: Any  # the transcriber, once `load_asr_model` ran (else None)

    def get_input_embeddings(self) -> torch.nn.Embedding: ...

    def _prepare_embed_inputs(self, input_ids: torch.Tensor, audio_mask: torch.Tensor) -> torch.Tensor: ...

    def _estimate_target_tokens(self, text: str, ref_text: str | None, num_ref_audio_tokens: int | None,
                                speed: float = 1.0) -> int: ...

    def create_voice_clone_prompt(self, ref_audio: tuple[torch.Tensor, int], ref_text: str | None = None) -> Any:
        """A `VoiceClonePrompt`: `ref_audio_tokens`, `ref_text`, `ref_rms`."""

    def load_asr_model(self, model_name: str | None = None) -> None: ...
