"""Step figures of a scenario's window from two `/metrics` readings (canned pages here; the
loaded scenario's test reads a real server's)."""

from __future__ import annotations

import pytest

from bench.ws_bench import parse_totals, window


def page(steps: int, seconds: float, tokens: list[int], interval: float = 0.0) -> str:
    """A `/metrics` page of two engines that split these steps between them."""
    lines = ["# HELP chorus_steps_total Diffusion steps run", "# TYPE chorus_steps_total counter"]
    halves = {"engine0": tokens[::2], "engine1": tokens[1::2]}
    for name in halves:
        lines.append(f'chorus_steps_total{{engine="{name}"}} {steps / 2}')
    lines += ["# HELP chorus_step_seconds Wall time of one diffusion step", "# TYPE chorus_step_seconds histogram"]
    for name, mine in halves.items():
        lines.append(f'chorus_step_seconds_bucket{{engine="{name}",le="+Inf"}} {len(mine)}')
        lines.append(f'chorus_step_seconds_count{{engine="{name}"}} {len(mine)}')
        lines.append(f'chorus_step_seconds_sum{{engine="{name}"}} {seconds * len(mine) / len(tokens)}')
    lines += ["# TYPE chorus_step_interval_seconds histogram"]
    for name, mine in halves.items():
        lines.append(f'chorus_step_interval_seconds_count{{engine="{name}"}} {len(mine) - 1}')
        lines.append(f'chorus_step_interval_seconds_sum{{engine="{name}"}} {interval * (len(mine) - 1)}')
    lines += ["# HELP chorus_packed_tokens_per_step Packed tokens in one diffusion step",
              "# TYPE chorus_packed_tokens_per_step histogram"]
    for name, mine in halves.items():
        for le in (2048, 4096, 8192):
            lines.append(f'chorus_packed_tokens_per_step_bucket{{engine="{name}",le="{float(le)}"}} '
                         f'{sum(1 for t in mine if t <= le)}')
        lines.append(f'chorus_packed_tokens_per_step_bucket{{engine="{name}",le="+Inf"}} {len(mine)}')
        lines.append(f'chorus_packed_tokens_per_step_count{{engine="{name}"}} {len(mine)}')
        lines.append(f'chorus_packed_tokens_per_step_sum{{engine="{name}"}} {sum(mine)}')
    return "\n".join(lines) + "\n"


def test_window_of_two_readings_over_all_engines():
    first = parse_totals(page(4, 0.02, [500, 600, 700, 800], interval=0.004), at=10.0)
    assert (first.steps, first.observed, first.tokens, first.over_graph) == (4, 4, 2600, 0)
    later = [500, 600, 700, 800, 3000, 5000, 9000, 1000]
    last = parse_totals(page(8, 0.06, later, interval=0.012), at=12.0)
    w = window(first, last)
    assert w["steps"] == 4 and w["steps_per_s"] == 2.0 and w["wall_s"] == 2.0
    assert w["in_step_share"] == pytest.approx(0.02) and w["mean_step_ms"] == pytest.approx(10.0)
    assert w["mean_packed_tokens"] == (3000 + 5000 + 9000 + 1000) / 4
    assert w["share_over_8192_tokens"] == 0.25  # the default graph limit
    limited = window(parse_totals(page(4, 0.02, [500, 600, 700, 800]), 10.0, graph_max_tokens=4096),
                     parse_totals(page(8, 0.06, later), 12.0, graph_max_tokens=4096), graph_max_tokens=4096)
    assert limited["share_over_4096_tokens"] == 0.5
    # intervals: 2 then 6 back-to-back pairs, 4 ms then 12 ms each -> (72 - 8) / 4 ms
    assert w["mean_interval_ms"] == pytest.approx(16.0)


def test_a_window_without_observed_steps_says_none():
    reading = parse_totals(page(2, 0.01, [500, 600]), at=1.0)
    w = window(reading, reading)
    assert w["steps"] == 0 and w["mean_step_ms"] is None and w["mean_packed_tokens"] is None


def test_graph_limit_is_the_engines_and_a_histogram_bucket():
    """The share beyond the largest CUDA graph reads a bucket of the tokens histogram: both
    must stay the engine's own limit (kept literal in the bench, which runs without torch)."""
    from bench.ws_bench import GRAPH_MAX_TOKENS
    from server.cli.main import build_parser
    from server.config import EngineSettings
    from server.engine.model.cuda_graphs import DEFAULT_GRAPH_MAX_TOKENS, GRAPH_TOKEN_BUCKETS
    from server.metrics import TOKEN_BUCKETS

    assert GRAPH_TOKEN_BUCKETS[-1] == DEFAULT_GRAPH_MAX_TOKENS == GRAPH_MAX_TOKENS in TOKEN_BUCKETS
    assert EngineSettings().graph_max_tokens == GRAPH_MAX_TOKENS
    assert build_parser().parse_args(["serve"]).graph_max_tokens == GRAPH_MAX_TOKENS
    from bench.cli import build_parser as bench_parser

    limit = next(a for a in bench_parser()._actions if a.dest == "graph_max_tokens")
    assert limit.default == GRAPH_MAX_TOKENS and set(limit.choices) <= set(TOKEN_BUCKETS)
