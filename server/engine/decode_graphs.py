"""Codec decodes replayed as CUDA graphs, one per frame count (CUDA only).

A chunk's decode is ~370 host operators (Python modules, 32 cuDNN convolutions) for about
2.7 ms of GPU work at 10 s: on an H200 it takes ~7 ms of wall time, bound by the host, and a
request's first audio waits for it. Replayed as a graph the host part all but goes.

Padding clips to a few sizes would change the samples near each clip's end (the decoder's
convolutions see past it), so graphs are keyed by the exact frame count: the first decode
of a length on a thread runs eagerly (it also builds cuDNN's plans and Triton's kernels for
that shape), the second captures a graph, and every later one replays it, bit for bit the
eager decode (the same kernels on the same inputs; checked on an H200). Under steady
traffic nearly every length has been seen; `max_frames` and `max_graphs` bound the cache.
Short lengths, those of fast start's first chunks and of a text stream's sentences, where a
new length would otherwise cost its first audio ~5 ms of eager decode, are captured at
start-up on every worker thread (`warm`, `WARM_FRAMES`).

Each worker thread keeps its own graphs and memory pool and captures on its own stream
(thread-local capture mode), so decodes on other threads and the step loop carry on; a
thread's graphs share one pool, safe because they replay one at a time on that thread and
each output is copied out before the next replay. A decode that cannot be captured stays
eager for that length, logged once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from server.engine.gc_pause import gc_paused

log = logging.getLogger(__name__)

MAX_FRAMES = 1500  # 60 s at 25 frames/s: longer chunks decode eagerly
MAX_GRAPHS = 512  # per worker thread
# Lengths captured at start-up: 0.5 to 4 s at 25 frames/s (the short chunks whose first
# audio a listener waits for); on an H200 about 2 s of start-up for two worker threads.
WARM_FRAMES = range(12, 101)


def wanted(device: torch.device) -> bool:
    """On by default on CUDA; `CHORUS_DECODE_GRAPHS=0` turns it off."""
    return device.type == "cuda" and os.environ.get("CHORUS_DECODE_GRAPHS", "") != "0"


@dataclass
class _Captured:
    codes: torch.Tensor  # static input (1, C, T), outside the pool
    audio: torch.Tensor  # output (1, channels, samples), inside the pool
    graph: torch.cuda.CUDAGraph


@dataclass
class _ThreadGraphs:
    pool: tuple = field(default_factory=torch.cuda.graph_pool_handle)
    graphs: dict[int, _Captured] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)


@dataclass
class DecodeGraphStats:
    replays: int = 0
    captures: int = 0
    eager: int = 0
    failures: int = 0


class DecodeGraphs:
    """`decode(codes)` for (1, C, T) codes on the device: `decode_fn(codes)` eagerly, or its
    graph for T replayed (the returned tensor is valid until this thread's next decode)."""

    def __init__(self, decode_fn: Callable[[torch.Tensor], torch.Tensor], max_frames: int = MAX_FRAMES,
                 max_graphs: int = MAX_GRAPHS):
        self.decode_fn = decode_fn
        self.max_frames = max_frames
        self.max_graphs = max_graphs
        self.stats = DecodeGraphStats()
        self._local = threading.local()
        self._lock = threading.Lock()  # stats only

    def _mine(self) -> _ThreadGraphs:
        mine = getattr(self._local, "graphs", None)
        if mine is None:
            mine = self._local.graphs = _ThreadGraphs()
        return mine

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        frames = codes.shape[-1]
        stream = torch.cuda.current_stream(codes.device)
        if stream == torch.cuda.default_stream(codes.device) or frames > self.max_frames:
            return self._eager(codes)  # no capture on the legacy default stream
        mine = self._mine()
        captured = mine.graphs.get(frames)
        if captured is None:
            if frames not in mine.seen or frames in mine.failed or len(mine.graphs) >= self.max_graphs:
                mine.seen.add(frames)
                return self._eager(codes)
            captured = self._capture(mine, codes)
            if captured is None:
                return self._eager(codes)
        captured.codes.copy_(codes)
        captured.graph.replay()
        self._count("replays")
        return captured.audio

    def warm(self, frame_counts, num_codebooks: int, device: torch.device) -> int:
        """On the calling thread (on its own stream): decode each length twice, so it is
        captured and later decodes of it replay; returns how many lengths replay here now."""
        mine = self._mine()
        with torch.inference_mode():  # as `Codec.decode` runs
            for frames in frame_counts:
                if frames > self.max_frames or len(mine.graphs) >= self.max_graphs:
                    break
                codes = torch.zeros((1, num_codebooks, frames), dtype=torch.long, device=device)
                for _ in range(2):  # eager (builds plans and kernels), then captured
                    if frames in mine.graphs or frames in mine.failed:
                        break
                    self.decode(codes)
        torch.cuda.current_stream(device).synchronize()
        return len(mine.graphs)

    def _eager(self, codes: torch.Tensor) -> torch.Tensor:
        self._count("eager")
        return self.decode_fn(codes)

    def _capture(self, mine: _ThreadGraphs, codes: torch.Tensor) -> _Captured | None:
        frames = codes.shape[-1]
        static = codes.clone()  # an ordinary allocation: no graph ever writes over it
        graph = torch.cuda.CUDAGraph()
        try:
            # capture_begin/end, not torch.cuda.graph(): that synchronizes the whole device and
            # empties the allocator's cache first, which would stall the step loop
            with gc_paused():
                graph.capture_begin(pool=mine.pool, capture_error_mode="thread_local")
                try:
                    audio = self.decode_fn(static)
                finally:
                    graph.capture_end()
        except Exception as exc:  # noqa: BLE001 - this length stays eager
            mine.failed.add(frames)
            self._count("failures")
            log.warning("decode of %d frames could not be captured as a CUDA graph (%s); decoding it eagerly",
                        frames, exc)
            return None
        captured = _Captured(static, audio, graph)
        mine.graphs[frames] = captured
        self._count("captures")
        return captured

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)
