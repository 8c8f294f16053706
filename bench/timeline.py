"""Where a lone request's first audio goes: one timeline from submit to the audio event.

The engine's own clocks say how long a request took; this says where the milliseconds of
its first chunk went, segment by segment, so a missed first-audio target names its cost:
planning on the caller's thread, the hop to the engine thread, the canvas build, the wait
for the first launch, the chunk's steps (GPU time per step and the GPU's idle time between
them), the host noticing the last step, the hop to a decode worker, the decode, the
post-processing and the hop back to the engine thread that sends the audio; beside them, the
thread CPU time of the planning and the post-processing.

It watches the engine through its observer port (`bench/observers.py`: host clocks, and CUDA
events on the engine's stream, no syncs added) and detaches when done. Works on any device (off
CUDA the step times are host times).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise

import torch

from bench.mixes import long_paragraph, make_text
from bench.observers import switchboard_of
from server.engine.runtime.observer import QuietObserver

SEGMENTS = ("plan", "to_engine_thread", "build", "to_first_launch", "steps", "notice_last_step", "to_decoder",
            "decode", "to_post", "post", "to_audio_event")


@dataclass
class _Launch:
    host_start: float
    host_end: float
    start: torch.cuda.Event | None
    end: torch.cuda.Event | None


@dataclass
class _Trace:
    """Host clocks (perf_counter) of one request's first chunk, filled as it runs."""

    submit: float = 0.0
    submitted: float = 0.0
    admit: float | None = None
    admitted: float | None = None
    completed: float | None = None  # the engine thread took chunk 0's last step's results
    decode_start: float | None = None
    decode_end: float | None = None
    post_start: float | None = None
    post_end: float | None = None
    plan_cpu_ms: float | None = None  # thread CPU time of the segment (time.thread_time)
    post_cpu_ms: float | None = None
    decoding: int | None = None  # the chunk whose decode `decode_start` began
    posting: int | None = None  # ... and whose post-processing `post_start` began
    post_cpu0: float = 0.0
    audio: float | None = None
    launches: list[_Launch] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


class Timeline(QuietObserver):
    """Watches `engine` for one request at a time (`run_one`), then `restore` detaches it."""

    def __init__(self, engine):
        self.engine = engine
        self.cuda = engine.device.type == "cuda"
        self.trace: _Trace | None = None
        self._pending: _Launch | None = None  # the step being launched, until `step_end`
        self._board = switchboard_of(engine)
        self._board.attach(self)

    def restore(self) -> None:
        self._board.detach(self)

    # ---- the engine's calls (its thread, or a lane's for a decode and its post-processing) ----

    def admit_begin(self, state) -> None:
        if (trace := self.trace) is not None:
            trace.admit = time.perf_counter()

    def admit_end(self, state) -> None:
        if (trace := self.trace) is not None:
            trace.admitted = time.perf_counter()

    def step_begin(self, index, batch) -> None:
        trace = self.trace
        if trace is None or trace.completed is not None:
            return
        start = end = None
        host_start = time.perf_counter()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        self._pending = _Launch(host_start, 0.0, start, end)

    def step_end(self, step) -> None:
        launch, self._pending = self._pending, None
        if launch is None:
            return
        if launch.end is not None:
            launch.end.record()
        launch.host_end = time.perf_counter()
        if (trace := self.trace) is not None:
            trace.launches.append(launch)

    def chunk_complete(self, utt) -> None:
        trace = self.trace
        if trace is not None and utt.chunk_index == 0 and trace.completed is None:
            trace.completed = time.perf_counter()

    def decode_begin(self, state, chunk) -> None:
        trace = self.trace
        if trace is not None and trace.decode_start is None:
            trace.decode_start, trace.decoding = time.perf_counter(), chunk

    def decode_end(self, state, chunk) -> None:
        trace = self.trace
        if trace is not None and trace.decode_end is None and trace.decoding == chunk:
            trace.decode_end = time.perf_counter()

    def post_begin(self, state, chunk) -> None:
        trace = self.trace
        if trace is not None and trace.post_start is None:
            trace.post_start, trace.posting = time.perf_counter(), chunk
            trace.post_cpu0 = time.thread_time()  # `post_end` comes on this thread, right after

    def post_end(self, state, chunk) -> None:
        trace = self.trace
        if trace is not None and trace.post_end is None and trace.posting == chunk:
            trace.post_end = time.perf_counter()
            trace.post_cpu_ms = (time.thread_time() - trace.post_cpu0) * 1e3

    def sink(self, event) -> None:
        from server.engine.types import ChunkAudio, Finished

        trace = self.trace
        if trace is None:
            return
        if isinstance(event, ChunkAudio) and trace.audio is None:
            trace.audio = time.perf_counter()
        elif isinstance(event, Finished):
            trace.done.set()

    def run_one(self, request, timeout: float = 120.0) -> dict:
        """Submit `request`, wait for it to end, and return its first chunk's segments (ms)."""
        self.trace = trace = _Trace()
        cpu0 = time.thread_time()
        trace.submit = time.perf_counter()
        self.engine.submit(request, self.sink)
        trace.submitted = time.perf_counter()
        trace.plan_cpu_ms = (time.thread_time() - cpu0) * 1e3
        if not trace.done.wait(timeout):
            raise TimeoutError(f"{request.request_id} did not finish in {timeout} s")
        self.trace = None
        return segments(trace, self.cuda)


def segments(trace: _Trace, cuda: bool) -> dict:
    """The trace as consecutive segments in ms (they add up to submit -> audio event)."""
    launches = trace.launches
    first = launches[0]
    if cuda:
        torch.cuda.synchronize()
        gpu_ms = [la.start.elapsed_time(la.end) for la in launches]
        idle_ms = [max(0.0, a.end.elapsed_time(b.start)) for a, b in pairwise(launches)]
        # the chunk's steps end on the GPU this long after the first launch's host clock
        steps_end = first.host_start + first.start.elapsed_time(launches[-1].end) / 1e3
    else:
        gpu_ms = [(la.host_end - la.host_start) * 1e3 for la in launches]
        idle_ms = [(b.host_start - a.host_end) * 1e3 for a, b in pairwise(launches)]
        steps_end = launches[-1].host_end
    marks = [trace.submit, trace.submitted, trace.admit, trace.admitted, first.host_start, steps_end,
             trace.completed, trace.decode_start, trace.decode_end, trace.post_start, trace.post_end, trace.audio]
    if any(m is None for m in marks):
        raise RuntimeError("the trace missed a mark: " + ", ".join(
            name for name, m in zip(("submit", "submitted", "admit", "admitted", "launch", "steps_end", "completed",
                                     "decode_start", "decode_end", "post_start", "post_end", "audio"), marks)
            if m is None))
    out = {name: round((b - a) * 1e3, 3) for name, a, b in zip(SEGMENTS, marks, marks[1:])}
    out["total"] = round((trace.audio - trace.submit) * 1e3, 3)
    # CPU time of the two host-bound segments: near their wall time, the thread ran all along
    # (a slow core); far below it, the thread waited (the interpreter lock, the scheduler)
    out["plan_cpu"] = round(trace.plan_cpu_ms, 3)
    out["post_cpu"] = round(trace.post_cpu_ms, 3)
    out["launches"] = len(launches)
    out["step_gpu_ms_mean"] = round(statistics.fmean(gpu_ms), 4)
    out["gpu_idle_between_steps_ms"] = round(sum(idle_ms), 3)
    return out


def _medians(rows: list[dict]) -> dict:
    return {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}


def run(engine, runs: int = 5, warmup: int = 2, seconds: float = 10.0, long_seconds: float = 60.0,
        first_chunk_seconds: float = 2.0, seed: int = 0) -> dict:
    """Timelines of a lone `seconds` line and of a long paragraph's first chunk, with and
    without fast start, as a WebSocket client asks for them (no progress events): each
    segment's median over `runs` (after `warmup`), and every run."""
    from server.engine.types import GenerationOptions, SynthesisRequest

    line = make_text(random.Random(seed + 3), seconds)
    paragraph = long_paragraph(seed, long_seconds)
    cases = {
        "lone_line": lambda i: SynthesisRequest(f"tl-line{i}", line, options=GenerationOptions(duration=seconds),
                                                progress=False),
        "long_default": lambda i: SynthesisRequest(f"tl-long{i}", paragraph, progress=False),
        "long_fast_start": lambda i: SynthesisRequest(
            f"tl-fast{i}", paragraph, options=GenerationOptions(first_chunk_seconds=first_chunk_seconds),
            progress=False),
    }
    timeline = Timeline(engine)
    out: dict = {}
    try:
        for name, make in cases.items():
            rows = [timeline.run_one(make(i)) for i in range(warmup + runs)][warmup:]
            out[name] = {"median_ms": _medians(rows), "runs": rows}
    finally:
        timeline.restore()
    return out
