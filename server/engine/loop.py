"""The engine: one thread per device that owns all torch state and runs diffusion steps.

Any thread may `submit`, `cancel` or `encode_voice`; those become commands on a queue that
the engine thread drains between steps. Each step: admit (scheduler) -> pack
(`build_packed_canvas`) -> one forward (backbone) -> unmask (sampler) -> finished chunks
are decoded and post-processed -> events go to each request's sink. Requests join and
leave only at step boundaries.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from server.config import EngineSettings
from server.engine.attention import make_attention_backend
from server.engine.backbone import OmniVoiceBackbone
from server.engine.canvas import build_packed_canvas
from server.engine.codec import Codec
from server.engine.finisher import ChunkDecoded, Finisher, FinishFailed, WholeReady
from server.engine.request import (
    RequestState,
    Utterance,
    build_utterance,
    packed_len_of,
    plan_request,
)
from server.engine.sampler import Sampler
from server.engine.scheduler import Scheduler, StepLog, StepRecord
from server.engine.types import (
    Accepted,
    ChunkAudio,
    ChunkTokens,
    EngineEvent,
    EventSink,
    Finished,
    Progress,
    RequestRejected,
    SynthesisRequest,
    VoicePrompt,
)

log = logging.getLogger("chorus.engine")


@dataclass(frozen=True)
class EngineStats:
    name: str
    waiting_items: int
    running_items: int
    requests_inflight: int
    steps_total: int
    packed_tokens_last_step: int
    step_seconds_last: float
    outstanding_work: int  # packed tokens x steps still to run: the routing load signal


@dataclass(frozen=True)
class _Submit:
    state: RequestState


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True)
class _EncodeVoice:
    audio: np.ndarray
    sample_rate: int
    text: str | None
    future: Future


class _Wake:
    pass


@dataclass
class _Launched:
    """Utterances stepped by one forward, and their (not yet read) finiteness flags."""

    utts: list[Utterance]
    finite: torch.Tensor
    step_numbers: list[int]
    ready: torch.cuda.Event | None = None  # passed once `finite` (and the step) is on the host


class _StepTimer:
    """Wall time of a step's device work: CUDA events on a GPU, the clock elsewhere."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._end.record()
        else:
            self._elapsed = time.perf_counter() - self._t0

    def seconds(self) -> float:
        if self._cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1000.0
        return self._elapsed


@dataclass
class _InFlightStep:
    index: int
    parts: list[_Launched]
    timer: _StepTimer
    items: int
    packed_tokens: int
    admitted: int


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class EngineLoop:
    def __init__(self, model, settings: EngineSettings, name: str = "engine0", *,
                 model_name: str = "omnivoice", random_checkpoint: bool = False):
        self.model = model
        self.settings = settings
        self.name = name
        self.model_name = model_name
        self.is_random_checkpoint = random_checkpoint
        self.device = model.audio_heads.weight.device
        llm_cfg = model.llm.config
        head_dim = getattr(llm_cfg, "head_dim", llm_cfg.hidden_size // llm_cfg.num_attention_heads)
        attention = make_attention_backend(
            settings.attention, self.device, model.audio_heads.weight.dtype, head_dim**-0.5,
            llm_cfg.num_attention_heads, llm_cfg.num_key_value_heads, head_dim,
        )
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):  # kernels checked and graphs captured on this GPU
                self.backbone = self._make_backbone(attention)
        else:
            self.backbone = self._make_backbone(attention)
        log.info("%s: %s attention on %s", name, attention.name, self.device)
        self.sampler = Sampler(model.config.audio_mask_id, model.config.num_audio_codebook, self.device)
        self.scheduler = Scheduler(settings.max_batch_size, settings.max_packed_tokens)
        self.codec = Codec(model)
        processes = settings.postprocess_processes
        if processes is None:
            processes = 2 if self.device.type == "cuda" else 0
        self.finisher = Finisher(self.codec, self.device, lambda done: self._commands.put(done), processes=processes)
        self.frame_rate: int = model.audio_tokenizer.config.frame_rate
        self.sample_rate: int = model.sampling_rate
        self.step_log = StepLog()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._states: dict[str, RequestState] = {}
        self._live_ids: set[str] = set()
        self._lock = threading.Lock()
        self._seq = 0
        self._steps = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._inflight: deque[_InFlightStep] = deque()
        self._accepting = True
        self._closed = False  # the thread has exited: queued commands would never run
        self._oom_cap: int | None = None  # packed tokens per forward after an out-of-memory error
        self._clean_steps = 0
        self.ready = False

    def _make_backbone(self, attention):
        try:
            from server.engine.fused_backbone import make_backbone
        except ImportError:
            return OmniVoiceBackbone(self.model, attention)
        return make_backbone(self.model, attention, quantize=self.settings.quantize)

    @classmethod
    def load(cls, model_path: str, settings: EngineSettings, name: str = "engine0") -> "EngineLoop":
        """Load a checkpoint through the reference's `from_pretrained` and wrap it."""
        from server.checkpoint import is_random_checkpoint, load_omnivoice

        model = load_omnivoice(model_path, settings.device, settings.dtype)
        random_ckpt = is_random_checkpoint(model_path)
        model_name = "omnivoice-random-demo" if random_ckpt else model_path.rstrip("/").split("/")[-1]
        return cls(model, settings, name, model_name=model_name, random_checkpoint=random_ckpt)

    # ---- any thread -----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"chorus-{self.name}", daemon=True)
        self._thread.start()
        self.ready = True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop stepping; every request still in flight ends with `cancelled`."""
        self.ready = False
        self._stopping.set()
        self._commands.put(_Wake())
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self, timeout: float) -> bool:
        """Take no new work; wait up to `timeout` s for what is in flight to finish.

        Returns True when everything finished; then (or after the deadline) `stop()`
        cancels whatever is left.
        """
        self._accepting = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._live_ids:
                    return True
            time.sleep(0.02)
        return False

    def submit(self, request: SynthesisRequest, sink: EventSink) -> Accepted:
        """Validate and plan on the caller's thread, then queue for the engine thread."""
        if self._stopping.is_set() or not self._accepting:
            raise RequestRejected("the server is shutting down; try another replica or later", code="busy")
        plan = plan_request(self.model, request, self.frame_rate)
        seed = request.options.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        with self._lock:
            if request.request_id in self._live_ids:
                raise RequestRejected(f"id: {request.request_id!r} is already in flight", field="id",
                                      code="duplicate_id")
            seq = self._seq
            self._seq += 1
        state = RequestState(request=request, plan=plan, sink=sink, seq=seq, seed=seed & ((1 << 64) - 1))
        for index in range(state.num_chunks):
            need = packed_len_of(self.model, state, index)
            if not self.scheduler.fits_alone(need):
                raise RequestRejected(
                    f"text: chunk {index} needs {need} packed tokens, over this server's budget of "
                    f"{self.scheduler.max_packed_tokens} (shorten the text or lower duration)",
                    field="text",
                )
        with self._lock:
            if self._closed:
                raise RequestRejected("the server is shutting down; try another replica or later", code="busy")
            if request.request_id in self._live_ids:
                raise RequestRejected(f"id: {request.request_id!r} is already in flight", field="id",
                                      code="duplicate_id")
            self._live_ids.add(request.request_id)
            self._commands.put(_Submit(state))  # under the lock: the thread drains once more as it exits
        return Accepted(request.request_id, state.num_chunks,
                        [round(c.target_len / self.frame_rate, 3) for c in plan.chunks])

    def cancel(self, request_id: str) -> None:
        self._commands.put(_Cancel(request_id))

    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future:
        future: Future = Future()
        with self._lock:  # once the thread has exited, nothing would ever run the command
            if self._closed:
                future.set_exception(RequestRejected("the server is shutting down; try again later", code="busy"))
                return future
            self._commands.put(_EncodeVoice(audio, sample_rate, text, future))
        return future

    def stats(self) -> EngineStats:
        last = self.step_log[-1] if self.step_log else None
        running = list(self.scheduler.running)
        waiting = [w.utt for w in self.scheduler.waiting]
        work = sum(u.packed_len * (u.num_step - u.step) for u in running + waiting)
        return EngineStats(
            name=self.name,
            waiting_items=len(waiting),
            running_items=len(running),
            requests_inflight=len(self._live_ids),
            steps_total=self._steps,
            packed_tokens_last_step=last.packed_tokens if last else 0,
            step_seconds_last=last.seconds if last else 0.0,
            outstanding_work=work,
        )

    # ---- engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # events, graphs and kernels of this thread
        while not self._stopping.is_set():
            if len(self.scheduler) == 0:
                self._settle_all()  # may queue later chunks of a request
            self._drain_commands(block=len(self.scheduler) == 0 and not self._inflight)
            if self._stopping.is_set():
                break
            if len(self.scheduler):
                self._step()
        self._settle_all()
        with self._lock:
            self._closed = True
        self._drain_commands(block=False)
        for state in list(self._states.values()):
            self._finish(state, "cancelled", "the server is shutting down")
        self.finisher.shutdown()

    def _drain_commands(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(timeout=0.25) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            if isinstance(command, _Submit):
                self._admit(command.state)
            elif isinstance(command, _Cancel):
                state = self._states.get(command.request_id)
                if state is not None:
                    self._finish(state, "cancelled")
            elif isinstance(command, _EncodeVoice):
                self._encode(command)
            elif isinstance(command, ChunkDecoded):
                self._chunk_decoded(command)
            elif isinstance(command, WholeReady):
                if not command.state.finished:
                    self._send_audio(command.state, 0, command.audio, final=True)
                    self._finish(command.state, "done")
            elif isinstance(command, FinishFailed):
                self._finish(command.state, "error", f"decoding failed: {command.error}")

    def _encode(self, command: _EncodeVoice) -> None:
        if not command.future.set_running_or_notify_cancel():
            return
        try:
            command.future.set_result(self.codec.encode_voice(command.audio, command.sample_rate, command.text))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            command.future.set_exception(exc)

    def _admit(self, state: RequestState) -> None:
        self._states[state.request_id] = state
        first = 1 if state.plan.chained else state.num_chunks
        try:
            for index in range(first):
                self.scheduler.add(build_utterance(self.model, state, index, state.request.voice, self.device))
        except Exception as exc:  # noqa: BLE001 - isolate to this request
            log.exception("request %s: building its canvas failed", state.request_id)
            self._finish(state, "error", f"building the canvas failed: {exc}")

    def _step(self) -> None:
        """Launch one step, then settle the previous one.

        Host bookkeeping (schedule index, who finishes) advances at launch; what needs the
        GPU's results (finiteness, progress events, decoding) waits until that step is
        done. Settling one step behind keeps a step queued on the GPU while Python
        prepares the next, and no call inside a step waits for the device.
        """
        utts, admitted = self.scheduler.schedule()
        if not utts:
            self._settle_all()
            return
        now = time.perf_counter()
        for utt in utts:
            if utt.state.started_at is None:
                utt.state.started_at = now
        timer = _StepTimer(self.device)
        parts: list[_Launched] = []
        for group in self._split_for_memory(utts):
            parts += self._launch(group)
        timer.stop()
        launched = [utt for part in parts for utt in part.utts]
        for utt in launched:
            utt.step += 1
        self.scheduler.retire([u for u in launched if u.finished])
        self._steps += 1
        self._inflight.append(_InFlightStep(self._steps, parts, timer, len(utts),
                                            sum(u.packed_len for u in utts), admitted))
        while len(self._inflight) > 1:
            self._settle(self._inflight.popleft())

    def _settle_all(self) -> None:
        while self._inflight:
            self._settle(self._inflight.popleft())

    def _settle(self, step: "_InFlightStep") -> None:
        """The step's results are needed now: read its flags, report, finish chunks."""
        for part in step.parts:
            if part.ready is not None:
                part.ready.synchronize()  # this step only; the next one stays queued
            finite = part.finite.tolist()
            for utt, ok, number in zip(part.utts, finite, part.step_numbers):
                state = utt.state
                if state.finished:
                    continue
                if not ok:
                    self._finish(state, "error", "the model produced non-finite logits for this request")
                    continue
                state.steps_done += 1
                self._emit(state, Progress(state.request_id, utt.chunk_index, number, utt.num_step,
                                           round(state.steps_done / state.total_steps, 4)))
                if number == utt.num_step:
                    self._complete_chunk(utt)
        self.step_log.append(StepRecord(step.index, step.items, step.packed_tokens, step.timer.seconds(),
                                        step.admitted))

    def _split_for_memory(self, utts: list[Utterance]) -> list[list[Utterance]]:
        """Groups whose packed length fits the memory cap learnt from out-of-memory errors.

        Each utterance still advances exactly one step; a capped step just runs as several
        forwards. The cap relaxes again after a run of clean steps.
        """
        if self._oom_cap is None:
            return [utts]
        self._clean_steps += 1
        if self._clean_steps >= 200:
            self._clean_steps = 0
            self._oom_cap = None if self._oom_cap * 5 // 4 >= self.scheduler.max_packed_tokens else self._oom_cap * 5 // 4
            if self._oom_cap is None:
                return [utts]
        groups: list[list[Utterance]] = [[]]
        size = 0
        for utt in utts:
            if groups[-1] and size + utt.packed_len > self._oom_cap:
                groups.append([])
                size = 0
            groups[-1].append(utt)
            size += utt.packed_len
        return groups

    def _launch(self, utts: list[Utterance]) -> list["_Launched"]:
        """Queue one step for `utts`; on failure, split the batch to isolate the culprit.

        Returns what was launched (fewer utterances when one failed alone).
        """
        try:
            canvas = build_packed_canvas([u.item for u in utts], self.device)
            logits = self.backbone(canvas)
            finite = self.sampler.step(logits, canvas, utts)
        except Exception as exc:  # noqa: BLE001 - isolate to the item(s) at fault
            if _is_oom(exc):
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                tokens = sum(u.packed_len for u in utts)
                self._oom_cap = max(1, tokens // 2) if self._oom_cap is None else min(self._oom_cap, max(1, tokens // 2))
                self._clean_steps = 0
                log.warning("out of memory at %d packed tokens; capping steps at %d", tokens, self._oom_cap)
            if len(utts) == 1:
                log.exception("request %s: step failed", utts[0].state.request_id)
                self._finish(utts[0].state, "error", f"the engine failed on this request: {exc}")
                return []
            log.warning("step of %d items failed (%s); retrying in halves", len(utts), exc)
            half = len(utts) // 2
            return self._launch(utts[:half]) + self._launch(utts[half:])
        ready = None
        if finite.device.type != "cpu":
            host = torch.empty(finite.shape, dtype=finite.dtype, pin_memory=True)
            host.copy_(finite, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            finite = host
        return [_Launched(utts, finite, [u.step + 1 for u in utts], ready)]

    def _complete_chunk(self, utt: Utterance) -> None:
        """A chunk's last step has run: queue later chunks on it, hand it to the finisher."""
        state = utt.state
        index = utt.chunk_index
        tokens = utt.item.tokens
        try:
            if state.plan.chained and index == 0:
                chunk0 = VoicePrompt(tokens=tokens, text=state.plan.chunks[0].text, rms=0.0)
                for later in range(1, state.num_chunks):
                    self.scheduler.add(build_utterance(self.model, state, later, chunk0, self.device))
        except Exception as exc:  # noqa: BLE001 - isolate to this request
            log.exception("request %s: building later chunks failed", state.request_id)
            self._finish(state, "error", f"building the canvas failed: {exc}")
            return
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        request = state.request
        rms = request.voice.rms if request.voice else None
        postprocess = None if request.stream == "whole" else request.options.postprocess
        self.finisher.decode(state, index, tokens, ready, rms, postprocess)

    def _chunk_decoded(self, done: ChunkDecoded) -> None:
        state = done.state
        if state.finished:
            return
        self._emit(state, ChunkTokens(state.request_id, done.index, done.tokens))
        state.raw_audio[done.index] = None if done.post_processed else done.audio
        if done.post_processed:
            self._send_audio(state, done.index, done.audio, final=done.index == state.num_chunks - 1)
            if len(state.raw_audio) == state.num_chunks:
                self._finish(state, "done")
        elif len(state.raw_audio) == state.num_chunks:
            request = state.request
            rms = request.voice.rms if request.voice else None
            self.finisher.join(state, [state.raw_audio[i] for i in range(state.num_chunks)], rms,
                               request.options.postprocess)

    def _send_audio(self, state: RequestState, chunk: int, audio: np.ndarray, final: bool) -> None:
        if state.first_audio_at is None:
            state.first_audio_at = time.perf_counter()
        state.audio_samples += int(audio.shape[-1])
        self._emit(state, ChunkAudio(state.request_id, chunk, audio, self.sample_rate, final))

    def _finish(self, state: RequestState, outcome: str, message: str | None = None) -> None:
        if state.finished:
            return
        state.finished = True
        self.scheduler.drop_request(state.request_id)
        self._states.pop(state.request_id, None)
        with self._lock:
            self._live_ids.discard(state.request_id)
        now = time.perf_counter()
        ms = lambda t: round((t - state.submitted_at) * 1000.0, 3)  # noqa: E731
        self._emit(state, Finished(
            request_id=state.request_id,
            outcome=outcome,  # type: ignore[arg-type]
            message=message,
            audio_seconds=round(state.audio_samples / self.sample_rate, 4),
            queue_ms=ms(state.started_at) if state.started_at else ms(now),
            first_audio_ms=ms(state.first_audio_at) if state.first_audio_at else None,
            total_ms=ms(now),
        ))

    def _emit(self, state: RequestState, event: EngineEvent) -> None:
        try:
            state.sink(event)  # type: ignore[operator]
        except Exception:  # noqa: BLE001 - a consumer's bug must not stop the engine
            log.exception("request %s: event sink failed", state.request_id)
