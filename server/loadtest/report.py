"""The load test's findings: counts by outcome, refusals, protocol violations, latencies
and the server's memory over time, summed up as the JSON report; `passed` says whether
nothing was lost and nothing broke the protocol."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Report:
    sent: int = 0
    accepted: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"done": 0, "cancelled": 0, "error": 0})
    errors_after_accept: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    cancels_sent: int = 0
    cancelled_before_accept: int = 0
    protocol_violations: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    first_audio_ms: list[float] = field(default_factory=list)
    audio_seconds: float = 0.0
    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    unfinished: int = 0
    connection_errors: list[str] = field(default_factory=list)

    def violation(self, text: str) -> None:
        self.protocol_violations.append(text)

    def summary(self, duration: float, settings: dict) -> dict:
        def pct(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "settings": settings,
            "duration_s": round(duration, 1),
            "sent": self.sent,
            "accepted": self.accepted,
            "outcomes": self.outcomes,
            "errors_after_accept": self.errors_after_accept,
            "refused": self.refused,
            "cancels_sent": self.cancels_sent,
            "cancelled_before_accept": self.cancelled_before_accept,
            "accepted_but_unfinished": self.unfinished,
            "protocol_violations": len(self.protocol_violations),
            "protocol_violation_examples": self.protocol_violations[:20],
            "connection_errors": len(self.connection_errors),
            "connection_error_examples": self.connection_errors[:20],
            "done_per_second": round(self.outcomes["done"] / duration, 2) if duration else None,
            "latency_ms": {"p50": pct(self.latencies_ms, 0.5), "p90": pct(self.latencies_ms, 0.9),
                           "p95": pct(self.latencies_ms, 0.95), "p99": pct(self.latencies_ms, 0.99),
                           "max": round(max(self.latencies_ms), 1) if self.latencies_ms else None},
            "first_audio_ms": {"p50": pct(self.first_audio_ms, 0.5), "p95": pct(self.first_audio_ms, 0.95),
                               "p99": pct(self.first_audio_ms, 0.99)},
            "audio_seconds": round(self.audio_seconds, 1),
            "server_rss_mb": rss_summary(self.rss_mb),
        }


def rss_summary(samples: list[tuple[float, float]]) -> dict:
    """First, last and peak RSS, and its growth after warm-up: the median of the last
    quarter of the run minus the median of its second quarter."""
    if not samples:
        return {"samples": []}
    values = [m for _, m in samples]
    n = len(values)
    early = values[n // 4 : max(n // 4 + 1, n // 2)]
    late = values[-max(1, n // 4):]
    return {
        "first": values[0], "last": values[-1], "max": max(values),
        "after_warmup": round(statistics.median(early), 1),
        "end": round(statistics.median(late), 1),
        "growth_after_warmup": round(statistics.median(late) - statistics.median(early), 1),
        "samples": [[round(t, 1), m] for t, m in samples],
    }


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def passed(result: dict) -> bool:
    return (result["accepted_but_unfinished"] == 0 and result["protocol_violations"] == 0
            and result["connection_errors"] == 0 and result.get("server_inflight_after") in (0, 0.0, None))
