"""Aggregate throughput of one engine against one engine per GPU, on the same request mix.

`python -m bench.pool_bench --checkpoint DIR --devices cuda:0 cuda:0,1`: for each device
set, an `EnginePool` (the server's own routing: least outstanding work) runs the seeded
256-request mix, all submitted at once, after a short warm-up. Prints JSON with audio-s/s
per set and the ratio of the last to the first (`summary.scaling_2gpu` for two GPUs). With
several GPUs the pool runs each engine in its own process, as `chorus serve` does.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.metrics import emit_report


def run(checkpoint: str, devices: str, dtype: str, n: int, max_batch_size: int, max_packed_tokens: int) -> dict:
    import torch

    from bench.engine_bench import Sink, to_request
    from bench.mixes import audio_seconds, plain_mix
    from server.config import EngineSettings
    from server.engine.runtime.pool import EnginePool

    settings = EngineSettings(device=devices, dtype=dtype, max_batch_size=max_batch_size,
                              max_packed_tokens=max_packed_tokens)
    pool = EnginePool.load(checkpoint, settings)
    pool.start()
    try:
        warm = Sink()
        for spec in plain_mix(8 * len(pool.engines), seed=99):
            warm.submit(pool, to_request(spec))
        warm.wait([s.request_id for s in plain_mix(8 * len(pool.engines), seed=99)], 300)
        specs = plain_mix(n, seed=0)
        sink = Sink()
        t0 = time.perf_counter()
        for spec in specs:
            sink.submit(pool, to_request(spec))
        ok = sink.wait([s.request_id for s in specs], 600)
        wall = time.perf_counter() - t0
        secs = audio_seconds(specs)
        return {
            "devices": devices, "engines": len(pool.engines), "requests": n, "completed_in_time": ok,
            "outcomes": sink.outcomes([s.request_id for s in specs]), "audio_seconds": round(secs, 2),
            "wall_s": round(wall, 3), "audio_s_per_s": round(secs / wall, 2),
            "steps_per_engine": [e.stats().steps_total for e in pool.engines],
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        }
    finally:
        pool.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--devices", nargs="+", default=["cuda:0", "cuda:0,1"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-packed-tokens", type=int, default=32768)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs = [run(args.checkpoint, d, args.dtype, args.requests, args.max_batch_size, args.max_packed_tokens)
            for d in args.devices]
    from server.cli.checkout import git_commit

    scaling = round(runs[-1]["audio_s_per_s"] / runs[0]["audio_s_per_s"], 3) if len(runs) > 1 else None
    result = {"summary": {"scaling_2gpu": scaling if runs[-1]["engines"] == 2 else None,
                          "gpu": (runs[-1]["gpus"] or [None])[0], "commit": git_commit()},
              "command": "python -m bench.pool_bench " + " ".join(sys.argv[1:] if argv is None else argv),
              "runs": runs, "scaling": scaling}
    emit_report(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
