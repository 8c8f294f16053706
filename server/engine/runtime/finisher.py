"""Finishing chunks off the step thread: decode on a lane's CUDA stream, then post-process.

Each lane is a stream, its decode graphs and one thread. An idle lane's decode is launched by
the engine thread itself (the lane's thread only waits and post-processes); a busy lane's by its
thread (`CHORUS_DECODE_LAUNCH=0`: always). A thread that went cold ports a short clip while the
GPU decodes. Results return to the engine thread as commands (docs/architecture.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from server import envs
from server.engine.model.codec import Codec, join_and_post_process, post_process
from server.engine.model.worker_streams import WorkerStreams, decode_priority, on
from server.engine.runtime.commands import ChunkDecoded, Command, FinishFailed, WholeReady
from server.engine.runtime.observer import EngineObserver, QuietObserver
from server.engine.work import RequestState

log = logging.getLogger("chorus.engine")

COLD_AFTER_S = 0.02  # a finisher thread idle this long warms its post-processing up first
_WARM_CLIP_SECONDS = 0.5


def warm_clip(sample_rate: int) -> np.ndarray:
    """Half a second of seeded noise in bursts, (1, N) float32 like a decode: enough for a
    port to take its silence and loudness paths."""
    n = int(_WARM_CLIP_SECONDS * sample_rate)
    bursts = (np.sin(np.linspace(0, 6 * np.pi, n)) > -0.3).astype(np.float32)
    return (0.3 * np.random.default_rng(0).standard_normal(n).astype(np.float32) * bursts)[None, :]


@dataclass
class _Lane:
    """A decode stream with its own graphs, and the one thread that finishes its chunks."""

    index: int
    executor: ThreadPoolExecutor
    stream: torch.cuda.Stream | None = None  # set by its thread when it warms its graphs
    graphs: object | None = None  # that thread's decode graphs, replayable from the engine thread
    pending: int = 0  # jobs given to it and not yet finished


@dataclass
class _Launched:
    """A decode the engine thread launched on a lane; its host copies are there once `done` passes."""

    audio: torch.Tensor  # (channels, N) float32, pinned
    tokens: torch.Tensor  # (C, T), pinned
    done: torch.cuda.Event
    read: torch.Tensor  # the device tokens, kept from the allocator until the lane's stream has read them


class Finisher:
    def __init__(self, codec: Codec, device: torch.device, deliver: Callable[[Command], None], workers: int = 2,
                 observer: EngineObserver | None = None):
        self.codec = codec
        self.workers = workers
        self.device = device
        self.deliver = deliver
        # told when each decode and post-processing starts and ends
        self.observer: EngineObserver = observer if observer is not None else QuietObserver()
        self._lanes = [_Lane(i, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"chorus-finish{i}"))
                       for i in range(workers)]
        self._lanes_lock = threading.Lock()
        self._streams = WorkerStreams(device, decode_priority())  # ahead of the steps' kernels
        self._launch_here = envs.CHORUS_DECODE_LAUNCH
        self.decode_jobs = 0  # decodes finished, ever
        self.post_jobs = 0  # post-processing jobs finished, ever
        self.launched_decodes = 0  # decodes the engine thread launched on an idle lane
        self.warm_ups = 0  # ports of the warm-up clip done by threads that had gone cold
        self._warm_clip = warm_clip(codec.sample_rate)
        self._idle_since = threading.local()  # per thread: perf_counter when its last job ended

    def _post(self, state: RequestState, chunk: int | None, fn, *args,
              on_done: Callable[[np.ndarray], Command]) -> None:
        """Run `fn(*args)` (post-processing `chunk`, or the whole request's joined chunks: None)
        on this worker thread, then deliver `on_done(result)`."""
        self.observer.post_begin(state, chunk)
        audio = fn(*args)
        self.post_jobs += 1
        self.observer.post_end(state, chunk)
        self.deliver(on_done(audio))

    def warm_decodes(self, num_codebooks: int, buckets: tuple[int, ...] | None = None) -> list[int]:
        """Capture the decode graph of every length bucket on every lane (each has its own
        graphs and stream), so no request's first audio waits for cuDNN's planning or a
        capture; blocks until done and returns each lane's graph count (none off CUDA)."""
        graphs = self.codec.graphs
        if graphs is None:
            return []
        t0 = time.perf_counter()

        def warm(lane: _Lane) -> int:
            stream = self._streams.current()
            with on(stream):
                count = graphs.warm(num_codebooks, self.device, buckets)
            lane.stream, lane.graphs = stream, graphs.mine()
            return count

        try:
            counts = [future.result() for future in [lane.executor.submit(warm, lane) for lane in self._lanes]]
        except Exception:  # buckets are then captured as traffic brings them
            log.warning("capturing decode graphs at start failed; they are captured as lengths come",
                        exc_info=True)
            for lane in self._lanes:
                lane.stream = lane.graphs = None
            return []
        log.info("decode graphs captured on %d lanes in %.1f s (%s graphs)", self.workers,
                 time.perf_counter() - t0, counts)
        return counts

    # ---- lanes ------------------------------------------------------------------------

    def _take_lane(self) -> tuple[_Lane, bool]:
        """The lane with the fewest jobs, now with one more; True if it had none."""
        with self._lanes_lock:
            lane = min(self._lanes, key=lambda lane: lane.pending)
            lane.pending += 1
            return lane, lane.pending == 1

    def _release(self, lane: _Lane) -> None:
        with self._lanes_lock:
            lane.pending -= 1

    def _submit(self, fn, *args) -> None:
        """`fn(*args)` on the least busy lane's thread (post-processing of joined chunks)."""
        lane, _ = self._take_lane()
        lane.executor.submit(self._on_lane, lane, fn, *args)

    def _on_lane(self, lane: _Lane, fn, *args) -> None:
        try:
            fn(*args)
        finally:
            self._release(lane)

    # ---- decode -------------------------------------------------------------------------

    def decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
               rms: float | None, postprocess: bool | None) -> None:
        """Decode `tokens` once `ready` (an event on the engine's stream) has passed.

        Called on the engine thread; launches the decode right here on an idle lane.
        `postprocess` None means keep the raw audio (to be joined with the other chunks).
        """
        lane, idle = self._take_lane()
        try:
            launched = self._launch(state, index, lane, tokens, ready) if idle and self._launch_here else None
        except Exception as exc:  # fails that request alone
            log.exception("launching the decode of chunk %d failed", index)
            self._release(lane)
            self.deliver(FinishFailed(state, index, exc))
            return
        if launched is not None:
            lane.executor.submit(self._on_lane, lane, self._finish_launched, state, index, launched, rms, postprocess)
        else:
            lane.executor.submit(self._on_lane, lane, self._decode, state, index, tokens, ready, rms, postprocess)

    def _launch(self, state: RequestState, index: int, lane: _Lane, tokens: torch.Tensor,
                ready: torch.cuda.Event | None) -> _Launched | None:
        """On the engine thread: replay the lane's graph for these tokens on its stream and
        queue the copies out behind it. None where the lane has no graph for that length
        (or none at all): its thread then decodes as it always did."""
        if lane.graphs is None or lane.stream is None:
            return None
        with on(lane.stream), torch.inference_mode():
            if ready is not None:
                lane.stream.wait_event(ready)
            self.observer.decode_begin(state, index)
            audio = self.codec.replay(lane.graphs, tokens)
            if audio is None:
                return None
            host_audio = _pinned_copy(audio.float())
            host_tokens = _pinned_copy(tokens)
            done = torch.cuda.Event()
            done.record(lane.stream)
        self.launched_decodes += 1
        return _Launched(host_audio, host_tokens, done, tokens)

    def _finish_launched(self, state: RequestState, index: int, launched: _Launched, rms: float | None,
                         postprocess: bool | None) -> None:
        """On the lane's thread: warm up if cold while the GPU decodes, then post-process."""
        try:
            if postprocess is not None:
                self._warm_up_if_cold(rms, postprocess)
            launched.done.synchronize()  # the host copies have landed
            self.decode_jobs += 1
            self.observer.decode_end(state, index)
            # what consumers keep is not left in pinned memory (the port writes a new array)
            raw = launched.audio.numpy()
            self._hand_on(state, index, launched.tokens.numpy().copy(), raw.copy() if postprocess is None else raw,
                          rms, postprocess)
        except Exception as exc:  # handed to the engine thread, fails that request
            log.exception("decoding chunk %d failed", index)
            self.deliver(FinishFailed(state, index, exc))
        finally:
            self._idle_since.t = time.perf_counter()

    def _decode(self, state: RequestState, index: int, tokens: torch.Tensor, ready: torch.cuda.Event | None,
                rms: float | None, postprocess: bool | None) -> None:
        try:
            stream = self._streams.current()
            warm = None if postprocess is None else lambda: self._warm_up_if_cold(rms, postprocess)
            with on(stream):
                if ready is not None:
                    stream.wait_event(ready)
                self.observer.decode_begin(state, index)
                raw = self.codec.decode(tokens, while_decoding=warm)
                self.decode_jobs += 1
                self.observer.decode_end(state, index)
                tokens_host = tokens.cpu().numpy()
            self._hand_on(state, index, tokens_host, raw, rms, postprocess)
        except Exception as exc:  # handed to the engine thread, fails that request
            log.exception("decoding chunk %d failed", index)
            self.deliver(FinishFailed(state, index, exc))
        finally:
            self._idle_since.t = time.perf_counter()

    def _hand_on(self, state: RequestState, index: int, tokens: np.ndarray, raw: np.ndarray, rms: float | None,
                 postprocess: bool | None) -> None:
        """The decoded chunk to the engine thread: raw (`postprocess` None), or post-processed here first."""
        if postprocess is None:
            self.deliver(ChunkDecoded(state, index, tokens, raw, post_processed=False))
        else:
            self._post(state, index, post_process, raw, rms, postprocess, self.codec.sample_rate,
                       on_done=lambda audio: ChunkDecoded(state, index, tokens, audio, post_processed=True))

    def _warm_up_if_cold(self, rms: float | None, postprocess: bool) -> None:
        """Port the warm-up clip (result dropped) if this thread has been idle long enough to
        run its next port cold; never fails the chunk it runs beside."""
        idle_since = getattr(self._idle_since, "t", None)
        if idle_since is not None and time.perf_counter() - idle_since < COLD_AFTER_S:
            return
        try:
            post_process(self._warm_clip, rms, postprocess, self.codec.sample_rate)
            self.warm_ups += 1
        except Exception:  # a warm-up is only ever a guess
            log.debug("post-processing warm-up failed", exc_info=True)

    def join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        self._submit(self._join, state, chunks, rms, postprocess)

    def _join(self, state: RequestState, chunks: list[np.ndarray], rms: float | None, postprocess: bool) -> None:
        try:
            self._post(state, None, join_and_post_process, chunks, rms, postprocess, self.codec.sample_rate,
                       on_done=lambda audio: WholeReady(state, audio))
        except Exception as exc:
            log.exception("post-processing failed")
            self.deliver(FinishFailed(state, 0, exc))

    def shutdown(self) -> None:
        for lane in self._lanes:
            lane.executor.shutdown(wait=False, cancel_futures=True)


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of a device tensor, queued on the current stream (not yet there)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
