"""Finishing chunks off the step thread: decode on its own CUDA stream, then post-process.

Decoding a finished canvas (7-10 ms on a GPU) would otherwise stall the step loop once per
finished chunk. The decode streams have the highest priority, as a request's first audio
waits for its decode (on an H200 at 70% load this measured no different from an ordinary
stream). A small pool of worker threads decodes and post-processes right there: the
vectorised post-processing (server/engine/postprocess.py) takes about a millisecond of CPU
per 10 s chunk, mostly in numpy with the GIL released, far less than a hop to a worker
process would add to a lone request. Results go back to the engine thread as commands, so
all request bookkeeping stays on the engine thread.
"""

from __future__ import annotations

import logging
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
            with on(stream):
                if ready is not None:
                    stream.wait_event(ready)
                tokens_host = tokens.cpu().numpy()
                raw = self.codec.decode(tokens)
            if postprocess is None:
                self.deliver(ChunkDecoded(state, index, tokens_host, raw, post_processed=False))
            else:
                self._post(post_process, raw, rms, postprocess, self.codec.sample_rate,
                           on_done=lambda audio: ChunkDecoded(state, index, tokens_host, audio, post_processed=True))
        except Exception as exc:  # handed to the engine thread, fails that request
            log.exception("decoding chunk %d failed", index)
            self.deliver(FinishFailed(state, index, exc))

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
