"""`chorus bench`: the reference and Chorus, one process, one GPU, the same seeded requests.

Builds (or reuses) a full-size random checkpoint, loads it through the reference's own
`from_pretrained`, and runs the scenarios of docs/performance.md in order of cost, writing the
result document after each one (so a run cut short still leaves what it measured), then
prints it. Weights are random: the numbers are speed and parity, never quality.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.metrics import build_summary
from server.cli.checkout import git_commit

log = logging.getLogger("chorus.bench")

SCENARIOS = ("parity", "forward", "profile", "engine_single", "timeline", "finite_check", "engine_throughput", "long",
             "fp8", "tokens",
             "reference_single", "reference_throughput", "mixed", "loaded", "ws_single", "ws_long", "ws_throughput",
             "ws_loaded")
FAST_START_SECONDS = 2.0  # the demo page's fast start
WS_SCENARIOS = tuple(s for s in SCENARIOS if s.startswith("ws_"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chorus bench", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the result JSON here (and print it)")
    p.add_argument("--checkpoint", default=None, help="full-size checkpoint folder (made there if missing; "
                   "default: a temporary folder)")
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default="bfloat16")
    p.add_argument("--scenarios", default=",".join(s for s in SCENARIOS if s != "finite_check"),
                   help="comma-separated subset of: " + ", ".join(SCENARIOS))
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference-batch", type=int, default=16, help="requests per reference generate() call")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-packed-tokens", type=int, default=32768)
    p.add_argument("--loaded-seconds", type=float, default=60.0)
    p.add_argument("--no-graphs", action="store_true", help="run the fused backbone without CUDA graphs")
    p.add_argument("--graph-max-tokens", type=int, default=8192, choices=(1024, 2048, 4096, 8192),
                   help="the engine's and the server's CUDA graph limit (`chorus serve --graph-max-tokens`); "
                        "a bucket of the server's packed-tokens histogram, so ws_loaded can say what share of "
                        "steps ran beyond it (--no-graphs: none)")
    p.add_argument("--time-budget", type=float, default=1e9, help="skip scenarios once this many seconds passed")
    p.add_argument("--commit", default=os.environ.get("CHORUS_COMMIT"), help="git commit measured (default: git)")
    return p


def _meta(args, argv) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def ver(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "commit": git_commit(args.commit),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "dtype": args.dtype,
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "chorus bench " + " ".join(argv),
        "python": platform.python_version(),
        "versions": {n: ver(n) for n in ("torch", "transformers", "flashinfer-python", "omnivoice")},
        "cuda": torch.version.cuda,
        "settings": {"requests": args.requests, "seed": args.seed, "reference_batch": args.reference_batch,
                     "max_batch_size": args.max_batch_size, "max_packed_tokens": args.max_packed_tokens,
                     "graphs": not args.no_graphs, "graph_max_tokens": args.graph_max_tokens, "num_step": 32,
                     "guidance_scale": 2.0},
    }


class Run:
    """The result document, written after every scenario."""

    def __init__(self, args, argv):
        self.args = args
        self.t0 = time.perf_counter()
        self.doc: dict = {"summary": None, "meta": _meta(args, argv), "errors": {}, "skipped": [], "timings_s": {}}
        self.wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        unknown = set(self.wanted) - set(SCENARIOS)
        if unknown:
            raise SystemExit(f"unknown scenarios: {', '.join(sorted(unknown))}")

    def put(self, path: tuple, value) -> None:
        d = self.doc
        for key in path[:-1]:
            d = d.setdefault(key, {})
        d[path[-1]] = value
        self.save()

    def save(self) -> None:
        self.doc["summary"] = build_summary(self.doc)
        if self.args.out:
            out = Path(self.args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".partial")
            tmp.write_text(json.dumps(self.doc, indent=1, default=str))
            tmp.replace(out)

    def scenario(self, name: str, path: tuple, fn) -> object:
        if name not in self.wanted:
            return None
        if time.perf_counter() - self.t0 > self.args.time_budget:
            self.doc["skipped"].append(name)
            log.warning("skipping %s: time budget spent", name)
            self.save()
            return None
        log.info("scenario %s ...", name)
        t = time.perf_counter()
        try:
            value = fn()
        except Exception:  # record and go on with the next scenario
            self.doc["errors"][name] = traceback.format_exc()
            log.exception("scenario %s failed", name)
            value = None
        else:
            self.put(path, value)
        self.doc["timings_s"][name] = round(time.perf_counter() - t, 1)
        self.save()
        return value


def _profiles(model) -> dict:
    from bench.diagnose import profile_forward
    from bench.parity import random_items
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone

    c = model.llm.config
    fi = FlashInferAttention(model.device, model.audio_heads.weight.dtype, c.head_dim ** -0.5,
                             c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    out = {}
    # (requests, target frames, graphs, fused q/k): a fast-start first chunk (50 frames), a
    # lone 10 s line, three of them (the loaded regime's step), and the large eager steps
    cases = ((1, 50, True, None), (1, 250, True, None), (3, 250, True, None), (1, 250, False, None),
             (16, 250, False, None), (64, 250, False, None), (64, 250, False, False))
    for n, frames, graphs, fuse in cases:
        items = random_items(model, [(26, frames, 2.0)] * n, seed=n, device=model.device)
        canvas = build_packed_canvas(items, model.device)
        backbone = FusedBackbone(model, fi, graphs=graphs, fuse_qk_rope=fuse)  # captures its one graph
        name = f"{n}_requests_{'graph' if graphs else 'eager'}_{backbone.qk_rope_kernel}_qk_rope"
        out[name if frames == 250 else f"{name}_{frames}_frames"] = profile_forward(backbone, canvas)
    from bench.diagnose import profile_decode
    from server.engine.model.codec import Codec

    codec = Codec(model)  # with its Snake kernels where they pass their check, as the engine's
    for seconds in (2.0, 10.0):
        out[f"decode_{seconds:g}s"] = profile_decode(codec, seconds)
    return out


def _finite_runs(engine, tap, model, specs) -> dict:
    """The throughput mix with a finiteness check after every step (in `tap`, the engine's
    backbone), PDL as FlashInfer chooses, then with PDL off in the eager kernels (captured
    graphs keep theirs)."""
    from bench.diagnose import FiniteCheck
    from bench.engine_bench import run_mix

    out = {}
    ops = getattr(tap.inner, "ops", None)
    for label, pdl in (("pdl_default", None), ("pdl_off", False)):
        if ops is not None and hasattr(ops, "pdl"):
            ops.pdl = pdl
        check = FiniteCheck(tap, model)
        try:
            mix = run_mix(engine, specs, timed=False)
        finally:
            check.restore()
        out[label] = {"check": check.report(), "outcomes": mix["outcomes"], "errors": mix["errors"],
                      "audio_s_per_s_with_checks": mix["audio_s_per_s"]}
    if ops is not None and hasattr(ops, "pdl"):
        ops.pdl = None
    # one 10 s request at a time: every step a small graphed one
    import random

    from bench.engine_bench import Sink, to_request
    from bench.mixes import RequestSpec, make_text

    check = FiniteCheck(tap, model)
    rng = random.Random(17)
    sink = Sink()
    try:
        for i in range(40):
            spec = RequestSpec(f"seq{i:03d}", make_text(rng, 10.0), 10.0)
            sink.submit(engine, to_request(spec))
            sink.wait([spec.request_id], 30)
    finally:
        check.restore()
    ids = [f"seq{i:03d}" for i in range(40)]
    out["sequential_10s"] = {"check": check.report(), "outcomes": sink.outcomes(ids), "errors": sink.errors(ids)}
    return out


def _fp8_runs(model, settings, specs) -> dict:
    """A second engine whose projections run in FP8 (same weights, quantised): the 256 mix, then a
    lone 10 s line (every step a small graphed one), what a user who picks FP8 for speed gets."""
    from dataclasses import replace

    from bench import engine_bench as eb
    from bench.observers import bench_engine

    engine = bench_engine(model, replace(settings, quantize="fp8"), "bench-fp8", random_checkpoint=True)
    engine.start()
    try:
        eb.run_mix(engine, specs[:32], timed=False)  # warm-up
        return {"throughput_256": eb.run_mix(engine, specs), "single_10s": eb.single(engine)}
    finally:
        engine.stop()


def _server_scenarios(run: Run, ckpt: Path, specs, engine_throughput: dict | None) -> None:
    """The WebSocket scenarios, against a `chorus serve` started here with the engine's settings."""
    from bench import ws_bench as ws
    from server.cli.launcher import ServerProcess

    args = run.args
    work = Path(tempfile.mkdtemp(prefix="chorus-bench-serve-"))
    serve = ["--model", str(ckpt), "--device", "cuda", "--dtype", args.dtype, "--max-batch-size",
             str(args.max_batch_size), "--max-packed-tokens", str(args.max_packed_tokens),
             "--max-queue", str(2 * args.requests), "--max-inflight", str(max(16, args.requests // 16)),
             "--graph-max-tokens", str(0 if args.no_graphs else args.graph_max_tokens)]
    t = time.perf_counter()
    server = ServerProcess(["--voices-dir", str(work / "voices"), "--log-level", "warning", *serve],
                           work / "server.log").start()
    url = server.url
    run.put(("server", "start_seconds"), round(time.perf_counter() - t, 1))
    url = url.replace("http://", "ws://") + "/v1/stream"
    try:
        run.scenario("ws_single", ("server", "single_10s"), lambda: ws.run(ws.single(url)))
        run.scenario("ws_single", ("server", "single_10s_fresh_lengths"),
                     lambda: ws.run(ws.single(url, fresh_lengths=True)))
        # the model source of word timestamps, in the same run: its cost beside the line above
        run.scenario("ws_single", ("server", "single_10s_word_timestamps"),
                     lambda: ws.run(ws.single(url, timestamps="word")))
        run.scenario("ws_long", ("server", "long_60s"), lambda: ws.run(ws.long(url)))
        run.scenario("ws_long", ("server", "long_60s_fast_start"),
                     lambda: ws.run(ws.long(url, first_chunk_seconds=FAST_START_SECONDS)))
        thr = run.scenario("ws_throughput", ("server", "throughput_256"), lambda: ws.run(ws.throughput(url, specs)))
        run.scenario("ws_throughput", ("server", "throughput_256_word_timestamps"),
                     lambda: ws.run(ws.throughput(url, specs, timestamps="word")))
        base = (thr or engine_throughput or {}).get("audio_s_per_s")
        if base:
            run.scenario("ws_loaded", ("server", "loaded"),
                         lambda: ws.run(ws.loaded(url, base, duration_s=args.loaded_seconds,
                                                  graph_max_tokens=0 if args.no_graphs else args.graph_max_tokens)))
    finally:
        server.stop(timeout=60)  # SIGTERM, then kill if the drain hangs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("transformers", "huggingface_hub", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import torch

    if not torch.cuda.is_available():
        print("chorus bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from bench import engine_bench as eb, forward as fw, timeline
    from bench.diagnose import BackboneTap
    from bench.mixes import mixed_knobs_mix, plain_mix
    from bench.observers import bench_engine
    from server.checkpoint import load_omnivoice, make_checkpoint
    from server.config import EngineSettings
    from server.engine.model.runner import backbone_for
    from server.engine.runtime.loop import EngineLoop

    run = Run(args, argv)
    torch.set_grad_enabled(False)

    ckpt = Path(args.checkpoint or Path(tempfile.gettempdir()) / "chorus-bench-full-seed0")
    t = time.perf_counter()
    if not (ckpt / "config.json").is_file():
        make_checkpoint("full", ckpt, seed=0)
    run.put(("checkpoint",), {"path_kind": "given" if args.checkpoint else "temporary",
                              "seconds": round(time.perf_counter() - t, 1)})

    other = "float16" if args.dtype == "bfloat16" else "bfloat16"
    models = {}
    t = time.perf_counter()
    models[args.dtype] = load_omnivoice(str(ckpt), "cuda", args.dtype)
    run.doc["timings_s"]["load_model"] = round(time.perf_counter() - t, 1)

    if "parity" in run.wanted or "tokens" in run.wanted:
        models[other] = load_omnivoice(str(ckpt), "cuda", other)
    if "parity" in run.wanted:
        models["float32"] = load_omnivoice(str(ckpt), "cuda", "float32")
        parity = run.scenario("parity", ("parity",), lambda: fw.parity(models, [args.dtype, other], args.seed))
        if parity and fw.fp8_fidelity(parity):
            run.put(("fp8", "fidelity"), fw.fp8_fidelity(parity))
        del models["float32"]
        torch.cuda.empty_cache()

    model = models[args.dtype]
    run.scenario("forward", ("forward",), lambda: fw.speed(model))

    if "profile" in run.wanted:
        from bench import diagnose as dg

        run.scenario("profile", ("diagnostics", "profile"), lambda: _profiles(model))
        for dt in (args.dtype, other):
            if dt in models:
                run.scenario("profile", ("diagnostics", "reference_self_agreement", dt),
                             lambda: dg.reference_self_agreement(models[dt]))

    settings = EngineSettings(device="cuda", dtype=args.dtype, max_batch_size=args.max_batch_size,
                              max_packed_tokens=args.max_packed_tokens, attention="auto",
                              graph_max_tokens=args.graph_max_tokens)
    # the backbone behind a tap, where the finiteness check runs for its scenario
    backbone = backbone_for(model, settings.attention, settings.quantize, settings.graph_max_tokens)
    tap = BackboneTap(backbone)
    engine = bench_engine(model, settings, "bench", backbone=tap, model_name="omnivoice-random",
                          random_checkpoint=True)
    run.put(("engine", "backbone"), {"class": type(backbone).__name__,
                                     "qk_rope_kernel": getattr(backbone, "qk_rope_kernel", None),
                                     "qk_rope_check_error": getattr(backbone, "qk_rope_check_error", None),
                                     "embed_order": getattr(backbone, "embed_order", None),
                                     "embed_check": getattr(backbone, "embed_check", None),
                                     "small_attention_check_error": getattr(getattr(backbone, "attention", None),
                                                                            "small_check_error", None)})
    if args.no_graphs and hasattr(backbone, "graphs_enabled"):
        backbone.graphs_enabled = False
    if getattr(backbone, "graphs_enabled", False):  # captured as the engine was made, all buckets
        run.put(("engine", "graph_capture"), {"graphs": len(backbone.graphs.captured),
                                             "seconds": round(backbone.graphs.capture_seconds, 2),
                                             "gpu_mem_gib_after": round(torch.cuda.memory_allocated() / 2**30, 2)})
    engine.start()
    try:
        specs = plain_mix(args.requests, args.seed)
        run.scenario("engine_single", ("engine", "single_10s"), lambda: eb.single(engine))
        run.scenario("timeline", ("diagnostics", "timeline"), lambda: timeline.run(engine))
        if "profile" in run.wanted:
            from bench import diagnose as dg

            run.scenario("profile", ("diagnostics", "request_profile"), lambda: dg.profile_requests(engine))
        run.scenario("finite_check", ("diagnostics", "finite_check"), lambda: _finite_runs(engine, tap, model, specs))
        thr = run.scenario("engine_throughput", ("engine", "throughput_256"), lambda: eb.run_mix(engine, specs))
        run.scenario("long", ("engine", "long_60s"), lambda: eb.long_text(engine))
        if "fp8" in run.wanted and args.dtype == "bfloat16":
            def fp8_runs():
                runs = _fp8_runs(model, settings, specs)
                run.put(("fp8", "single_10s"), runs["single_10s"])
                return runs["throughput_256"]

            run.scenario("fp8", ("fp8", "throughput_256"), fp8_runs)
        if any(name in run.wanted for name in WS_SCENARIOS):  # before the long reference runs: the time
            _server_scenarios(run, ckpt, specs, thr)            # budget must not skip what clients see
        run.scenario("tokens", ("token_agreement", args.dtype), lambda: eb.token_agreement(model, engine))
        if "tokens" in run.wanted and other in models:
            engine2 = EngineLoop(models[other], EngineSettings(device="cuda", dtype=other, attention="auto"),
                                 "bench2", random_checkpoint=True)
            engine2.start()
            try:
                run.scenario("tokens", ("token_agreement", other), lambda: eb.token_agreement(models[other], engine2))
            finally:
                engine2.stop()
        models.pop(other, None)
        torch.cuda.empty_cache()
        run.scenario("reference_single", ("reference", "single_10s"), lambda: eb.reference_single(model))
        run.scenario("reference_throughput", ("reference", "throughput_256"),
                     lambda: eb.reference_mix(model, specs, args.reference_batch))
        voice = eb.random_voice()
        run.scenario("mixed", ("engine", "mixed_knobs"),
                     lambda: eb.run_mix(engine, mixed_knobs_mix(args.requests, args.seed), voice=voice, timed=False))
        if thr:
            run.scenario("loaded", ("engine", "loaded"),
                         lambda: eb.loaded(engine, thr["audio_s_per_s"], duration_s=args.loaded_seconds))
    finally:
        engine.stop()
    run.doc["timings_s"]["total"] = round(time.perf_counter() - run.t0, 1)
    run.doc["peak_gpu_mem_gib_process"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    run.save()
    print(json.dumps(run.doc, indent=1, default=str))
    return 0 if not run.doc["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
