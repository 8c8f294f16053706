"""What every attention backend offers: bidirectional attention within each document of a packed
row. q/k/v come in (S, H, D) layout (S = packed length) with the step's `doc_lens`, and the output
is (S, Hq, D). A plan is made once per step and shared by all layers, so per-step host work
(index building, kernel planning) is not paid per layer.
"""

from __future__ import annotations

from typing import Protocol

import torch


class AttentionBackend(Protocol):
    name: str

    def plan(self, doc_lens: list[int]) -> object:
        """Prepare for one step's documents; the result is passed to every `attend`."""

    def attend(self, plan: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Non-causal attention of q (S, Hq, D) over k, v (S, Hkv, D) within documents."""


def graph_layout(doc_lens: list[int], num_docs: int, max_rows: int) -> tuple[int, ...]:
    """`doc_lens` as the layout of a graph captured for exactly `num_docs` documents over
    `max_rows` rows (a CUDA graph planner's key); any other shape is refused."""
    if len(doc_lens) != num_docs or sum(doc_lens) != max_rows:
        raise ValueError(f"graph plan wants {num_docs} documents over {max_rows} rows, "
                         f"got {len(doc_lens)} over {sum(doc_lens)}")
    return tuple(doc_lens)


def head_dim_of(llm_config) -> int:
    """Per-head width of a Qwen3 config (`head_dim`, else hidden size over heads)."""
    return getattr(llm_config, "head_dim", None) or llm_config.hidden_size // llm_config.num_attention_heads
