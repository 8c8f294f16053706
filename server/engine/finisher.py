"""Finishing chunks off the step thread: decode on its own CUDA stream, then post-process.

Decoding a finished canvas (7-10 ms on a GPU) and the reference's post-processing (15-20
ms of CPU per chunk) would otherwise stall the step loop once per finished chunk. A small
pool of worker threads decodes; post-processing runs in worker processes when
`processes` > 0, because the reference's (pydub) silence removal holds the GIL that the
step thread needs to launch kernels. Results go back to the engine thread as commands, so
all request bookkeeping stays on the engine thread.
"""

from __future__ import annotations

import logging
import threading
import multiprocessing
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from server.engine.codec import Codec, join_and_post_process, post_process
from server.engine.commands import ChunkDecoded, Command, FinishFailed, WholeReady
from server.engine.request import RequestState

log = logging.getLogger("chorus.engine")


class Finisher:
    def __init__(self, codec: Codec, device: torch.device, deliver: Callable[[Command], None], workers: int = 2,
                 processes: int | None = 0):
        """`processes`: post-processing worker processes; None picks 2 on a GPU, none (threads) on CPU."""
        if processes is None:
            processes = 2 if device.type == "cuda" else 0
        self.codec = codec
        self.device = device
        self.deliver = deliver
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chorus-finish")
        self._local = threading.local()
        # wall time of each post-processing job (ms), measured where it ran, for the bench
        self.post_ms: deque[float] = deque(maxlen=4096)
        self.post_jobs = 0  # post-processing jobs finished, ever
        self._processes: ProcessPoolExecutor | None = None
        if processes > 0:
            # spawn: never fork a process that holds CUDA state
            self._processes = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
            for _ in range(processes):  # import the reference's audio code in each worker now
                self._processes.submit(post_process, np.zeros((1, 2400), np.float32), None, False,
                                       codec.sample_rate)

    def _post(self, fn, *args, on_done: Callable[[np.ndarray], Command], state: RequestState, index: int) -> None:
        """Run `fn(*args)` in a worker process (or here), then deliver `on_done(result)`."""
        if self._processes is None:
            self.deliver(on_done(self._record(_timed(fn, *args))))
            return

        def finished(future: Future) -> None:
            try:
                self.deliver(on_done(self._record(future.result())))
            except Exception as exc:  # noqa: BLE001 - fails that request only
                log.exception("post-processing chunk %d failed", index)
                self.deliver(FinishFailed(state, index, exc))

        self._processes.submit(_timed, fn, *args).add_done_callback(finished)

    def _record(self, timed: tuple[np.ndarray, float]) -> np.ndarray:
        audio, ms = timed
        self.post_ms.append(ms)
        self.post_jobs += 1
        return audio

    def _stream(self):
        if self.device.type != "cuda":
            return None
        if getattr(self._local, "stream", None) is None:
            torch.cuda.set_device(self.device)  # this worker thread's current GPU
            self._local.stream = torch.cuda.Stream(self.device)
        return self._local.stream

    def decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
               rms: float | None, postprocess: bool | None) -> None:
        """Decode `tokens` once `ready` (an event on the engine's stream) has passed.

        `postprocess` None means keep the raw audio (to be joined with the other chunks).
        """
        self._pool.submit(self._decode, state, index, tokens, ready, rms, postprocess)

    def _decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
                rms: float | None, postprocess: bool | None) -> None:
        try:
            stream = self._stream()
            with torch.cuda.stream(stream) if stream is not None else _nullcontext():
                if ready is not None:
                    stream.wait_event(ready)
                tokens_host = tokens.cpu().numpy()
                raw = self.codec.decode(tokens)
            if postprocess is None:
                self.deliver(ChunkDecoded(state, index, tokens_host, raw, post_processed=False))
            else:
                self._post(post_process, raw, rms, postprocess, self.codec.sample_rate, state=state, index=index,
                           on_done=lambda audio: ChunkDecoded(state, index, tokens_host, audio, post_processed=True))
        except Exception as exc:  # noqa: BLE001 - handed to the engine thread, fails that request
            log.exception("decoding chunk %d failed", index)
            self.deliver(FinishFailed(state, index, exc))

    def join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        self._pool.submit(self._join, state, chunks, rms, postprocess)

    def _join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        try:
            self._post(join_and_post_process, chunks, rms, postprocess, self.codec.sample_rate, state=state,
                       index=0, on_done=lambda audio: WholeReady(state, audio))
        except Exception as exc:  # noqa: BLE001
            log.exception("post-processing failed")
            self.deliver(FinishFailed(state, 0, exc))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)


def _timed(fn, *args) -> tuple[np.ndarray, float]:
    """`fn(*args)` and its wall time in ms (module level: runs in worker processes too)."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
