"""Engine-level scenarios (submit -> post-processed audio inside one process), and the
reference `generate()` on the same requests."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import defaultdict

import numpy as np
import torch

from bench.metrics import stats
from bench.mixes import (
    FRAME_RATE,
    RequestSpec,
    audio_seconds,
    long_paragraph,
    make_text,
    plain_mix,
    poisson_arrivals,
)
from bench.observers import switchboard_of
from bench.parity import captured_tokens
from server.engine.model.step_observer import StepPhase
from server.engine.runtime.observer import QuietObserver

log = logging.getLogger("chorus.bench")


# ---- events -------------------------------------------------------------------------------


class Sink:
    """Thread-safe event sink: host timestamps of first audio and finish, tokens, outcomes."""

    def __init__(self):
        self.cond = threading.Condition()
        self.submitted: dict[str, float] = {}
        self.first_audio: dict[str, float] = {}
        self.finished: dict[str, object] = {}
        self.finished_at: dict[str, float] = {}
        self.tokens: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
        self.audio_samples: dict[str, int] = defaultdict(int)

    def __call__(self, event) -> None:
        from server.engine.types import ChunkAudio, ChunkTokens, Finished

        now = time.perf_counter()
        with self.cond:
            rid = event.request_id
            if isinstance(event, ChunkAudio):
                self.first_audio.setdefault(rid, now)
                self.audio_samples[rid] += int(event.audio.shape[-1])
            elif isinstance(event, ChunkTokens):
                self.tokens[rid][event.chunk] = event.tokens
            elif isinstance(event, Finished):
                self.finished[rid] = event
                self.finished_at[rid] = now
                self.cond.notify_all()

    def submit(self, engine, request) -> None:
        with self.cond:
            self.submitted[request.request_id] = time.perf_counter()
        engine.submit(request, self)

    def wait(self, ids, timeout: float) -> bool:
        ids = set(ids)
        with self.cond:
            return self.cond.wait_for(lambda: ids <= self.finished.keys(), timeout=timeout)

    def ms(self, rid: str, which: str = "finished") -> float | None:
        t = (self.finished_at if which == "finished" else self.first_audio).get(rid)
        return None if t is None else (t - self.submitted[rid]) * 1e3

    def errors(self, ids, limit: int = 8) -> list[dict]:
        out = []
        for rid in ids:
            ev = self.finished.get(rid)
            if ev is not None and ev.outcome == "error" and len(out) < limit:
                out.append({"request_id": rid, "message": ev.message})
        return out

    def outcomes(self, ids) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for rid in ids:
            ev = self.finished.get(rid)
            out[ev.outcome if ev else "missing"] += 1
        return dict(out)


def to_request(spec: RequestSpec, voice=None, **options):
    from server.engine.types import GenerationOptions, SynthesisRequest

    opts = GenerationOptions(duration=spec.seconds, guidance_scale=spec.guidance_scale, num_step=spec.num_step,
                             **options)
    return SynthesisRequest(spec.request_id, spec.text, voice=voice if spec.clone else None, options=opts)


def random_voice(seconds: float = 5.0, seed: int = 0):
    """A 5 s reference voice: random codes (the codec is random too), a transcript, an RMS."""
    import random

    from server.engine.types import VoicePrompt

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1024, (8, int(seconds * FRAME_RATE)), generator=gen)
    return VoicePrompt(tokens=tokens, text=make_text(random.Random(seed), seconds), rms=0.1)


# ---- stage timing -------------------------------------------------------------------------


class StageTimer(QuietObserver):
    """Times each forward's canvas build (host clock), backbone forward and sampler (CUDA events
    and host clocks; no syncs added), and each chunk's decode (to the audio on the host) and
    post-processing where they run, through the engine's observer port until `restore`."""

    def __init__(self, engine):
        self.records: list[dict] = []
        self.decode_ms: list[float] = []
        self.post_ms: list[float] = []
        self._started: dict[StepPhase, tuple[float, tuple | None]] = {}  # on the engine thread
        self._decoding: dict[tuple[str, int], float] = {}  # (request, chunk) -> its decode's start
        self._posting = threading.local()  # a lane's post-processing start
        self._board = switchboard_of(engine)
        self._board.attach(self)

    def restore(self) -> None:
        self._board.detach(self)

    def phase_begin(self, phase: StepPhase) -> None:
        if phase is StepPhase.CANVAS:
            self._started[phase] = (time.perf_counter(), None)
            return
        events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._started[phase] = (time.perf_counter(), events)
        events[0].record()

    def phase_end(self, phase: StepPhase, canvas) -> None:
        t0, events = self._started.pop(phase)
        if events is None:  # the canvas: a host phase, and the first of a forward's
            self.records.append({"build_host": time.perf_counter() - t0, "tokens": canvas.total_len,
                                 "items": len(canvas.items)})
            return
        events[1].record()
        key = "fwd" if phase is StepPhase.FORWARD else "samp"
        self.records[-1].update({f"{key}_host": time.perf_counter() - t0, f"{key}_ev": events})

    def decode_begin(self, state, chunk) -> None:
        self._decoding[(state.request_id, chunk)] = time.perf_counter()  # a relaunch starts it again

    def decode_end(self, state, chunk) -> None:
        t0 = self._decoding.pop((state.request_id, chunk), None)
        if t0 is not None:
            self.decode_ms.append((time.perf_counter() - t0) * 1e3)

    def post_begin(self, state, chunk) -> None:
        self._posting.t0 = time.perf_counter()

    def post_end(self, state, chunk) -> None:
        t0 = getattr(self._posting, "t0", None)
        if t0 is not None:
            self.post_ms.append((time.perf_counter() - t0) * 1e3)
            self._posting.t0 = None

    def report(self) -> dict:
        torch.cuda.synchronize()
        cols: dict[str, list[float]] = defaultdict(list)
        for r in self.records:
            if "fwd_ev" not in r:
                continue
            cols["canvas_build_host_ms"].append(r["build_host"] * 1e3)
            cols["forward_host_ms"].append(r["fwd_host"] * 1e3)
            cols["forward_gpu_ms"].append(r["fwd_ev"][0].elapsed_time(r["fwd_ev"][1]))
            if "samp_ev" in r:
                cols["sampler_host_ms"].append(r["samp_host"] * 1e3)
                cols["sampler_gpu_ms"].append(r["samp_ev"][0].elapsed_time(r["samp_ev"][1]))
            cols["packed_tokens"].append(r["tokens"])
            cols["items"].append(r["items"])
        out = {k: stats(v) for k, v in cols.items()}
        out["decode_ms_per_chunk"] = stats(self.decode_ms)
        out["postprocess_ms_per_chunk"] = stats(self.post_ms)
        return out


def step_log_stats(engine, since: int) -> dict:
    records = [r for r in engine.step_log if r.index > since]
    return {
        "steps": len(records),
        "step_wall_ms": stats([r.seconds * 1e3 for r in records]),
        "packed_tokens_per_step": stats([float(r.packed_tokens) for r in records], 1),
        "items_per_step": stats([float(r.items) for r in records], 1),
    }


# ---- scenarios ----------------------------------------------------------------------------


def run_mix(engine, specs: list[RequestSpec], voice=None, timeout: float = 300.0, timed: bool = True) -> dict:
    """Submit every request at once; audio-s/s over submit-first to last finished."""
    sink = Sink()
    timer = StageTimer(engine) if timed else None
    since = engine.stats().steps_total
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        for spec in specs:
            sink.submit(engine, to_request(spec, voice))
        ok = sink.wait([s.request_id for s in specs], timeout)
        wall = time.perf_counter() - t0
    finally:
        if timer:
            timer.restore()
    secs = audio_seconds(specs)
    outcomes = sink.outcomes([s.request_id for s in specs])
    all_done = outcomes == {"done": len(specs)}  # planned audio counts only if every request made it
    out = {
        "requests": len(specs), "audio_seconds": round(secs, 2), "wall_s": round(wall, 3),
        "audio_s_per_s": round(secs / wall, 2) if all_done else None, "completed_in_time": ok,
        "outcomes": outcomes,
        "errors": sink.errors([s.request_id for s in specs]),
        "output_audio_seconds": round(sum(sink.audio_samples.values()) / engine.sample_rate, 2),
        "total_ms": stats([sink.ms(s.request_id) for s in specs if sink.ms(s.request_id) is not None], 1),
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        **step_log_stats(engine, since),
    }
    if timer:
        out["stages"] = timer.report()
    return out


def single(engine, seconds: float = 10.0, runs: int = 5, warmup: int = 2, seed: int = 0) -> dict:
    import random

    text = make_text(random.Random(seed + 3), seconds)
    ms, first = [], []
    timer = None
    for i in range(warmup + runs):
        if i == warmup:
            since = engine.stats().steps_total
            timer = StageTimer(engine)
        sink = Sink()
        spec = RequestSpec(f"single{i}", text, seconds)
        sink.submit(engine, to_request(spec))
        sink.wait([spec.request_id], 60)
        if i >= warmup:
            ms.append(sink.ms(spec.request_id))
            first.append(sink.ms(spec.request_id, "first"))
    timer.restore()
    return {"seconds": seconds, "ms": stats(ms, 2), "first_audio_ms": stats(first, 2),
            "stages": timer.report(), **step_log_stats(engine, since)}


def long_text(engine, seconds: float = 60.0, runs: int = 3, seed: int = 0) -> dict:
    from server.engine.types import SynthesisRequest

    text = long_paragraph(seed, seconds)
    first, total, chunks = [], [], None
    for i in range(runs + 1):
        sink = Sink()
        req = SynthesisRequest(f"long{i}", text, stream="chunk")
        sink.submit(engine, req)
        sink.wait([req.request_id], 120)
        if i == 0:
            continue  # warm-up
        first.append(sink.ms(req.request_id, "first"))
        total.append(sink.ms(req.request_id))
        ev = sink.finished[req.request_id]
        chunks = {"audio_seconds": ev.audio_seconds, "outcome": ev.outcome}
    return {"text_chars": len(text), "first_audio_ms": stats(first, 2), "total_ms": stats(total, 1), "last": chunks}


def loaded(engine, max_audio_s_per_s: float, load: float = 0.7, duration_s: float = 60.0, seconds: float = 10.0,
           seed: int = 0) -> dict:
    """Poisson arrivals of 10 s utterances at `load` x the measured max throughput."""
    import random

    rate = load * max_audio_s_per_s / seconds
    arrivals = poisson_arrivals(rate, duration_s, seed)
    rng = random.Random(seed + 11)
    specs = [RequestSpec(f"load{i:05d}", make_text(rng, seconds), seconds) for i in range(len(arrivals))]
    sink = Sink()
    since = engine.stats().steps_total
    t0 = time.perf_counter()
    for at, spec in zip(arrivals, specs):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sink.submit(engine, to_request(spec))
    ok = sink.wait([s.request_id for s in specs], 120)
    ms = [sink.ms(s.request_id) for s in specs if sink.ms(s.request_id) is not None]
    return {"load": load, "rate_req_per_s": round(rate, 3), "duration_s": duration_s, "requests": len(specs),
            "outcomes": sink.outcomes([s.request_id for s in specs]), "completed_in_time": ok,
            "errors": sink.errors([s.request_id for s in specs]),
            "total_ms": stats(ms, 1), **step_log_stats(engine, since)}


# ---- the reference ------------------------------------------------------------------------


def reference_single(model, seconds: float = 10.0, runs: int = 3, seed: int = 0) -> dict:
    import random

    text = make_text(random.Random(seed + 3), seconds)
    model.generate(text, duration=seconds)
    ms = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(text, duration=seconds)
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"seconds": seconds, "ms": stats(ms, 1)}


def reference_mix(model, specs: list[RequestSpec], batch: int = 16) -> dict:
    """The reference's batched generate() over the mix, `batch` requests per call, in order."""
    model.generate([s.text for s in specs[:2]], duration=[s.seconds for s in specs[:2]])  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    per_batch = []
    for i in range(0, len(specs), batch):
        part = specs[i : i + batch]
        tb = time.perf_counter()
        model.generate([s.text for s in part], duration=[s.seconds for s in part])
        torch.cuda.synchronize()
        per_batch.append(round(time.perf_counter() - tb, 3))
    wall = time.perf_counter() - t0
    secs = audio_seconds(specs)
    return {"requests": len(specs), "batch": batch, "audio_seconds": round(secs, 2), "wall_s": round(wall, 3),
            "audio_s_per_s": round(secs / wall, 2), "batch_wall_s": per_batch,
            "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def reference_tokens(model, specs: list[RequestSpec], **kwargs) -> dict[str, np.ndarray]:
    """Token canvases of the reference's batched generate() (captured before decoding)."""
    with captured_tokens(model) as captured:
        model.generate([s.text for s in specs], duration=[s.seconds for s in specs], **kwargs)
    return {s.request_id: t.cpu().numpy() for s, t in zip(specs, captured)}


def token_agreement(model, engine, n: int = 8, seed: int = 5) -> dict:
    """Greedy (no Gumbel noise anywhere): the fraction of tokens equal to the reference's."""
    specs = plain_mix(n, seed, 2.0, 12.0)
    greedy = dict(position_temperature=0.0, class_temperature=0.0)
    ref = reference_tokens(model, specs, **greedy)
    sink = Sink()
    for spec in specs:
        sink.submit(engine, to_request(spec, **greedy))
    sink.wait([s.request_id for s in specs], 120)
    per = {}
    equal = total = 0
    for s in specs:
        ours = sink.tokens[s.request_id].get(0)
        if ours is None:
            per[s.request_id] = None
            continue
        eq = int((ours == ref[s.request_id]).sum())
        per[s.request_id] = round(eq / ours.size, 4)
        equal += eq
        total += ours.size
    return {"requests": n, "tokens": total, "fraction_equal": round(equal / max(total, 1), 4),
            "per_request": per, "exact_requests": sum(1 for v in per.values() if v == 1.0)}


def median(values):
    return statistics.median(values) if values else None
