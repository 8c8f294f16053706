"""Prometheus metrics: one registry per app, so several apps can share one process.

Request-level numbers are counted as requests end; engine-level ones (queue depth, items
in flight, packed tokens and latency per step) are read from each engine's stats and step
log when `/metrics` is scraped, so the engine thread never calls into this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401 - re-exported for the handler
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
FIRST_AUDIO_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("chorus_requests", "Requests by endpoint and outcome (done, cancelled, "
                                "error, or the rejection code)", ["endpoint", "outcome"], registry=r)
        self.queue_depth = Gauge("chorus_queue_depth", "Text chunks waiting for a step slot", ["engine"],
                                 registry=r)
        self.inflight_items = Gauge("chorus_inflight_items", "Text chunks being stepped", ["engine"],
                                    registry=r)
        self.inflight_requests = Gauge("chorus_inflight_requests", "Accepted requests not yet ended",
                                       registry=r)
        self.packed_tokens = Histogram("chorus_packed_tokens_per_step", "Packed tokens in one diffusion step",
                                       ["engine"], buckets=TOKEN_BUCKETS, registry=r)
        self.step_seconds = Histogram("chorus_step_seconds", "Wall time of one diffusion step", ["engine"],
                                      buckets=STEP_BUCKETS, registry=r)
        self.step_interval = Histogram(
            "chorus_step_interval_seconds", "Launch to launch of back-to-back steps (engine not idle): a "
            "step's device time plus the host time between steps that the device waited for", ["engine"],
            buckets=STEP_BUCKETS, registry=r)
        self.steps = Counter("chorus_steps", "Diffusion steps run", ["engine"], registry=r)
        self.items_per_step = Histogram("chorus_items_per_step", "Text chunks stepped together in one diffusion "
                                        "step (requests, stream segments and dialogue lines share steps)",
                                        ["engine"], buckets=ITEM_BUCKETS, registry=r)
        self.audio_seconds = Counter("chorus_audio_seconds", "Seconds of audio produced", registry=r)
        self.first_audio = Histogram("chorus_time_to_first_audio_seconds", "From submission to the first audio",
                                     buckets=FIRST_AUDIO_BUCKETS, registry=r)
        self.first_audio_kind = Histogram(
            "chorus_first_audio_seconds", "Time to first audio by kind: line (a request, from submission), "
            "stream_first (a stream's first segment, from its completion to its first frame sent), stream_later "
            "(a later segment, from its submission to its first audio)", ["kind"], buckets=FIRST_AUDIO_BUCKETS,
            registry=r)
        self.stream_underruns = Counter("chorus_stream_underruns", "Stream audio frames sent after they were due "
                                        "on the stream's playback clock (the listener's player ran dry)",
                                        registry=r)
        self.stream_late_seconds = Counter("chorus_stream_late_seconds", "Seconds by which late stream frames "
                                           "missed their playback time, together", registry=r)
        self.realtime_headroom = Gauge("chorus_realtime_headroom", "The share of the engine the admission still "
                                       "sees free for realtime work (the most free engine's; below "
                                       "zero: over-committed)", registry=r)
        self.voice_encodes = Gauge("chorus_voice_encodes_running", "Reference clips being encoded (uploads and "
                                   "one-shot references; at most --max-voice-encodes)", registry=r)
        self.voice_encode_waits = Counter("chorus_voice_encode_waits", "Reference clips that waited for an "
                                          "encode slot (--max-voice-encodes)", registry=r)
        self.decode_hold = Gauge("chorus_decode_hold_seconds", "Wall time the decode hold kept chunks with "
                                 "slack waiting, since start (its share of uptime is bounded)", ["engine"],
                                 registry=r)
        self.decode_holds_refused = Gauge("chorus_decode_holds_refused", "Decode holds not started for want "
                                          "of hold budget, since start", ["engine"], registry=r)
        self.normalize_workers = Gauge("chorus_normalize_workers", "normalize_text's worker processes by state "
                                       "(busy: on a piece of some request's text; idle)", ["state"], registry=r)
        self.normalize_waiting = Gauge("chorus_normalize_pieces_waiting", "Pieces of text waiting for a "
                                       "normalize_text worker, all requests together", registry=r)
        self.jobs = Gauge("chorus_jobs", "Jobs in the job store by status (where the store is shared, every "
                          "replica's)", ["status"], registry=r)
        self.job_items = Counter("chorus_job_items", "Job items this server ended, by outcome (done; failed; "
                                 "released: given back to the queue; dropped: made after its claim was lost)",
                                 ["outcome"], registry=r)
        self.job_audio_seconds = Counter("chorus_job_audio_seconds", "Seconds of audio of job items this server "
                                         "made", registry=r)
        self._counted_steps: dict[str, int] = {}
        self._seen_steps: dict[str, int] = {}

    def rejected(self, endpoint: str, code: str) -> None:
        self.requests.labels(endpoint, code).inc()

    def finished(self, endpoint: str, outcome: str, audio_seconds: float, first_audio_ms: float | None,
                 kind: str | None = "line") -> None:
        """A request ended; its first audio counts as `kind` (None: the caller counts it, as a
        stream does for its segments)."""
        self.requests.labels(endpoint, outcome).inc()
        if audio_seconds > 0:
            self.audio_seconds.inc(audio_seconds)
        if first_audio_ms is not None:
            self.first_audio.observe(first_audio_ms / 1000.0)
            if kind is not None:
                self.first_audio_of(kind, first_audio_ms / 1000.0)

    def first_audio_of(self, kind: str, seconds: float | None) -> None:
        if seconds is not None:
            self.first_audio_kind.labels(kind).observe(seconds)

    def stream_late(self, seconds: float) -> None:
        """A stream frame went out `seconds` after its playback time."""
        self.stream_underruns.inc()
        self.stream_late_seconds.inc(seconds)

    def observe_engines(self, engines: Iterable[Any]) -> None:
        """Copy each engine's gauges and its steps since the last scrape into the registry."""
        headroom = None
        for engine in engines:
            stats = engine.stats()
            headroom = stats.realtime_headroom if headroom is None else max(headroom, stats.realtime_headroom)
            name = stats.name
            self.queue_depth.labels(name).set(stats.waiting_items)
            self.inflight_items.labels(name).set(stats.running_items)
            self.decode_hold.labels(name).set(stats.decode_hold_seconds_total)
            self.decode_holds_refused.labels(name).set(stats.decode_holds_refused_total)
            counted = self._counted_steps.get(name, 0)
            if stats.steps_total > counted:
                self.steps.labels(name).inc(stats.steps_total - counted)
                self._counted_steps[name] = stats.steps_total
            # the log holds only the most recent steps; each record carries its step number
            seen = self._seen_steps.get(name, 0)
            records = list(engine.step_log)
            for record in records:
                if record.index > seen:
                    self.packed_tokens.labels(name).observe(record.packed_tokens)
                    self.items_per_step.labels(name).observe(record.items)
                    self.step_seconds.labels(name).observe(record.seconds)
                    if record.interval is not None:
                        self.step_interval.labels(name).observe(record.interval)
            if records:
                self._seen_steps[name] = max(seen, records[-1].index)
        if headroom is not None:
            self.realtime_headroom.set(headroom)

    def observe_normalizer(self, busy: int, idle: int, waiting: int) -> None:
        self.normalize_workers.labels("busy").set(busy)
        self.normalize_workers.labels("idle").set(idle)
        self.normalize_waiting.set(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
