"""A poisoned request on the GPU fails alone, and the engine keeps serving.

`python -m bench.poison --checkpoint DIR [--out FILE]` (CUDA): knob values the arithmetic of a
step cannot survive (a layer penalty that overflows float32, a denormal position temperature,
a guidance scale past float32's range) are refused by validation, so here validation is
switched off to hand them to the engine as if a bug had let them through. They share steps
with ordinary requests. Before the engine's own guards, such a request indexed out of range
inside the step: on a GPU a device-side assert, after which every CUDA call of the process
fails. The run checks that each poisoned request ends with `error` raised by the step's guard
(not by decoding tokens that were never valid), that two other extremes end one way or the
other, that the bystanders in the same steps finish with audio, and that the engine serves a
new request afterwards.
"""

from __future__ import annotations

import argparse
import sys
import time
from unittest import mock

# Values that make every score of the request non-finite: it cannot produce tokens and must fail.
POISON = {
    "layer_penalty_factor": {"layer_penalty_factor": 1e39},
    "position_temperature": {"position_temperature": 1e-41},
}
# Extremes the arithmetic may or may not survive: each must end (done or error), harming no one.
EXTREME = {
    "guidance_scale": {"guidance_scale": 3e38},
    "class_temperature": {"class_temperature": 1e-42},
}


def run(checkpoint: str, dtype: str, device: str = "cuda") -> dict:
    import random

    import torch

    from bench.engine_bench import Sink
    from bench.mixes import make_text
    from server.checkout import git_commit
    from server.config import EngineSettings
    from server.engine.runtime.loop import EngineLoop
    from server.engine.types import GenerationOptions, SynthesisRequest

    engine = EngineLoop.load(checkpoint, EngineSettings(device=device, dtype=dtype, max_batch_size=64,
                                                        max_packed_tokens=32768))
    engine.start()
    rng = random.Random(5)
    try:
        sink = Sink()
        bystanders = [SynthesisRequest(f"ok{i}", make_text(rng, 6.0), options=GenerationOptions(duration=6.0, seed=i))
                      for i in range(6)]
        poisoned = [SynthesisRequest(f"poison-{name}", make_text(rng, 6.0),
                                     options=GenerationOptions(duration=6.0, seed=9, **knobs))
                    for name, knobs in POISON.items()]
        extreme = [SynthesisRequest(f"extreme-{name}", make_text(rng, 6.0),
                                    options=GenerationOptions(duration=6.0, seed=9, **knobs))
                   for name, knobs in EXTREME.items()]
        with mock.patch("server.engine.planning.request.validate_options", lambda opts: None):
            for request in bystanders[:3] + poisoned + extreme + bystanders[3:]:
                sink.submit(engine, request)
        ids = [r.request_id for r in bystanders + poisoned + extreme]
        finished = sink.wait(ids, 120)
        after = SynthesisRequest("after", make_text(rng, 10.0), options=GenerationOptions(duration=10.0, seed=1))
        t0 = time.perf_counter()
        sink.submit(engine, after)
        served_after = sink.wait(["after"], 60) and sink.finished["after"].outcome == "done"
        after_ms = (time.perf_counter() - t0) * 1e3
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # a device-side assert would surface here at the latest
        outcomes = {rid: sink.finished[rid].outcome if rid in sink.finished else "missing" for rid in ids}
        messages = {r.request_id: sink.finished[r.request_id].message for r in poisoned + extreme
                    if r.request_id in sink.finished}
        # failed in the step, by the engine's guard; not later, on tokens that were never valid
        guarded = all(outcomes[r.request_id] == "error" and "decoding" not in (messages[r.request_id] or "")
                      for r in poisoned)
        failed_alone = (guarded and all(outcomes[r.request_id] in ("done", "error") for r in extreme)
                        and all(outcomes[r.request_id] == "done" for r in bystanders))
        bystander_audio = {r.request_id: sink.audio_samples[r.request_id] for r in bystanders}
        return {
            "summary": {"poisoned_failed_alone": failed_alone, "engine_served_after": bool(served_after),
                        "all_finished": finished,
                        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None, "dtype": dtype,
                        "commit": git_commit()},
            "outcomes": outcomes, "poisoned_messages": messages, "bystander_audio_samples": bystander_audio,
            "after_request_ms": round(after_ms, 1),
        }
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    from bench.metrics import emit_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = run(args.checkpoint, args.dtype, args.device)
    result["command"] = "python -m bench.poison " + " ".join(sys.argv[1:] if argv is None else argv)
    emit_report(result, args.out)
    s = result["summary"]
    return 0 if s["poisoned_failed_alone"] and s["engine_served_after"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
