"""FusedBackbone: the packed forward with fused weights and FlashInfer kernels (CUDA).

The contract of `OmniVoiceBackbone` (float32 logits at the target rows, in `tgt_index` order) on
the reference's weights laid out once for fewer, larger GEMMs, with the Triton kernels that pass
their checks (`kernel_choices`). `TorchOps` gives the same kernels in torch, so the whole path is
checked on CPU against the reference (docs/architecture.md, "The fused backbone").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from server.engine.kernels import embed_merge, qk_norm_rope, split_k
from server.engine.kernels.attention.base import AttentionBackend, head_dim_of
from server.engine.kernels.fp8 import Fp8Linear, quantize_weight
from server.engine.kernels.layer_ops import FlashInferOps, TorchOps
from server.engine.model.canvas import PackedCanvas
from server.engine.model.cuda_graphs import (
    GRAPH_DOC_BUCKETS,
    GRAPH_TOKEN_BUCKETS,
    ForwardStats,
    StepGraphs,
    pad_doc_lens,
)
from server.engine.model.kernel_choices import choose_embed_order, choose_qk_rope, choose_split_k
from server.engine.reference import ReferenceModel

log = logging.getLogger(__name__)


# ---- the backbone -------------------------------------------------------------------------


@dataclass
class _Layer:
    ln1: torch.Tensor
    w_qkv: torch.Tensor  # each projection: bf16/fp16, or an `Fp8Weight` with --quantize fp8
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    w_o: torch.Tensor
    ln2: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    qk_norms: torch.Tensor  # (2, D): q_norm then k_norm, for the fused kernel


class FusedBackbone:
    def __init__(self, model: ReferenceModel, attention: AttentionBackend, ops=None, *, graphs: bool = False,
                 token_buckets: tuple[int, ...] = GRAPH_TOKEN_BUCKETS,
                 doc_buckets: tuple[int, ...] = GRAPH_DOC_BUCKETS, fuse_qk_rope: bool | None = None,
                 quantize: str | None = None, split_k: bool | None = None, fuse_embed: bool | None = None):
        self.model = model
        self.attention = attention
        self.ops = ops if ops is not None else (FlashInferOps() if attention.name == "flashinfer" else TorchOps())
        cfg = model.llm.config
        self.num_q_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = head_dim_of(cfg)
        self.eps = float(cfg.rms_norm_eps)
        rope = getattr(cfg, "rope_parameters", None) or {}
        self.rope_theta = float(rope.get("rope_theta") or getattr(cfg, "rope_theta", 10000.0))
        self.num_codebooks = model.config.num_audio_codebook
        self.vocab = model.config.audio_vocab_size
        self.mask_id = model.config.audio_mask_id
        self.layers = [self._fuse(layer) for layer in model.llm.layers]
        # the inner dimensions of the projections that small steps may split (O, down)
        self._split_inner_dims = (self.layers[0].w_o.shape[1], self.layers[0].w_down.shape[1])
        self.quantize = quantize
        self.linear = F.linear
        if quantize == "fp8":
            self.linear = Fp8Linear(self.device)  # refuses a device without FP8 tensor cores
            for layer in self.layers:
                for name in ("w_qkv", "w_o", "w_gate_up", "w_down"):
                    setattr(layer, name, quantize_weight(getattr(layer, name)))
        elif quantize is not None:
            raise ValueError(f"unknown quantization {quantize!r} (fp8 or none)")
        self.fp8_fused = quantize == "fp8"  # norms and the gate write e4m3 rows themselves
        self.final_norm = model.llm.norm.weight
        self.stats = ForwardStats()
        self.qk_rope_kernel, self.qk_rope_check_error = choose_qk_rope(
            fuse_qk_rope, self.device, self.dtype, self.num_q_heads, self.num_kv_heads, self.head_dim, self.eps,
            self.rope_theta)
        self.split_k = choose_split_k(split_k, self.device, self.dtype, quantize, self.layers[0].w_o.shape[0], self.eps)
        self.embed_order, self.embed_check = choose_embed_order(fuse_embed, model, self.device)
        self.graphs_enabled = graphs and self.device.type == "cuda" and hasattr(attention, "graph_planner")
        self.graphs = StepGraphs(self._embed_and_layers, attention, self.device, self.num_codebooks, self.mask_id,
                                 self.stats, token_buckets, doc_buckets)

    @property
    def graph_max_tokens(self) -> int:
        return self.graphs.max_tokens if self.graphs_enabled else 0

    @staticmethod
    @torch.no_grad()
    def _fuse(layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if getattr(lin, "bias", None) is not None:
                raise ValueError("FusedBackbone expects bias-free projections (Qwen3)")
        return _Layer(
            ln1=layer.input_layernorm.weight,
            w_qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], 0).contiguous(),
            q_norm=attn.q_norm.weight,
            k_norm=attn.k_norm.weight,
            w_o=attn.o_proj.weight,
            ln2=layer.post_attention_layernorm.weight,
            w_gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0).contiguous(),
            w_down=mlp.down_proj.weight,
            qk_norms=torch.stack([attn.q_norm.weight, attn.k_norm.weight]).contiguous(),
        )

    @property
    def device(self) -> torch.device:
        return self.model.audio_heads.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.audio_heads.weight.dtype

    # -- the math ------------------------------------------------------------------------

    def _layers(self, x: torch.Tensor, pos: torch.Tensor, plan) -> torch.Tensor:
        """The Qwen3 stack plus its final norm over a packed row x (S, hidden)."""
        ops, eps = self.ops, self.eps
        seq, hq, hkv, d = x.shape[0], self.num_q_heads, self.num_kv_heads, self.head_dim
        residual = x  # updated in place by fused_add_rmsnorm
        splits = split_k.splits_for(seq, self._split_inner_dims) if self.split_k else 1
        h = ops.rmsnorm(x, self.layers[0].ln1, eps)
        for i, layer in enumerate(self.layers):
            qkv = self.linear(h, layer.w_qkv).view(seq, hq + 2 * hkv, d)
            if self.qk_rope_kernel == "triton":
                q, k = qk_norm_rope.qk_norm_rope(qkv, layer.qk_norms, pos, hq, hkv, eps, self.rope_theta)
            else:
                q = ops.rmsnorm(qkv[:, :hq], layer.q_norm, eps, out=x.new_empty(seq, hq, d))
                k = ops.rmsnorm(qkv[:, hq : hq + hkv], layer.k_norm, eps, out=x.new_empty(seq, hkv, d))
                ops.rope_inplace(q, k, pos, self.rope_theta)
            v = qkv[:, hq + hkv :]
            o = self.attention.attend(plan, q, k, v)
            h = self._project_add_norm(o.reshape(seq, hq * d), layer.w_o, residual, layer.ln2, splits)
            gate = self._gate(self.linear(h, layer.w_gate_up))
            # the next layer's input norm; after the last layer the final norm, whose hidden
            # states stay in the model's dtype
            last = i + 1 == len(self.layers)
            h = self._project_add_norm(gate, layer.w_down, residual,
                                       self.final_norm if last else self.layers[i + 1].ln1, splits, plain=last)
        return h

    def _project_add_norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                          norm: torch.Tensor, splits: int, plain: bool = False) -> torch.Tensor:
        """`residual += x @ weight.T`, then the norm of it: in `splits` inner slices summed by the
        norm, or one GEMM and `_add_norm` (`plain`: the ops' own add + norm, never fp8 rows)."""
        if splits > 1:
            return split_k.split_add_rmsnorm(split_k.split_linear(x, weight, splits), residual, norm, self.eps)
        h = self.linear(x, weight)
        if plain:
            self.ops.fused_add_rmsnorm(h, residual, norm, self.eps)
            return h
        return self._add_norm(h, residual, norm)

    def _add_norm(self, h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor):
        """`residual += h`, then the norm of it as the next projection's input: written over h,
        or, in fp8 with fused quantisation, straight to e4m3 (`fp8.QuantizedRows`)."""
        if self.fp8_fused:
            return self.linear.quantizers.add_rmsnorm_quantize(h, residual, weight, self.eps)
        self.ops.fused_add_rmsnorm(h, residual, weight, self.eps)
        return h

    def _gate(self, gate_up: torch.Tensor):
        """The MLP's SiLU gate, as the down projection's input (fp8 fused: in e4m3)."""
        if self.fp8_fused:
            return self.linear.quantizers.silu_mul_quantize(gate_up)
        return self.ops.silu_and_mul(gate_up)

    def _embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.embed_order is not None:
            return embed_merge.embed_merge(self.model, ids, mask, self.embed_order)
        return self.model._prepare_embed_inputs(ids.unsqueeze(0), mask.unsqueeze(0))[0]

    def _embed_and_layers(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, plan) -> torch.Tensor:
        return self._layers(self._embed(ids, mask), pos, plan)

    @torch.inference_mode()
    def hidden_states(self, canvas: PackedCanvas) -> torch.Tensor:
        """Final-norm hidden states of the packed row, (S, hidden); a graph when one fits."""
        if self.graphs_enabled:
            bucket = self.graphs.bucket_for(canvas)
            if bucket is not None:
                return self.graphs.replay(canvas, bucket)
        self.stats.eager_steps += 1
        plan = self.attention.plan(canvas.doc_lens)
        return self._layers(self._embed(canvas.packed_ids, canvas.audio_mask), canvas.position_ids, plan)

    @torch.inference_mode()
    def hidden_states_padded(self, canvas: PackedCanvas, bucket: tuple[int, int]) -> torch.Tensor:
        """The graph path's arithmetic without a graph (real rows of a padded row): lets the
        padding be checked on any device."""
        s = canvas.total_len
        pad = pad_doc_lens(s, len(canvas.doc_lens), bucket)
        ids = torch.full((self.num_codebooks, bucket[0]), self.mask_id, dtype=torch.long, device=self.device)
        mask = torch.ones(bucket[0], dtype=torch.bool, device=self.device)
        pos = torch.zeros(bucket[0], dtype=torch.long, device=self.device)
        ids[:, :s], mask[:s], pos[:s] = canvas.packed_ids, canvas.audio_mask, canvas.position_ids
        plan = self.attention.plan(list(canvas.doc_lens) + pad)
        return self._layers(self._embed(ids, mask), pos, plan)[:s]

    @torch.inference_mode()
    def head_logits(self, canvas: PackedCanvas) -> torch.Tensor:
        """Logits at target positions only, in the model's dtype: (S_t, C, V) in `tgt_index`
        order (the sampler's fused scoring reads them so, without a float32 copy)."""
        hidden = self.hidden_states(canvas).index_select(0, canvas.tgt_index)
        return F.linear(hidden, self.model.audio_heads.weight).view(-1, self.num_codebooks, self.vocab)

    @torch.inference_mode()
    def forward(self, canvas: PackedCanvas) -> torch.Tensor:
        """Float32 logits at target positions only: (S_t, C, V) in `tgt_index` order."""
        return self.head_logits(canvas).float()

    __call__ = forward

    @torch.inference_mode()
    def capture(self, buckets: list[tuple[int, int]] | None = None) -> int:
        """Capture graphs ahead of traffic (all buckets by default); returns how many exist."""
        return self.graphs.capture_all(buckets) if self.graphs_enabled else 0

    @torch.inference_mode()
    def warm_eager(self, tokens: int) -> bool:
        """One eager forward of `tokens` rows (two documents) and the head on half of them,
        ahead of traffic; False where every step that large replays a graph.

        The first eager step of a process otherwise pays on a request's path for what only a
        step too large for the graphs needs: Triton builds each eager-only kernel variant on its
        first launch (slow with an empty kernel cache, as in a new container), and the caching
        allocator grows to the largest step's activations, which it keeps.
        """
        if tokens <= self.graph_max_tokens or self.device.type != "cuda":
            return False
        docs = [tokens - tokens // 2, tokens // 2]
        with torch.cuda.device(self.device):
            ids = torch.full((self.num_codebooks, tokens), self.mask_id, dtype=torch.long, device=self.device)
            mask = torch.ones(tokens, dtype=torch.bool, device=self.device)
            pos = torch.cat([torch.arange(n, device=self.device) for n in docs])
            hidden = self._layers(self._embed(ids, mask), pos, self.attention.plan(docs))
            F.linear(hidden[: docs[1]], self.model.audio_heads.weight)
            torch.cuda.synchronize(self.device)
        return True
