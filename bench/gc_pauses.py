"""Python's cyclic collector in the engine process, before and after `gc.freeze()` (CUDA).

`python -m bench.gc_pauses --checkpoint ckpt-full --out gc.json`: loads the engine as
`chorus serve` does (bf16, CUDA graphs captured), then with a `gc.callbacks` hook timing every
collection runs the 256 mix three times, 20 s of Poisson 10 s lines at 70% of 270 audio-s/s
and seven lone lines; then collects, freezes what is alive (`gc.collect(); gc.freeze()`) and
runs the same again. Per run: collections by generation (count, total and longest ms), the
throughput and the slowest steps, the latencies. A full collection walks every tracked object
(~500k after torch, transformers and the model are loaded; ~0.3 s): if one fell inside a step,
the slowest steps would show it, and a freeze would remove it.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time

from bench.sweeps import run_checkpoint_sweep

RUNS = 3


class CollectionTimer:
    """Every collection's generation and duration, from `gc.callbacks`."""

    def __init__(self):
        self.events: list[dict] = []
        self._start = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.events.append({"gen": info["generation"], "ms": (time.perf_counter() - self._start) * 1e3})

    def since(self, mark: int) -> dict:
        """Collections after `mark` (a length of `events`) by generation."""
        out: dict[str, dict] = {}
        for event in self.events[mark:]:
            row = out.setdefault(str(event["gen"]), {"n": 0, "total_ms": 0.0, "max_ms": 0.0})
            row["n"] += 1
            row["total_ms"] = round(row["total_ms"] + event["ms"], 2)
            row["max_ms"] = round(max(row["max_ms"], event["ms"]), 2)
        return out


def _phase(engine, specs, timer: CollectionTimer) -> dict:
    from bench import engine_bench as eb

    result: dict = {"tracked_objects": len(gc.get_objects()), "mix": []}
    for _ in range(RUNS):
        mark = len(timer.events)
        run = eb.run_mix(engine, specs, timed=False)
        steps = sorted((r.seconds * 1e3 for r in list(engine.step_log)[-run["steps"]:]), reverse=True)
        result["mix"].append({"audio_s_per_s": run["audio_s_per_s"], "wall_s": run["wall_s"], "steps": run["steps"],
                              "step_median_ms": round(statistics.median(steps), 2),
                              "slowest_steps_ms": [round(ms, 1) for ms in steps[:6]], "gc": timer.since(mark)})
        print(json.dumps(result["mix"][-1]), flush=True)
    mark = len(timer.events)
    loaded = eb.loaded(engine, 270.0, duration_s=20.0)
    result["loaded"] = {"total_ms": loaded["total_ms"], "outcomes": loaded["outcomes"], "gc": timer.since(mark)}
    mark = len(timer.events)
    single = eb.single(engine, runs=7)
    result["single"] = {"first_audio_ms": single["first_audio_ms"], "gc": timer.since(mark)}
    return result


def measure(checkpoint: str) -> dict:
    """Both phases on one engine: collections as they come, then after a freeze."""
    import torch

    from bench import engine_bench as eb
    from bench.mixes import plain_mix
    from server.checkpoint import load_omnivoice
    from server.config import EngineSettings
    from server.engine.runtime.loop import EngineLoop

    torch.set_grad_enabled(False)
    timer = CollectionTimer()
    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    engine = EngineLoop(model, EngineSettings(device="cuda", dtype="bfloat16", attention="auto"), "gc",
                        model_name="omnivoice-random", random_checkpoint=True)
    engine.backbone.capture()
    engine.start()
    try:
        specs = plain_mix(256, 0)
        eb.run_mix(engine, specs[:32], timed=False)  # warm-up
        doc: dict = {"gpu": torch.cuda.get_device_name(), "python": sys.version.split()[0],
                     "threshold": gc.get_threshold(), "unfrozen": _phase(engine, specs, timer)}
        t = time.perf_counter()
        gc.collect()
        gc.freeze()
        doc["collect_and_freeze_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        doc["frozen"] = _phase(engine, specs, timer)
    finally:
        engine.stop()
    return doc


def main(argv: list[str] | None = None) -> int:
    return run_checkpoint_sweep("bench.gc_pauses", __doc__, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
