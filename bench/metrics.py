"""Arithmetic of the benchmark: FLOPs of a packed forward, percentiles, the summary object."""

from __future__ import annotations

import math
from dataclasses import dataclass

PEAK_TFLOPS_DENSE_HALF = 989.0  # H100/H200 SXM datasheet, dense bf16/fp16 (docs/performance.md's MFU basis)

SUMMARY_KEYS = (
    "throughput_audio_s_per_s", "throughput_vs_reference", "single_10s_ms", "single_vs_reference",
    "long_first_audio_ms", "loaded_p95_10s_ms", "mfu_8k_tokens", "mfu_32k_tokens", "mixed_knobs_vs_plain",
    "ws_single_10s_first_audio_ms", "ws_single_gap_ms", "ws_single_fresh_length_first_audio_ms",
    "ws_long_first_audio_ms",
    "ws_long_fast_start_first_audio_ms", "ws_throughput_audio_s_per_s", "ws_loaded_p95_first_audio_ms",
    "fp8_throughput_audio_s_per_s", "fp8_token_agreement_vs_bf16", "fp8_logit_rel_error_vs_bf16",
    "fp8_single_10s_ms", "gpu", "dtype", "commit",
)


@dataclass(frozen=True)
class Arch:
    hidden: int = 1024
    layers: int = 28
    q_heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 3072
    codebooks: int = 8
    audio_vocab: int = 1025

    @classmethod
    def of(cls, model) -> Arch:
        c = model.llm.config
        return cls(c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                   getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads, c.intermediate_size,
                   model.config.num_audio_codebook, model.config.audio_vocab_size)

    @property
    def matmul_params_per_layer(self) -> int:
        qkv = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return qkv + o + mlp


def forward_flops(doc_lens: list[int], target_rows: int, arch: Arch = Arch()) -> float:
    """Useful FLOPs of one packed forward: layer GEMMs on every token, bidirectional
    attention within each document (QK^T and PV), the head GEMM on target rows only."""
    tokens = sum(doc_lens)
    gemm = 2.0 * arch.matmul_params_per_layer * arch.layers * tokens
    attn = 4.0 * arch.q_heads * arch.head_dim * arch.layers * sum(n * n for n in doc_lens)
    head = 2.0 * arch.hidden * arch.codebooks * arch.audio_vocab * target_rows
    return gemm + attn + head


def mfu(flops: float, seconds: float, peak_tflops: float = PEAK_TFLOPS_DENSE_HALF) -> float:
    return flops / seconds / (peak_tflops * 1e12)


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: list[float], digits: int = 3) -> dict:
    if not values:
        return {"n": 0}
    r = lambda x: round(x, digits)
    return {"n": len(values), "median": r(percentile(values, 50)), "p50": r(percentile(values, 50)),
            "p95": r(percentile(values, 95)), "min": r(min(values)), "max": r(max(values))}


def _get(d: dict, *path):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _ratio(a, b, digits: int = 3):
    return round(a / b, digits) if a is not None and b else None


def build_summary(result: dict) -> dict:
    """The top-level `summary` docs/performance.md asks for, from a result document; null where
    a scenario did not run."""
    thr = _get(result, "engine", "throughput_256", "audio_s_per_s")
    ref_thr = _get(result, "reference", "throughput_256", "audio_s_per_s")
    single = _get(result, "engine", "single_10s", "ms", "median")
    ref_single = _get(result, "reference", "single_10s", "ms", "median")
    mixed = _get(result, "engine", "mixed_knobs", "audio_s_per_s")
    meta = result.get("meta", {})
    summary = {
        "throughput_audio_s_per_s": thr,
        "throughput_vs_reference": _ratio(thr, ref_thr),
        "single_10s_ms": single,
        "single_vs_reference": _ratio(ref_single, single),
        "long_first_audio_ms": _get(result, "engine", "long_60s", "first_audio_ms", "median"),
        "loaded_p95_10s_ms": _get(result, "engine", "loaded", "total_ms", "p95"),
        "mfu_8k_tokens": _get(result, "forward", "mfu_8k_tokens"),
        "mfu_32k_tokens": _get(result, "forward", "mfu_32k_tokens"),
        "mixed_knobs_vs_plain": _ratio(mixed, thr),
        "ws_single_10s_first_audio_ms": _get(result, "server", "single_10s", "client_first_audio_ms", "median"),
        "ws_single_gap_ms": _get(result, "server", "single_10s", "gap_first_audio_ms", "median"),
        "ws_single_fresh_length_first_audio_ms": _get(result, "server", "single_10s_fresh_lengths",
                                                      "client_first_audio_ms", "median"),
        "ws_long_first_audio_ms": _get(result, "server", "long_60s", "client_first_audio_ms", "median"),
        "ws_long_fast_start_first_audio_ms": _get(result, "server", "long_60s_fast_start", "client_first_audio_ms",
                                                  "median"),
        "ws_throughput_audio_s_per_s": _get(result, "server", "throughput_256", "audio_s_per_s"),
        "ws_loaded_p95_first_audio_ms": _get(result, "server", "loaded", "client_first_audio_ms", "p95"),
        "fp8_throughput_audio_s_per_s": _get(result, "fp8", "throughput_256", "audio_s_per_s"),
        "fp8_token_agreement_vs_bf16": _get(result, "fp8", "fidelity", "token_agreement_vs_bf16"),
        "fp8_logit_rel_error_vs_bf16": _get(result, "fp8", "fidelity", "logit_rel_error_vs_bf16"),
        "fp8_single_10s_ms": _get(result, "fp8", "single_10s", "ms", "median"),
        "gpu": meta.get("gpu"),
        "dtype": meta.get("dtype"),
        "commit": meta.get("commit"),
    }
    assert tuple(summary) == SUMMARY_KEYS
    return summary


def emit_report(result: dict, out: str | None) -> None:
    """Print a bench result as JSON and, with `out`, write the same document there."""
    import json
    from pathlib import Path

    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
