"""Finishing chunks off the step thread: decode on its own CUDA stream, then post-process.

Decoding a finished canvas (7-10 ms on a GPU) would otherwise stall the step loop once per
finished chunk. The decode streams have the highest priority, as a request's first audio
waits for its decode (on an H200 at 70% load this measured no different from an ordinary
stream). A small pool of worker threads decodes and post-processes right there: the
vectorised post-processing (server/engine/postprocess.py) takes about a millisecond of CPU
per 10 s chunk, mostly in numpy with the GIL released, far less than a hop to a worker
process would add to a lone request. Results go back to the engine thread as commands, so
all request bookkeeping stays on the engine thread.

A thread that has slept runs its first port cold, up to twice as long as a warm one (the
state the port itself warms: code, branch history, the allocator's blocks; keeping the core
awake does not help). So a thread idle for `COLD_AFTER_S` ports a short built-in clip while
the GPU decodes its chunk, and the chunk's own port then runs warm. Under load the threads
are never idle that long and never do it (`CHORUS_POST_WARMUP=0`: never).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from server.engine.codec import Codec, join_and_post_process, post_process
from server.engine.commands import ChunkDecoded, Command, FinishFailed, WholeReady
from server.engine.request import RequestState
from server.engine.worker_streams import WorkerStreams, decode_priority, on

log = logging.getLogger("chorus.engine")

COLD_AFTER_S = 0.02  # a finisher thread idle this long warms its post-processing up first
_WARM_CLIP_SECONDS = 0.5


def warm_clip(sample_rate: int) -> np.ndarray:
    """Half a second of seeded noise in bursts, (1, N) float32 like a decode: enough for a
    port to take its silence and loudness paths."""
    n = int(_WARM_CLIP_SECONDS * sample_rate)
    bursts = (np.sin(np.linspace(0, 6 * np.pi, n)) > -0.3).astype(np.float32)
    return (0.3 * np.random.default_rng(0).standard_normal(n).astype(np.float32) * bursts)[None, :]


class Finisher:
    def __init__(self, codec: Codec, device: torch.device, deliver: Callable[[Command], None], workers: int = 2):
        self.codec = codec
        self.workers = workers
        self.device = device
        self.deliver = deliver
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chorus-finish")
        self._streams = WorkerStreams(device, decode_priority())  # ahead of the steps' kernels
        # wall time of each post-processing job (ms), measured where it ran, for the bench
        self.post_ms: deque[float] = deque(maxlen=4096)
        self.post_jobs = 0  # post-processing jobs finished, ever
        self.warm_ups = 0  # ports of the warm-up clip done by threads that had gone cold
        warm = hasattr(codec, "sample_rate") and os.environ.get("CHORUS_POST_WARMUP", "") != "0"
        self._warm_clip = warm_clip(codec.sample_rate) if warm else None
        self._idle_since = threading.local()  # per thread: perf_counter when its last job ended

    def _post(self, fn, *args, on_done: Callable[[np.ndarray], Command]) -> None:
        """Run `fn(*args)` on this worker thread, then deliver `on_done(result)`."""
        self.deliver(on_done(self._record(_timed(fn, *args))))

    def _record(self, timed: tuple[np.ndarray, float]) -> np.ndarray:
        audio, ms = timed
        self.post_ms.append(ms)
        self.post_jobs += 1
        return audio

    def warm_decodes(self, num_codebooks: int, buckets: tuple[int, ...] | None = None) -> list[int]:
        """Capture the decode graph of every length bucket on every worker thread (each thread
        replays only its own), so no request's first audio waits for cuDNN's planning or a
        capture; blocks until done and returns each thread's graph count (none off CUDA)."""
        graphs = self.codec.graphs
        if graphs is None:
            return []
        t0 = time.perf_counter()
        barrier = threading.Barrier(self.workers)  # one job per thread: each waits for the others

        def warm() -> int:
            barrier.wait(timeout=60)
            with on(self._streams.current()):
                return graphs.warm(num_codebooks, self.device, buckets)

        try:
            counts = [future.result() for future in [self._pool.submit(warm) for _ in range(self.workers)]]
        except Exception:  # buckets are then captured as traffic brings them
            log.warning("capturing decode graphs at start failed; they are captured as lengths come",
                        exc_info=True)
            return []
        log.info("decode graphs captured on %d worker threads in %.1f s (%s graphs)", self.workers,
                 time.perf_counter() - t0, counts)
        return counts

    def decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
               rms: float | None, postprocess: bool | None) -> None:
        """Decode `tokens` once `ready` (an event on the engine's stream) has passed.

        `postprocess` None means keep the raw audio (to be joined with the other chunks).
        """
        self._pool.submit(self._decode, state, index, tokens, ready, rms, postprocess)

    def _decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
                rms: float | None, postprocess: bool | None) -> None:
        try:
            stream = self._streams.current()
            warm = None if postprocess is None else lambda: self._warm_up_if_cold(rms, postprocess)
            with on(stream):
                if ready is not None:
                    stream.wait_event(ready)
                tokens_host = tokens.cpu().numpy()
                raw = self.codec.decode(tokens, while_decoding=warm)
            if postprocess is None:
                self.deliver(ChunkDecoded(state, index, tokens_host, raw, post_processed=False))
            else:
                self._post(post_process, raw, rms, postprocess, self.codec.sample_rate,
                           on_done=lambda audio: ChunkDecoded(state, index, tokens_host, audio, post_processed=True))
        except Exception as exc:  # handed to the engine thread, fails that request
            log.exception("decoding chunk %d failed", index)
            self.deliver(FinishFailed(state, index, exc))
        finally:
            self._idle_since.t = time.perf_counter()

    def _warm_up_if_cold(self, rms: float | None, postprocess: bool) -> None:
        """Port the warm-up clip (result dropped) if this thread has been idle long enough to
        run its next port cold; never fails the chunk it runs beside."""
        idle_since = getattr(self._idle_since, "t", None)
        if self._warm_clip is None or (idle_since is not None and time.perf_counter() - idle_since < COLD_AFTER_S):
            return
        try:
            post_process(self._warm_clip, rms, postprocess, self.codec.sample_rate)
            self.warm_ups += 1
        except Exception:  # a warm-up is only ever a guess
            log.debug("post-processing warm-up failed", exc_info=True)

    def join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        self._pool.submit(self._join, state, chunks, rms, postprocess)

    def _join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        try:
            self._post(join_and_post_process, chunks, rms, postprocess, self.codec.sample_rate,
                       on_done=lambda audio: WholeReady(state, audio))
        except Exception as exc:
            log.exception("post-processing failed")
            self.deliver(FinishFailed(state, 0, exc))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _timed(fn, *args) -> tuple[np.ndarray, float]:
    """`fn(*args)` and its wall time in ms."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3
