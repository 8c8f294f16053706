"""The engine: one thread per device that owns all torch state and runs diffusion steps.

Commands (`commands.py`) come in between steps; each step is schedule -> run -> advance, and is
settled one step later (flags, progress, finished chunks to the finisher).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from server.checkpoint import is_random_checkpoint, load_omnivoice
from server.config import EngineSettings
from server.engine.model.backbones import Backbone
from server.engine.model.codec import Codec
from server.engine.model.runner import StepRunner
from server.engine.model.voice_encoder import VoiceEncoder
from server.engine.planning.char_weights import speed_up_estimates
from server.engine.planning.prefix_tokens import prefix_tokenizer
from server.engine.planning.request import prepare_request
from server.engine.planning.utterances import build_utterance, packed_len_bound, packed_len_of
from server.engine.reference import ReferenceModel
from server.engine.runtime.commands import Cancel, ChunkDecoded, FinishFailed, Submit, Wake, WholeReady
from server.engine.runtime.finisher import Finisher
from server.engine.runtime.later_chunks import LaterChunks
from server.engine.runtime.observer import EngineObserver, Outcome, QuietObserver
from server.engine.runtime.request_book import RequestBook
from server.engine.scheduling.output import LaunchedStep, StepRecord
from server.engine.scheduling.scheduler import Scheduler, StepLog
from server.engine.types import (
    SHUTTING_DOWN,
    Accepted,
    ChunkTokens,
    EngineStats,
    EventSink,
    Progress,
    RequestRejected,
    SynthesisRequest,
    VoicePrompt,
)
from server.engine.work import RequestState, Utterance

log = logging.getLogger("chorus.engine")

HANDOFF_POLL_S = 0.0002  # while waiting for a step, how often to look for a decoded chunk
HOLD_WAIT_S = 0.002  # with every chunk waiting out a decode, how long to wait for it at most


class EngineLoop:
    """One device's engine: `backbone` is the packed forward its steps run (None: `backbone_for`
    the model and settings); `observer` hears of each request, step, decode and post-processing."""

    def __init__(self, model: ReferenceModel, settings: EngineSettings, name: str = "engine0", *,
                 model_name: str = "omnivoice", random_checkpoint: bool = False, backbone: Backbone | None = None,
                 observer: EngineObserver | None = None):
        self.model = model
        speed_up_estimates(model)  # on this instance from here on (`ReferenceModel`): bit-identical, faster
        prefix_tokenizer(model.text_tokenizer)  # checked here, not on a first request's path
        self.settings = settings
        self.name = name
        self.model_name = model_name
        self.is_random_checkpoint = random_checkpoint
        self.device = model.audio_heads.weight.device
        self.observer: EngineObserver = observer if observer is not None else QuietObserver()
        self.runner = StepRunner.for_model(model, settings.attention, settings.max_packed_tokens, settings.quantize,
                                           settings.graph_max_tokens, backbone=backbone, observer=observer)
        self.frame_rate: int = model.audio_tokenizer.config.frame_rate
        self.scheduler: Scheduler[Utterance] = Scheduler(settings.max_batch_size, settings.max_packed_tokens,
            settings.scheduling, self.frame_rate, urgent_step_tokens=settings.urgent_step_tokens,
            admission=settings.realtime_admission, promise_s=settings.realtime_promise_ms / 1000)
        self.codec = Codec(model)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.voice_encoder = VoiceEncoder(self.codec, self.device)
        self.finisher = Finisher(self.codec, self.device, self._commands.put, observer=self.observer)
        self.finisher.warm_decodes(model.config.num_audio_codebook)  # CUDA: every length's decode graph
        self.sample_rate: int = model.sampling_rate
        self.book = RequestBook(self.sample_rate)
        self.step_log = StepLog()
        self._steps = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._inflight: deque[LaunchedStep] = deque()  # launched, not yet settled
        self._later = LaterChunks()  # chained requests' later chunks, built once chunk 0's audio is out
        self._last_launch = 0.0  # perf_counter of the last step's launch
        self._accepting, self.ready = True, False  # taking work; stepping (set by start)

    @classmethod
    def load(cls, model_path: str, settings: EngineSettings, name: str = "engine0") -> EngineLoop:
        """Load a checkpoint through the reference's `from_pretrained` and wrap it."""
        model = load_omnivoice(model_path, settings.device, settings.dtype)
        random_ckpt = is_random_checkpoint(model_path)
        model_name = "omnivoice-random-demo" if random_ckpt else model_path.rstrip("/").split("/")[-1]
        return cls(model, settings, name, model_name=model_name, random_checkpoint=random_ckpt)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"chorus-{self.name}", daemon=True)
        self._thread.start()
        self.ready = True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop stepping; every request still in flight ends with `cancelled`."""
        self.ready = False
        self._stopping.set()
        self._commands.put(Wake())
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self, timeout: float) -> bool:
        """Take no new work; wait up to `timeout` s for in-flight work to end (True if it did)."""
        self._accepting = False
        return self.book.wait_until_empty(timeout)

    def submit(self, request: SynthesisRequest, sink: EventSink,
               admit: Callable[[float], None] | None = None) -> Accepted:
        """Validate and plan on the caller's thread, then queue for the engine thread.

        `admit(seconds)`, when given, is called with the planned audio right before the
        request is queued; it refuses by raising `RequestRejected` (the pool's audio budget).
        """
        if self._stopping.is_set() or not self._accepting:
            raise RequestRejected(SHUTTING_DOWN, code="busy")
        request, plan, seed = prepare_request(self.model, request, self.frame_rate, self.settings.max_audio_seconds)
        with self.book.lock:
            self._refuse_if_closed_or_live(request.request_id)
            seq = self.book.next_seq()
        state = RequestState(request=request, plan=plan, sink=sink, seq=seq, seed=seed)
        first_len = self.scheduler.refuse_if_too_big(0, packed_len_of(self.model, state, 0))
        for index in range(1, state.num_chunks):  # one that fits by an upper bound is tokenised when built,
            if not self.scheduler.fits_alone(packed_len_bound(state, index)):  # off the first sound's path
                self.scheduler.refuse_if_too_big(index, packed_len_of(self.model, state, index))
        self.scheduler.admit_realtime(request, first_len, time.perf_counter())  # or busy
        with self.book.lock:
            self._refuse_if_closed_or_live(request.request_id)
            if admit is not None:
                admit(sum(c.target_len for c in plan.chunks) / self.frame_rate)
            self.book.live_ids.add(request.request_id)
            self._commands.put(Submit(state))  # under the lock: the thread drains once more as it exits
        return Accepted(request.request_id, state.num_chunks,
                        [round(c.target_len / self.frame_rate, 3) for c in plan.chunks])

    def _refuse_if_closed_or_live(self, request_id: str) -> None:
        self.book.refuse_if_closed_or_live(request_id, accepting=self._accepting and not self._stopping.is_set())

    def cancel(self, request_id: str) -> None:
        self._commands.put(Cancel(request_id))

    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future:
        """Encode a reference clip on the voice encoder's threads (never the step's)."""
        with self.book.lock:  # refused once the engine thread has exited, as submits are
            if not self.book.closed:
                return self.voice_encoder.submit(audio, sample_rate, text)
        future: Future = Future()
        future.set_exception(RequestRejected(SHUTTING_DOWN, code="busy"))
        return future

    def stats(self) -> EngineStats:
        last, s = self.step_log[-1] if self.step_log else None, self.scheduler
        return EngineStats(self.name, len(s.waiting), len(s.running), len(self.book.live_ids), self._steps,
                           last.packed_tokens if last else 0, last.seconds if last else 0.0,
                           s.hold_budget.held_seconds_total, s.hold_budget.holds_refused_total, s.headroom.free())

    # ---- engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # events, graphs and kernels of this thread
        while not self._stopping.is_set():
            if len(self.scheduler) == 0:
                self._settle_all()  # may queue later chunks of a request
            self._build_due()
            idle = len(self.scheduler) == 0 and not self._inflight
            self._drain_commands(block=idle, timeout=self._later.wait_s(time.perf_counter()) if idle else 0.25)
            if self._stopping.is_set():
                break
            if len(self.scheduler):
                self._step()
        self._settle_all()
        with self.book.lock:
            self.book.closed = True
        self._drain_commands(block=False)
        for state in list(self.book.states.values()):
            self._finish(state, "cancelled", SHUTTING_DOWN)
        self.finisher.shutdown()
        self.voice_encoder.shutdown()

    def _drain_commands(self, block: bool, timeout: float = 0.25) -> None:
        while True:
            try:
                command = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            self._handle(command)

    def _handle(self, command) -> None:
        if isinstance(command, Submit):
            self._admit(command.state)
        elif isinstance(command, Cancel):
            state = self.book.states.get(command.request_id)
            if state is not None:
                self._finish(state, "cancelled")
        elif isinstance(command, ChunkDecoded):
            self.scheduler.decoded(command.state.request_id, command.index)
            self._chunk_decoded(command)
            self._later.audio_out(command.state.request_id, time.perf_counter())
        elif isinstance(command, WholeReady):
            if not command.state.finished:
                self.book.send_audio(command.state, 0, command.audio, final=True)
                self._finish(command.state, "done")
        elif isinstance(command, FinishFailed):
            self._finish(command.state, "error", f"decoding failed: {command.error}")

    def _wait_for(self, event: torch.cuda.Event) -> None:
        """Wait for a step's event, taking commands meanwhile: a decoded chunk's audio goes out
        when it lands, not after the step in flight."""
        while not event.query():
            try:
                self._handle(self._commands.get(timeout=HANDOFF_POLL_S))
            except queue.Empty:
                pass

    def _admit(self, state: RequestState) -> None:
        self.observer.admit_begin(state)
        self.book.states[state.request_id] = state
        self._build(state, range(1 if state.plan.chained else state.num_chunks), state.request.voice)
        self.observer.admit_end(state)

    def _build(self, state: RequestState, chunks: range, ref: VoicePrompt | None) -> bool:
        """Build these chunks' canvases and queue them; a failure ends this request alone."""
        try:
            for index in chunks:
                self.scheduler.add(build_utterance(self.model, state, index, ref, self.device))
            return True
        except Exception as exc:  # isolated to this request
            log.exception("request %s: building a canvas failed", state.request_id)
            self._finish(state, "error", f"building the canvas failed: {exc}")
            return False

    def _step(self) -> None:
        """Schedule, run and advance one step, then settle the previous one: host bookkeeping
        advances at launch, what needs the device's results waits a step."""
        batch = self.scheduler.schedule()
        if not batch.utts:
            self._settle_all()
            if len(self.scheduler):  # all of it waits out a due chunk's decode: until it lands
                self._drain_commands(block=True, timeout=HOLD_WAIT_S)
            return
        now = time.perf_counter()
        for utt in batch.utts:
            if utt.state.started_at is None:
                utt.state.started_at = now
        self._steps += 1
        self.observer.step_begin(self._steps, batch)
        launched = self.runner.run(batch, self._steps)
        self.observer.step_end(launched)
        # back to back: the previous step was still in flight (none is after the engine idled)
        launched.interval, self._last_launch = (now - self._last_launch if self._inflight else None), now
        self.scheduler.advance(launched.stepped)
        for failure in launched.failed:
            self._finish(failure.utt.state, "error", f"the engine failed on this request: {failure.error}")
        self._inflight.append(launched)
        self._settle_all(keep=1)

    def _settle_all(self, keep: int = 0) -> None:  # oldest first, until `keep` are left in flight
        while len(self._inflight) > keep:
            self._settle(self._inflight.popleft())

    def _settle(self, launched: LaunchedStep) -> None:
        """The step's results are needed now: read its flags, report, finish chunks."""
        for part in launched.parts:
            if part.ready is not None:
                self._wait_for(part.ready)  # this step only; the next one stays queued
            finite = part.finite.tolist()
            for utt, ok, number in zip(part.utts, finite, part.step_numbers):
                state = utt.state
                if state.finished:
                    continue
                if not ok:
                    self._finish(state, "error", "non-finite scores for this request (logits, or knobs "
                                                 "beyond float32)")
                    continue
                state.steps_done += 1
                if state.request.progress:
                    self.book.emit(state, Progress(state.request_id, utt.chunk_index, number, utt.num_step,
                                               round(state.steps_done / state.total_steps, 4)))
                if number == utt.num_step:
                    self._complete_chunk(utt)
        seconds = launched.timer.seconds()
        self.scheduler.observe_step(seconds, launched.packed_tokens)
        record = StepRecord(launched.index, launched.items, launched.packed_tokens, seconds, launched.admitted,
                            launched.interval)
        self.step_log.append(record)
        self.observer.step_settled(record)

    def _complete_chunk(self, utt: Utterance) -> None:
        """A chunk's last step has run: hand it to the finisher, then queue later chunks on it
        (deferred while the scheduler holds work for this chunk's audio: `LaterChunks`)."""
        self.observer.chunk_complete(utt)
        state = utt.state
        index = utt.chunk_index
        tokens = utt.item.tokens
        ready = torch.cuda.Event() if self.device.type == "cuda" else None
        if ready is not None:
            ready.record()
        held = self.scheduler.await_decode(utt, time.perf_counter())
        postprocess = None if state.request.stream == "whole" else state.request.options.postprocess
        self.finisher.decode(state, index, tokens, ready, state.ref_rms, postprocess)
        if state.plan.chained and index == 0:
            chunk0 = VoicePrompt(tokens=tokens, text=state.plan.chunks[0].text, rms=0.0)
            if held:
                self._later.defer(state, chunk0)
            else:
                self._build(state, range(1, state.num_chunks), chunk0)

    def _build_due(self) -> None:
        for state, chunk0 in self._later.due(time.perf_counter()):
            self._build(state, range(1, state.num_chunks), chunk0)

    def _chunk_decoded(self, done: ChunkDecoded) -> None:
        state = done.state
        if state.finished:
            return
        text = state.plan.chunks[done.index].text
        self.book.emit(state, ChunkTokens(state.request_id, done.index, done.tokens, text))
        state.raw_audio[done.index] = None if done.post_processed else done.audio
        if done.post_processed:
            self.book.send_audio(state, done.index, done.audio, final=done.index == state.num_chunks - 1)
            if len(state.raw_audio) == state.num_chunks:
                self._finish(state, "done")
        elif len(state.raw_audio) == state.num_chunks:
            chunks = [state.raw_audio[i] for i in range(state.num_chunks)]
            self.finisher.join(state, chunks, state.ref_rms, state.request.options.postprocess)

    def _finish(self, state: RequestState, outcome: Outcome, message: str | None = None) -> None:
        if state.finished:
            return
        state.finished = True
        self.scheduler.drop_request(state.request_id)
        self._later.drop(state.request_id)
        self.book.end(state, outcome, message)
        self.observer.finished(state, outcome)
