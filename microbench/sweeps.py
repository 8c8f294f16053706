"""What the kernel sweeps share: a call's time from a CUDA graph of many calls, a row of
variants timed and checked against the default, and their command line (its start: a parser
with `--out`; its end: refuse a machine without CUDA, run, write the JSON)."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable

import torch


def per_call_us(fn, reps: int = 28, iters: int = 30) -> float:
    """Median microseconds a call of `fn`, `reps` calls captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return round(statistics.median(times), 2)


def variant_timings(variants: dict[str, object], call: Callable[[object], object],
                    same_as_default: Callable[[object], bool], timer: Callable = per_call_us) -> dict:
    """A sweep's row: for each labelled variant (a kernel's program shape, its warps, ...) the
    microseconds a call of `call(variant)` takes (`timer`) and whether `same_as_default(variant)`
    says its output equals the default's bit for bit; `best`, the fastest label."""
    row: dict = {label: {"us": timer(lambda v=v: call(v)), "bitwise_equal_to_default": bool(same_as_default(v))}
                 for label, v in variants.items()}
    row["best"] = min(variants, key=lambda label: row[label]["us"])
    return row


LAYERS = 28  # the full-size model's layers: a sweep's calls each read their own weights


def per_layer_us(call, layers: int = LAYERS) -> float:
    """Median microseconds a call of `call(layer)`, one call per layer in one CUDA graph (each
    on its own weights, so they come from memory as a forward's do, not from the L2 cache)."""
    layer = itertools.cycle(range(layers))
    return per_call_us(lambda: call(next(layer)), reps=layers, iters=15)


def cuda_sweep_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """`python -m <module>`'s parser: the doc's first line as its description, `--out`."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    p.add_argument("--out", default=None, help="write the result's JSON here")
    return p


def run_cuda_sweep(prog: str, sweep: Callable[[], dict], out: str | None) -> int:
    """Exit status 2 without a CUDA GPU; else run `sweep` and write its result to `out`."""
    if not torch.cuda.is_available():
        print(f"{prog} needs a CUDA GPU", file=sys.stderr)
        return 2
    result = sweep()
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def run_plain_sweep(module: str, doc: str, sweep: Callable[[], dict], argv: list[str] | None) -> int:
    """`python -m <module>` for a sweep with no options but `--out`: exit status 2 without a
    CUDA GPU, else `sweep()` written to `--out`."""
    p = cuda_sweep_parser(module, doc)
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, sweep, args.out)


def run_checkpoint_sweep(module: str, doc: str, measure: Callable[[str], dict], argv: list[str] | None) -> int:
    """`python -m <module>` for a measurement of a checkpoint: `--checkpoint` (required) and
    `--out`; exit status 2 without a CUDA GPU, else `measure(checkpoint)` written to `--out`."""
    p = cuda_sweep_parser(module, doc)
    p.add_argument("--checkpoint", required=True,
                   help="a full-size checkpoint folder (`chorus make-checkpoint --size full`)")
    args = p.parse_args(argv)
    return run_cuda_sweep(p.prog, lambda: measure(args.checkpoint), args.out)
