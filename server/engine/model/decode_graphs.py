"""Codec decodes replayed as CUDA graphs, one per bucket of lengths (CUDA only).

A clip decodes at its bucket's length with every convolution's input zeroed past its own end
(a forward pre-hook driven by a device tensor), so its samples are the exact-length decode's and
one graph serves every length in a bucket. Each worker thread keeps its own graphs and pool and
captures on its own stream; the engine thread may replay an idle lane's graphs on that lane's
stream (docs/architecture.md, "Finishing chunks").
"""

from __future__ import annotations

import logging
import math
import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from server import envs
from server.engine.model.gc_pause import gc_paused

log = logging.getLogger(__name__)

MAX_FRAMES = 800  # 32 s at 25 frames/s: chunks are ~15 s, unchunked texts up to 30 s


def _buckets(max_frames: int) -> tuple[int, ...]:
    out = list(range(4, 49, 4))
    while out[-1] < max_frames:
        out.append(min(max_frames, 8 * math.ceil(out[-1] * 1.08 / 8)))
    return tuple(out)


BUCKETS = _buckets(MAX_FRAMES)


def bucket_for(frames: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    i = bisect_left(buckets, frames)
    return buckets[i] if i < len(buckets) else None


def wanted(device: torch.device) -> bool:
    """On by default on CUDA; `CHORUS_DECODE_GRAPHS=0` turns it off."""
    return device.type == "cuda" and envs.CHORUS_DECODE_GRAPHS


def lowest_frames(bucket: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The fewest frames a clip decoded at `bucket` has: one more than the bucket below it
    (`bucket_for` picks the smallest bucket that holds a clip)."""
    i = bisect_left(buckets, bucket)
    return buckets[i - 1] + 1 if i > 0 else 1


class LengthMask:
    """Forward pre-hooks that zero every convolution's input of `decoder` past the clip's end
    while a masked decode runs on this thread (`active`); a no-op otherwise. A convolution
    whose input is k times the bucket's frames keeps its first k x length positions.

    Only the positions that can lie past a clip's end are touched: a clip decoded at a
    bucket has more frames than the bucket below it (`lowest`), so the input is zeroed in
    place from k x `lowest` on where the clip has ended (at most an eighth of it from 48
    frames on), instead of multiplied whole by a mask into a new tensor. In place is safe:
    values past the clip's end matter only through a convolution's window, and every
    convolution's input is cut here. (`in_place` False multiplies the whole input by the mask
    into a new tensor, as a non-contiguous input always is: the same bits.) Each distinct
    input length's mask is made once per decode (33 convolutions, 6 lengths)."""

    def __init__(self, decoder: nn.Module, in_place: bool = True):
        # per thread: the clip being decoded, and position indices made on that thread's stream
        self._local = threading.local()
        self.in_place = in_place
        self.handles = [m.register_forward_pre_hook(self._hook) for m in decoder.modules()
                        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]

    def active(self, bucket: int, length: torch.Tensor, lowest: int = 1):
        """Mask this thread's decodes at `bucket` frames to `length` (a device tensor, at
        least `lowest`) while the context lasts."""
        return _Active(self._local, bucket, lowest, length)

    def _hook(self, module, args):
        state = getattr(self._local, "state", None)
        if state is None:
            return None
        bucket, lowest, length, masks = state
        x = args[0]
        n = x.shape[-1]
        per_frame = n // bucket
        in_place = self.in_place and x.is_contiguous()
        start = min(lowest * per_frame, n) if in_place else 0
        keep = masks.get((n, start, x.device))
        if keep is None:
            cache = self._local.__dict__.setdefault("positions", {})
            positions = cache.get((n, start, x.device))
            if positions is None:  # the first (eager) decode of a bucket, never inside a capture
                positions = cache[(n, start, x.device)] = torch.arange(start, n, device=x.device)
            keep = masks[(n, start, x.device)] = positions < length * per_frame
        if not in_place:
            return (x * keep,) + tuple(args[1:])
        x[..., start:].mul_(keep)  # x * True is x bit for bit: the product's values, where they can change
        return None


@dataclass
class _Active:
    local: threading.local
    bucket: int
    lowest: int
    length: torch.Tensor

    def __enter__(self):
        self.local.state = (self.bucket, self.lowest, self.length, {})  # this decode's masks, by input length

    def __exit__(self, *exc):
        self.local.state = None


@dataclass
class _Captured:
    codes: torch.Tensor  # static input (1, C, bucket), outside the pool
    length: torch.Tensor  # static: the clip's frames
    audio: torch.Tensor  # output (1, channels, bucket x samples per frame), inside the pool
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
    """`decode(codes)` for (1, C, T) codes on the device: `decode_fn(codes)` at T eagerly, or
    the graph of T's bucket replayed (the returned tensor is valid until this thread's next
    decode). `decoder` is the module whose convolutions are masked."""

    def __init__(self, decode_fn: Callable[[torch.Tensor], torch.Tensor], decoder: nn.Module,
                 buckets: tuple[int, ...] = BUCKETS):
        self.decode_fn = decode_fn
        self.mask = LengthMask(decoder)
        self.buckets = buckets
        self.stats = DecodeGraphStats()
        self._local = threading.local()
        self._lock = threading.Lock()  # stats only

    def mine(self) -> _ThreadGraphs:
        """The calling thread's graphs (made on first use)."""
        mine = getattr(self._local, "graphs", None)
        if mine is None:
            mine = self._local.graphs = _ThreadGraphs()
        return mine

    def replay(self, graphs: _ThreadGraphs, codes: torch.Tensor) -> torch.Tensor | None:
        """Replay `graphs`' graph for the bucket of `codes` on the current stream, from any
        thread, as `decode` would on the thread that owns them; None if it has none. The
        caller keeps the owner from replaying them meanwhile (the finisher's idle lanes)."""
        bucket = bucket_for(codes.shape[-1], self.buckets)
        captured = graphs.graphs.get(bucket) if bucket is not None else None
        return None if captured is None else self._replay(captured, codes, bucket)

    def _replay(self, captured: _Captured, codes: torch.Tensor, bucket: int) -> torch.Tensor:
        frames = codes.shape[-1]
        captured.codes[..., :frames].copy_(codes)
        captured.length.fill_(frames)
        captured.graph.replay()
        self._count("replays")
        return _clip(captured.audio, frames, bucket)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        frames = codes.shape[-1]
        bucket = bucket_for(frames, self.buckets)
        stream = torch.cuda.current_stream(codes.device)
        if stream == torch.cuda.default_stream(codes.device) or bucket is None:
            self._count("eager")
            return self.decode_fn(codes)  # no capture on the legacy default stream
        mine = self.mine()
        captured = mine.graphs.get(bucket)
        if captured is None:
            if bucket in mine.seen and bucket not in mine.failed:
                captured = self._capture(mine, codes, bucket)
            mine.seen.add(bucket)  # the first run builds cuDNN's plans: capture on the next
            if captured is None:
                self._count("eager")
                return self._masked(codes, bucket)
        return self._replay(captured, codes, bucket)

    def _masked(self, codes: torch.Tensor, bucket: int) -> torch.Tensor:
        """`decode_fn` at the bucket's length, every convolution's input cut at the clip's end."""
        frames = codes.shape[-1]
        padded = _zeros_at(codes, bucket)
        padded[..., :frames] = codes
        length = torch.full((), frames, dtype=torch.long, device=codes.device)
        with self.mask.active(bucket, length, lowest_frames(bucket, self.buckets)):
            audio = self.decode_fn(padded)
        return _clip(audio, frames, bucket)

    def _capture(self, mine: _ThreadGraphs, codes: torch.Tensor, bucket: int) -> _Captured | None:
        static = _zeros_at(codes, bucket)
        length = torch.full((), bucket, dtype=torch.long, device=codes.device)
        graph = torch.cuda.CUDAGraph()
        try:
            # capture_begin/end, not torch.cuda.graph(): that synchronizes the whole device and
            # empties the allocator's cache first, which would stall the step loop
            with gc_paused(), self.mask.active(bucket, length, lowest_frames(bucket, self.buckets)):
                graph.capture_begin(pool=mine.pool, capture_error_mode="thread_local")
                try:
                    audio = self.decode_fn(static)
                finally:
                    graph.capture_end()
        except Exception as exc:  # noqa: BLE001 - this bucket stays eager
            mine.failed.add(bucket)
            self._count("failures")
            log.warning("decode of %d frames could not be captured as a CUDA graph (%s); decoding it eagerly",
                        bucket, exc)
            return None
        captured = _Captured(static, length, audio, graph)
        mine.graphs[bucket] = captured
        self._count("captures")
        return captured

    def warm(self, num_codebooks: int, device: torch.device, buckets: tuple[int, ...] | None = None) -> int:
        """On the calling thread (on its own stream): decode at each bucket twice, so its plans
        are built and its graph captured; returns how many buckets replay here now."""
        mine = self.mine()
        with torch.inference_mode():  # as `Codec.decode` runs
            for bucket in buckets or self.buckets:
                codes = torch.zeros((1, num_codebooks, bucket), dtype=torch.long, device=device)
                for _ in range(2):
                    if bucket in mine.graphs or bucket in mine.failed:
                        break
                    self.decode(codes)
        torch.cuda.current_stream(device).synchronize()
        return len(mine.graphs)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)


def _zeros_at(codes: torch.Tensor, bucket: int) -> torch.Tensor:
    """Zero codes shaped like `codes` but `bucket` frames long."""
    return torch.zeros(codes.shape[:-1] + (bucket,), dtype=codes.dtype, device=codes.device)


def _clip(audio: torch.Tensor, frames: int, bucket: int) -> torch.Tensor:
    """The samples of a clip's first `frames` frames, of audio decoded at `bucket` frames."""
    return audio[..., : frames * (audio.shape[-1] // bucket)]
