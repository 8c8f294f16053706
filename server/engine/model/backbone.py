"""OmniVoiceBackbone: the reference model, driven one packed step at a time.

Holding the reference `OmniVoice` instance (rather than copying weights) keeps the
embedding merge (`_prepare_embed_inputs`), every Qwen3 submodule and `audio_heads` the
reference's own; only the attention call is swapped for a ragged, per-document one, and
only target positions go through the 1024 -> 8 x 1025 head GEMM and the float32 upcast.
"""

from __future__ import annotations

import torch

from server.engine.kernels.attention.base import AttentionBackend, head_dim_of
from server.engine.model.canvas import PackedCanvas
from server.engine.reference import ReferenceModel


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class OmniVoiceBackbone:
    def __init__(self, model: ReferenceModel, attention: AttentionBackend):
        self.model = model
        self.llm = model.llm
        self.attention = attention
        self.head_dim = head_dim_of(self.llm.config)
        self.num_codebooks = model.config.num_audio_codebook
        self.vocab = model.config.audio_vocab_size

    @property
    def device(self) -> torch.device:
        return self.model.audio_heads.weight.device

    @torch.inference_mode()
    def hidden_states(self, canvas: PackedCanvas) -> torch.Tensor:
        """Final-norm hidden states of the whole packed row, (S, hidden)."""
        x = self.model._prepare_embed_inputs(canvas.packed_ids.unsqueeze(0), canvas.audio_mask.unsqueeze(0))[0]
        cos, sin = self.llm.rotary_emb(x, canvas.position_ids.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # (S, 1, D), broadcast over heads
        plan = self.attention.plan(canvas.doc_lens)
        seq, d = x.shape[0], self.head_dim
        for layer in self.llm.layers:
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(seq, -1, d))
            k = attn.k_norm(attn.k_proj(h).view(seq, -1, d))
            v = attn.v_proj(h).view(seq, -1, d)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            o = self.attention.attend(plan, q, k, v)
            x = x + attn.o_proj(o.reshape(seq, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.llm.norm(x)

    @torch.inference_mode()
    def forward(self, canvas: PackedCanvas) -> torch.Tensor:
        """Float32 logits at target positions only: (S_t, C, V) in `tgt_index` order."""
        hidden = self.hidden_states(canvas).index_select(0, canvas.tgt_index)
        logits = self.model.audio_heads(hidden)
        return logits.view(-1, self.num_codebooks, self.vocab).float()

    __call__ = forward
