"""What the loaded p95 would be if a step cost only what the GPU measured: a queueing model.

`python -m microbench.queue_model bench/results/<run>.json` takes a `chorus bench` result's own
numbers: the step's cost by packed tokens (the `forward` rows: graphed where a graph ran, else
eager, plus what a step costs beyond its forward, the sampler and host time not hidden, taken
from the lone and the 256-mix steps and interpolated by tokens), a 10 s line's tokens,
and the Poisson scenario's arrival rate. It simulates that scenario as the deadline scheduler
runs it when every request is urgent (all of them in every step: processor sharing, each request
done after `num_step` steps) and prints the first-audio p50/p95 it predicts beside the measured
ones. The difference is what the server adds beyond the step's GPU cost (host work that is not
hidden, contention between the step thread, decoding and the event loop); the prediction is
what cheaper steps alone can reach. At a fixed load (arrivals scaled with capacity) latency
scales with the step's cost, so `scale_for_target` is the step cost, as a share of today's, at
which the model's p95 meets `--target-ms`. `--caps 4,8` also simulates steps of at most that
many requests, the rest waiting first come first served: whether a scheduler that shares less
would do better with the same step costs. `--rates 18.5,19.7` also predicts the p50/p95 at other
arrival rates on the same step costs: runs whose throughput scenario measured a few percent
apart load their Poisson scenario that much apart, and near capacity the p95 follows the rate
steeply. `capacity_req_per_s` is how many 10 s lines a second the GPU finishes at most, every
step full: sharing (as many lines as `--max-packed-tokens` holds) and under each cap.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from bench.metrics import emit_report, percentile


@dataclass(frozen=True)
class StepCost:
    """A step's wall time (ms) by its packed tokens, linear between measured points."""

    tokens: tuple[int, ...]
    ms: tuple[float, ...]

    def __call__(self, tokens: int) -> float:
        i = bisect.bisect_left(self.tokens, tokens)
        if i == 0:
            return self.ms[0]
        if i == len(self.tokens):  # beyond the last point: its cost per token
            return self.ms[-1] * tokens / self.tokens[-1]
        (x0, y0), (x1, y1) = (self.tokens[i - 1], self.ms[i - 1]), (self.tokens[i], self.ms[i])
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


def simulate(rate_per_s: float, cost: StepCost, tokens_per_request: int, num_step: int = 32,
             extra_ms: float = 0.0, seconds: float = 600.0, seed: int = 0,
             max_running: int | None = None) -> list[float]:
    """First-audio latencies (ms) of Poisson arrivals when every step holds every request in
    flight; a request joins at the next step boundary and is heard `extra_ms` after its last step.
    With `max_running`, at most that many share a step and the rest wait first come first served."""
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be at least 1, not {max_running}")
    rng = random.Random(seed)
    arrivals, t = [], rng.expovariate(rate_per_s / 1000.0)
    while t < seconds * 1000.0:
        arrivals.append(t)
        t += rng.expovariate(rate_per_s / 1000.0)
    cap = max_running or max(len(arrivals), 1)
    now, i, queued, running, latencies = 0.0, 0, deque(), [], []  # running: [arrived at, steps left]
    while i < len(arrivals) or queued or running:
        if not running and not queued and arrivals[i] > now:
            now = arrivals[i]
        while i < len(arrivals) and arrivals[i] <= now:
            queued.append(arrivals[i])
            i += 1
        while queued and len(running) < cap:
            running.append([queued.popleft(), num_step])
        now += cost(len(running) * tokens_per_request)
        for item in running:
            item[1] -= 1
        latencies += [now - arrived + extra_ms for arrived, left in running if left == 0]
        running = [item for item in running if item[1] > 0]
    return latencies


def capacity(cost: StepCost, tokens_per_request: int, lines_per_step: int, num_step: int = 32) -> float:
    """Requests a second the GPU finishes with every step holding `lines_per_step` of them."""
    return lines_per_step / (num_step * cost(lines_per_step * tokens_per_request) / 1000.0)


def model_inputs(result: dict) -> dict:
    """Step costs, request size and the Poisson scenario's rate from a `chorus bench` result."""
    rows = result["forward"]["rows"]
    single = result["engine"]["single_10s"]
    stages = single["stages"]
    lone_tokens = int(stages["packed_tokens"]["median"])
    # what a step costs beyond its forward (sampler, host not hidden), at a lone step and at a
    # full one of the 256 mix: in between, by tokens
    beyond = StepCost(*zip(*sorted(
        (int(run["stages"]["packed_tokens"]["median"]),
         run["step_wall_ms"]["median"] - run["stages"]["forward_gpu_ms"]["median"])
        for run in (single, result["engine"]["throughput_256"]))))
    points = sorted((r["tokens"], r.get("fused_graph_ms") or r["fused_eager_ms"]) for r in rows)
    cost = StepCost(tuple(t for t, _ in points), tuple(ms + beyond(t) for t, ms in points))
    loaded = result["server"]["loaded"]
    extra = (stages["decode_ms_per_chunk"]["median"] + stages["postprocess_ms_per_chunk"]["median"]
             + (result["summary"].get("ws_single_gap_ms") or 0.0))
    return {"cost": cost, "tokens_per_request": lone_tokens, "rate_per_s": loaded["rate_req_per_s"],
            "extra_ms": round(extra, 2), "measured": loaded["client_first_audio_ms"]}


def predict(result: dict, target_ms: float = 250.0, seconds: float = 600.0, seed: int = 0,
            caps: tuple[int, ...] = (), rates: tuple[float, ...] = (), max_packed_tokens: int = 32768) -> dict:
    inputs = model_inputs(result)
    cost, tokens, rate, extra = inputs["cost"], inputs["tokens_per_request"], inputs["rate_per_s"], inputs["extra_ms"]
    lat = simulate(rate, cost, tokens, extra_ms=extra, seconds=seconds, seed=seed)
    p50, p95 = percentile(lat, 50), percentile(lat, 95)
    # same load with every cost scaled by s (rate by 1/s): latencies scale by s, `extra` aside
    scale = (target_ms - extra) / (p95 - extra) if p95 > extra else None
    measured = inputs["measured"]
    return {
        "rate_req_per_s": rate, "tokens_per_request": tokens, "extra_ms": extra,
        "step_cost_ms": dict(zip(map(str, cost.tokens), (round(m, 3) for m in cost.ms))),
        "predicted_first_audio_ms": {"p50": round(p50, 1), "p95": round(p95, 1), "n": len(lat)},
        "measured_first_audio_ms": {"p50": measured.get("p50"), "p95": measured.get("p95"), "n": measured.get("n")},
        "measured_over_predicted_p95": round(measured["p95"] / p95, 2) if measured.get("p95") else None,
        "target_ms": target_ms,
        "scale_for_target": round(scale, 3) if scale is not None else None,
        "capped_first_audio_ms": {str(cap): _p50_p95(simulate(rate, cost, tokens, extra_ms=extra, seconds=seconds,
                                                              seed=seed, max_running=cap)) for cap in caps},
        "first_audio_ms_at_rates": {str(r): _p50_p95(simulate(r, cost, tokens, extra_ms=extra, seconds=seconds,
                                                              seed=seed)) for r in rates},
        "capacity_req_per_s": {"sharing": round(capacity(cost, tokens, max(1, max_packed_tokens // tokens)), 1)}
        | {str(cap): round(capacity(cost, tokens, cap), 1) for cap in caps},
        "commit": result.get("summary", {}).get("commit"),
    }


def _p50_p95(latencies: list[float]) -> dict:
    return {"p50": round(percentile(latencies, 50), 1), "p95": round(percentile(latencies, 95), 1)}


def _list_option(convert, what: str, example: str, valid, rule: str):
    """An argparse type: comma-separated values, each `convert`ed and `valid`, else a clear error."""
    def parse(text: str) -> tuple:
        try:
            values = tuple(convert(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of {what}: {text!r} (e.g. {example})") from None
        if not all(valid(v) for v in values):
            raise argparse.ArgumentTypeError(rule)
        return values
    return parse


_rates = _list_option(float, "arrival rates", "18.5,19.7", lambda r: r > 0,
                      "each rate must be above 0 requests a second")
_caps = _list_option(int, "request counts", "4,8,16", lambda c: c >= 1, "each cap must be at least 1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m microbench.queue_model", description=__doc__.splitlines()[0])
    p.add_argument("result", help="a chorus bench result with forward, engine_single and ws_loaded")
    p.add_argument("--target-ms", type=float, default=250.0)
    p.add_argument("--seconds", type=float, default=600.0, help="simulated seconds of arrivals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--caps", type=_caps, default=(), help="comma-separated limits of requests per step to "
                   "simulate beside sharing (first come first served past the limit), e.g. 4,8,16")
    p.add_argument("--rates", type=_rates, default=(), help="comma-separated arrival rates (requests a second) "
                   "to predict beside the run's own, on its step costs, e.g. 18.5,19.7")
    p.add_argument("--max-packed-tokens", type=int, default=32768, help="the engine's step budget, for the "
                   "sharing capacity (default 32768)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    emit_report(predict(json.loads(Path(args.result).read_text()), args.target_ms, args.seconds, args.seed,
                        args.caps, args.rates, args.max_packed_tokens), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
