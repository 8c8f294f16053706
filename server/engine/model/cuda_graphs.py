"""CUDA graphs for small steps: buckets, capture, replay.

Steps up to the largest token bucket replay a graph captured per bucket of (tokens, documents),
padded with dummy tokens that form their own documents, so real rows compute what they would
alone; larger steps run eagerly. The bucket grid and why it is shaped so: docs/architecture.md.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from server.engine.model.canvas import PackedCanvas
from server.engine.model.gc_pause import gc_paused

log = logging.getLogger(__name__)

# Buckets for CUDA graphs: packed tokens, and documents (real ones plus at least one pad
# document, so a bucket of D documents holds up to D - 1 real ones).
GRAPH_TOKEN_BUCKETS: tuple[int, ...] = (tuple(range(128, 1024, 64)) + tuple(range(1024, 4096, 256))
                                         + tuple(range(4096, 8193, 512)))
GRAPH_DOC_BUCKETS: tuple[int, ...] = (2, 3, 5, 9, 17, 33)
DEFAULT_GRAPH_MAX_TOKENS = GRAPH_TOKEN_BUCKETS[-1]
# (up to this many documents, extra token buckets): finer steps where a lone request's step falls
FINE_TOKEN_BUCKETS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (5, tuple(range(160, 1024, 64))),
    (9, (1152, 1408, 1664, 1920)),
)


def token_buckets_up_to(max_tokens: int) -> tuple[int, ...]:
    """The token buckets a graph limit keeps (none below the smallest: graphs off)."""
    return tuple(b for b in GRAPH_TOKEN_BUCKETS if b <= max_tokens)

# (ids (C, S), audio mask (S,), positions (S,), attention plan) -> final hidden states (S, H)
LayersFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


@lru_cache(maxsize=16)
def bucket_grid(token_buckets: tuple[int, ...] = GRAPH_TOKEN_BUCKETS, doc_buckets: tuple[int, ...] = GRAPH_DOC_BUCKETS,
                fine=FINE_TOKEN_BUCKETS) -> dict[int, tuple[int, ...]]:
    """Each document bucket's token buckets: the common ones, plus the fine ones that apply
    to it, never above the largest common one (the graph limit)."""
    top = max(token_buckets)
    return {docs: tuple(sorted({*token_buckets, *(t for limit, extra in fine if docs <= limit
                                                  for t in extra if t <= top)}))
            for docs in doc_buckets}


def choose_bucket(total_len: int, num_docs: int, token_buckets=GRAPH_TOKEN_BUCKETS,
                  doc_buckets=GRAPH_DOC_BUCKETS, fine=FINE_TOKEN_BUCKETS) -> tuple[int, int] | None:
    """Smallest (tokens, documents) bucket that holds the step plus >= 1 pad document of
    >= 1 token each; None when the step is too large for any graph (run it eagerly)."""
    di = bisect_left(doc_buckets, num_docs + 1)
    if di == len(doc_buckets):
        return None
    docs = doc_buckets[di]
    tokens = bucket_grid(tuple(token_buckets), tuple(doc_buckets), fine)[docs]
    ti = bisect_left(tokens, total_len + (docs - num_docs))
    if ti == len(tokens):
        return None
    return tokens[ti], docs


def pad_doc_lens(total_len: int, num_docs: int, bucket: tuple[int, int]) -> list[int]:
    """Lengths of the pad documents that fill a step up to its bucket exactly."""
    tokens, docs = bucket
    n_pad, pad_tokens = docs - num_docs, tokens - total_len
    if n_pad < 1 or pad_tokens < n_pad:
        raise ValueError(f"bucket {bucket} cannot hold {total_len} tokens in {num_docs} documents")
    return [pad_tokens - (n_pad - 1)] + [1] * (n_pad - 1)


@dataclass
class CapturedStep:
    """One bucket's graph and the static buffers it reads and writes."""

    tokens: int
    docs: int
    planner: object
    ids: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    graph: object = None
    out: torch.Tensor | None = None
    replays: int = 0
    filled_from: int = -1  # pad rows [filled_from:] hold pad values


@dataclass
class ForwardStats:
    """What the fused forward did: steps run eagerly and replayed, the pad tokens replays added,
    the buckets captured. Host-side counters, cheap."""

    eager_steps: int = 0
    graph_steps: int = 0
    graph_pad_tokens: int = 0
    captures: list[tuple[int, int]] = field(default_factory=list)


class StepGraphs:
    """Captures `layers` per bucket on first use (or ahead, `capture_all`) and replays it."""

    def __init__(self, layers: LayersFn, attention, device: torch.device, num_codebooks: int, mask_id: int,
                 stats: ForwardStats, token_buckets: tuple[int, ...] = GRAPH_TOKEN_BUCKETS,
                 doc_buckets: tuple[int, ...] = GRAPH_DOC_BUCKETS, capture_stream: torch.cuda.Stream | None = None):
        self.layers, self.attention, self.device = layers, attention, device
        # None: torch's one capture stream. Graphs that may replay at the same time need their
        # own, since cuBLAS keys its workspace by stream and a graph keeps the one it captured.
        self.capture_stream = capture_stream
        self.num_codebooks, self.mask_id = num_codebooks, mask_id
        self.stats = stats
        self.token_buckets, self.doc_buckets = tuple(token_buckets), tuple(doc_buckets)
        self.max_tokens = self.token_buckets[-1]
        self.captured: dict[tuple[int, int], CapturedStep] = {}
        self.capture_seconds = 0.0  # wall time spent capturing, warm-ups included (a server's start-up)
        self._pool = None

    def bucket_for(self, canvas: PackedCanvas) -> tuple[int, int] | None:
        return choose_bucket(canvas.total_len, len(canvas.doc_lens), self.token_buckets, self.doc_buckets)

    def replay(self, canvas: PackedCanvas, bucket: tuple[int, int]) -> torch.Tensor:
        g = self.captured.get(bucket) or self.capture(bucket)
        s = canvas.total_len
        g.planner.plan(list(canvas.doc_lens) + pad_doc_lens(s, len(canvas.doc_lens), bucket))
        # Pad rows: MASK audio tokens at position 0, in their own documents; any valid values
        # would do, fixed ones keep the pad rows finite and the runs reproducible.
        g.ids[:, :s].copy_(canvas.packed_ids, non_blocking=True)
        g.mask[:s].copy_(canvas.audio_mask, non_blocking=True)
        g.pos[:s].copy_(canvas.position_ids, non_blocking=True)
        if g.filled_from != s:  # only the copies above ever write these buffers
            g.ids[:, s:].fill_(self.mask_id)
            g.mask[s:].fill_(True)
            g.pos[s:].zero_()
            g.filled_from = s
        g.graph.replay()
        g.replays += 1
        self.stats.graph_steps += 1
        self.stats.graph_pad_tokens += bucket[0] - s
        return g.out[:s]

    def capture(self, bucket: tuple[int, int]) -> CapturedStep:
        tokens, docs = bucket
        dev = self.device
        g = CapturedStep(
            tokens=tokens, docs=docs, planner=self.attention.graph_planner(docs, tokens),
            ids=torch.full((self.num_codebooks, tokens), self.mask_id, dtype=torch.long, device=dev),
            mask=torch.ones(tokens, dtype=torch.bool, device=dev),
            pos=torch.zeros(tokens, dtype=torch.long, device=dev),
        )
        plan = g.planner.plan([tokens - docs + 1] + [1] * (docs - 1))
        side = self.capture_stream or torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # one warm-up: kernels built, cuBLAS handles and workspaces, lazy loads
            self.layers(g.ids, g.mask, g.pos, plan)
        torch.cuda.current_stream(dev).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool, stream=self.capture_stream,
                                          capture_error_mode="thread_local"):
            g.out = self.layers(g.ids, g.mask, g.pos, plan)
        g.graph = graph
        self.captured[bucket] = g
        self.stats.captures.append(bucket)
        log.info("captured a CUDA graph for %d tokens in %d documents", tokens, docs)
        return g

    def capture_all(self, buckets: list[tuple[int, int]] | None = None) -> int:
        """Capture graphs ahead of traffic (all buckets by default); returns how many exist."""
        gc.collect()  # unreachable graphs of earlier backbones go now, not during a capture
        start = time.perf_counter()
        for docs, token_buckets in bucket_grid(self.token_buckets, self.doc_buckets).items():
            for tokens in token_buckets:
                wanted = buckets is None or (tokens, docs) in buckets
                if wanted and docs < tokens and (tokens, docs) not in self.captured:
                    self.capture((tokens, docs))
        torch.cuda.synchronize(self.device)
        self.capture_seconds += time.perf_counter() - start
        return len(self.captured)
