"""What a running server's engines did during a window, from its `/metrics`.

A server-level scenario sees requests from the client's side; this says what the steps looked
like meanwhile: how many ran, how much of the window the device spent inside a step, a step's
mean device time beside the mean launch-to-launch interval of back-to-back steps (the
difference is host time between steps that the device waited for: scheduling, admission,
settling, the interpreter shared with decoding and the event loop), their mean packed tokens,
and the share of steps too large for a CUDA graph. `/metrics` copies each engine's recent step
records into its histograms when it is read, and an engine keeps only the last 4096, so
`StepWatch` reads it every couple of seconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

GRAPH_MAX_TOKENS = 8192  # the largest CUDA graph bucket by default (server/engine/model/cuda_graphs.py)


@dataclass(frozen=True)
class StepTotals:
    """Cumulative step figures of all engines, at one reading."""

    at: float  # perf_counter seconds
    steps: float
    step_seconds: float  # summed device time of the steps observed so far
    observed: float  # steps observed into the histograms (lags `steps` by the unread log)
    tokens: float
    over_graph: float  # observed steps above the graph limit's packed tokens
    interval_seconds: float = 0.0  # summed launch-to-launch intervals of back-to-back steps
    intervals: float = 0.0


# `/metrics` samples summed into StepTotals' fields (besides the packed-tokens histogram's bucket)
SAMPLES = {
    "chorus_steps_total": "steps",
    "chorus_step_seconds_sum": "step_seconds",
    "chorus_step_seconds_count": "observed",
    "chorus_packed_tokens_per_step_sum": "tokens",
    "chorus_packed_tokens_per_step_count": "tokens_count",
    "chorus_step_interval_seconds_sum": "interval_seconds",
    "chorus_step_interval_seconds_count": "intervals",
}


def parse_totals(text: str, at: float, graph_max_tokens: int = GRAPH_MAX_TOKENS) -> StepTotals:
    """Sum the step counters and histograms over every `engine` label of a `/metrics` page
    (`graph_max_tokens`, the server's graph limit, must be a bucket of the tokens histogram)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums = dict.fromkeys([*SAMPLES.values(), "within_graph"], 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SAMPLES:
                sums[SAMPLES[sample.name]] += sample.value
            elif sample.name == "chorus_packed_tokens_per_step_bucket" and sample.labels.get("le") != "+Inf" \
                    and float(sample.labels["le"]) == graph_max_tokens:
                sums["within_graph"] += sample.value
    return StepTotals(at, sums["steps"], sums["step_seconds"], sums["observed"], sums["tokens"],
                      sums["tokens_count"] - sums["within_graph"], sums["interval_seconds"], sums["intervals"])


def window(first: StepTotals, last: StepTotals, graph_max_tokens: int = GRAPH_MAX_TOKENS) -> dict:
    """The steps between two readings: counts, device-busy share, mean size and duration."""
    wall = last.at - first.at
    observed = last.observed - first.observed
    steps = last.steps - first.steps
    busy = last.step_seconds - first.step_seconds
    intervals = last.intervals - first.intervals
    return {
        "wall_s": round(wall, 2),
        "steps": int(steps),
        "steps_per_s": round(steps / wall, 1) if wall > 0 else None,
        "in_step_share": round(busy / wall, 3) if wall > 0 else None,
        "mean_step_ms": round(1e3 * busy / observed, 2) if observed else None,
        "mean_interval_ms": round(1e3 * (last.interval_seconds - first.interval_seconds) / intervals, 2)
        if intervals else None,
        "mean_packed_tokens": round((last.tokens - first.tokens) / observed, 1) if observed else None,
        f"share_over_{graph_max_tokens}_tokens": round((last.over_graph - first.over_graph) / observed, 3)
        if observed else None,
    }


class StepWatch:
    """Read `/metrics` every `every` seconds while a scenario runs; `result()` is the window."""

    def __init__(self, base_url: str, every: float = 2.0, graph_max_tokens: int = GRAPH_MAX_TOKENS):
        self.url = base_url.rstrip("/") + "/metrics"
        self.every = every
        self.graph_max_tokens = graph_max_tokens
        self.first: StepTotals | None = None
        self.last: StepTotals | None = None
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def _read(self, client) -> StepTotals:
        response = await client.get(self.url)
        response.raise_for_status()
        return parse_totals(response.text, time.perf_counter(), self.graph_max_tokens)

    async def _run(self, client) -> None:
        while True:
            await asyncio.sleep(self.every)
            self.last = await self._read(client)

    async def __aenter__(self) -> StepWatch:
        import httpx

        self._client = httpx.AsyncClient(timeout=30)
        try:
            self.first = await self._read(self._client)
            self._task = asyncio.create_task(self._run(self._client))
        except Exception as exc:  # noqa: BLE001 - the scenario runs on; the report says why
            self.error = f"{type(exc).__name__}: {exc}"
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as err:  # noqa: BLE001
                self.error = f"{type(err).__name__}: {err}"
        try:
            if self.first is not None and self.error is None:
                self.last = await self._read(self._client)
        except Exception as err:  # noqa: BLE001
            self.error = f"{type(err).__name__}: {err}"
        finally:
            await self._client.aclose()

    def result(self) -> dict:
        if self.error is not None or self.first is None or self.last is None:
            return {"error": self.error or "no reading"}
        return window(self.first, self.last, self.graph_max_tokens)
