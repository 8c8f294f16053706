"""Diagnostics that cost syncs (never part of a timed scenario).

- `FiniteCheck` runs in the engine's backbone (a `BackboneTap` the bench engine was made with):
  after every step it checks the logits for non-finite rows and, when it finds some, recomputes
  the same canvas every other way (the same path again, eager, the reference modules with torch
  attention, the reference forward, the culprit item alone) so the record says whose numbers
  went bad.
- `profile_forward` groups the CUDA kernels of a packed forward by kind; `profile_requests`
  those of whole lone requests (steps, head, sampler, decode) as the engine runs them.
- `profile_decode` says where a chunk's codec decode goes: wall time against kernel time and
  launches, and the operators that cost the host most (a lone line's first audio waits for it).
- `reference_self_agreement` is the yardstick for token agreement: the reference's tokens
  for the same requests batched and alone.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import numpy as np
import torch

from bench.parity import reference_target_logits
from server.engine.model.canvas import build_packed_canvas

log = logging.getLogger("chorus.bench")


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


class BackboneTap:
    """A backbone that runs the one it wraps, or the check attached to it now (`FiniteCheck`):
    what a bench engine is made with (`EngineLoop(..., backbone=)`) so a diagnostic can run in
    its steps for a while. Everything else is the wrapped backbone's."""

    def __init__(self, inner):
        self.inner = inner
        self.check: FiniteCheck | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, canvas):
        check = self.check
        return self.inner(canvas) if check is None else check(canvas)


class FiniteCheck:
    def __init__(self, tap: BackboneTap, model, limit: int = 6):
        from server.engine.kernels.attention.torch_backend import TorchAttention
        from server.engine.model.backbone import OmniVoiceBackbone
        from server.engine.model.fused_backbone import FusedBackbone

        self.tap, self.model, self.limit = tap, model, limit
        self.inner = tap.inner
        head_dim = self.inner.head_dim
        self.modules_torch = OmniVoiceBackbone(model, TorchAttention(head_dim ** -0.5))
        self.eager = FusedBackbone(model, self.inner.attention, self.inner.ops, graphs=False) \
            if isinstance(self.inner, FusedBackbone) else None
        self.steps = self.bad_steps = 0
        self.events: list[dict] = []
        tap.check = self

    def restore(self) -> None:
        self.tap.check = None

    def __call__(self, canvas):
        from server.engine.model.cuda_graphs import choose_bucket

        logits = self.inner(canvas)
        self.steps += 1
        bad = ~torch.isfinite(logits).flatten(1).all(1)
        if not bool(bad.any()):
            return logits
        self.bad_steps += 1
        if len(self.events) >= self.limit:
            return logits
        bad_items = []
        rows = bad.nonzero().flatten().tolist()
        for i, item in enumerate(canvas.items):
            cs = canvas.cond_offsets[i]
            us = canvas.uncond_offsets[i]
            spans = [(cs, cs + item.target_len)] + ([(us, us + item.target_len)] if us is not None else [])
            if any(a <= r < b for r in rows for a, b in spans):
                bad_items.append(i)
        ev = {
            "step": self.steps, "tokens": canvas.total_len, "documents": len(canvas.doc_lens),
            "doc_lens": canvas.doc_lens, "bucket": choose_bucket(canvas.total_len, len(canvas.doc_lens))
            if getattr(self.inner, "graphs_enabled", False) else None,
            "bad_rows": len(rows), "target_rows": int(logits.shape[0]), "bad_items": bad_items,
        }
        try:
            again = self.inner(canvas)
            ev["same_path_again_finite"] = _finite(again)
            good = ~bad
            ev["same_path_again_equal_on_good_rows"] = bool(torch.equal(again[good], logits[good]))
            if self.eager is not None:
                ev["eager_finite"] = _finite(self.eager(canvas))
            ev["modules_torch_finite"] = _finite(self.modules_torch(canvas))
            ev["reference_forward_finite"] = _finite(reference_target_logits(self.model, canvas))
            if bad_items:
                alone = build_packed_canvas([canvas.items[bad_items[0]]], canvas.packed_ids.device)
                ev["first_bad_item_alone"] = {
                    "fused_finite": _finite(self.inner(alone)),
                    "reference_forward_finite": _finite(reference_target_logits(self.model, alone)),
                    "prefix_len": canvas.items[bad_items[0]].prefix_len,
                    "target_len": canvas.items[bad_items[0]].target_len,
                }
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not kill the run
            ev["check_error"] = repr(exc)
        log.warning("non-finite logits: %s", ev)
        self.events.append(ev)
        return logits

    def report(self) -> dict:
        return {"steps": self.steps, "bad_steps": self.bad_steps, "events": self.events}


def _kind(name: str) -> str:
    n = name.lower()
    for kind, keys in (
        # a whole request's: the sampler's kernels and the codec's (convolutions, transposes, Snake)
        ("sampler", ("cfg_scores", "position_keys", "topk", "sortkv", "bitonicsort")),
        ("decode", ("snake", "fprop", "dgrad", "nchwtonhwc", "nhwctonchw", "cudnn")),
        ("qk_norm_rope", ("qk_norm_rope",)),
        ("attention", ("prefillwith", "batchprefill", "fmha", "flash_fwd", "attention")),
        ("rope", ("rotary", "rope")),
        ("rmsnorm", ("rmsnorm",)),
        ("silu_and_mul", ("act_and_mul", "silu")),
        ("gemm", ("nvjet", "gemm", "xmma", "cutlass", "cublas")),
        ("embed_gather", ("embedding", "index", "gather")),
    ):
        if any(k in n for k in keys):
            return kind
    return "other"


def _device_kernels(averages) -> tuple[list[tuple[float, str, int]], dict[str, float]]:
    """The kernels with device time in a profiler's `key_averages()`: (total us, name, calls),
    largest first, and their total us by kind."""
    kernels: list[tuple[float, str, int]] = []
    by_kind: dict[str, float] = defaultdict(float)
    for evt in averages:
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0) or 0
        if t > 0:
            by_kind[_kind(evt.key)] += t
            kernels.append((t, evt.key[:120], evt.count))
    kernels.sort(reverse=True)
    return kernels, by_kind


def profile_forward(backbone, canvas, iters: int = 5) -> dict:
    """Kernels of the backbone's forward (replayed graph or eager) by kind and by name, with
    the forward's wall time beside them: kernel time close to the wall time says the forward
    is bound by its kernels, not by launches or host work."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        backbone(canvas)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(4 * iters):
        backbone(canvas)
    end.record()
    end.synchronize()
    wall_ms = start.elapsed_time(end) / (4 * iters)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            backbone(canvas)
        torch.cuda.synchronize()
    kernels, by_kind = _device_kernels(prof.key_averages())
    total = sum(by_kind.values()) or 1.0
    return {
        "tokens": canvas.total_len,
        "wall_ms_per_forward": round(wall_ms, 3),
        "gpu_ms_per_forward": round(total / iters / 1e3, 3),
        "kernels_per_forward": sum(count for _, _, count in kernels) // iters,
        "share_by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "ms_by_kind": {k: round(v / iters / 1e3, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"ms_per_forward": round(t / iters / 1e3, 3), "calls_per_forward": c // iters,
                         "us_per_call": round(t / max(c, 1), 2), "name": n} for t, n, c in kernels[:12]],
    }


def kernel_table(averages, runs: int, top: int = 40) -> dict:
    """A profiler's `key_averages()` as GPU time per run: in total, by kind, and the `top`
    kernels by name (calls and microseconds a run, microseconds a call)."""
    kernels, by_kind = _device_kernels(averages)
    return {
        "gpu_ms": round(sum(t for t, _, _ in kernels) / runs / 1e3, 3),
        "launches": round(sum(c for _, _, c in kernels) / runs),
        "ms_by_kind": {k: round(v / runs / 1e3, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"us": round(t / runs, 1), "calls": round(c / runs, 1), "us_per_call": round(t / max(c, 1), 2),
                         "name": name} for t, name, c in kernels[:top]],
    }


def profile_requests(engine, runs: int = 3, warmup: int = 2, seed: int = 0) -> dict:
    """Every CUDA kernel of whole lone requests by name and kind, per request: a 10 s line and
    a 2 s one (a fast-start first chunk's size), each alone on the engine. Beside
    `profile_forward` this shows what a step costs beyond its forward (the head, the sampler,
    the canvas's copies) and where a chunk's decode goes, as the engine runs them."""
    import random

    from torch.profiler import ProfilerActivity, profile

    from bench.mixes import make_text
    from bench.timeline import Timeline
    from server.engine.types import GenerationOptions, SynthesisRequest

    if engine.device.type != "cuda":
        return {"skipped": "needs CUDA"}
    timeline = Timeline(engine)  # its run_one waits for each request to end
    out: dict = {}
    try:
        for seconds in (10.0, 2.0):
            text = make_text(random.Random(seed + 3), seconds)

            def request(i, seconds=seconds, text=text):
                return SynthesisRequest(f"profile-{seconds:g}s-{i}", text, progress=False,
                                        options=GenerationOptions(duration=seconds))

            for i in range(warmup):
                timeline.run_one(request(i))
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(runs):
                    timeline.run_one(request(warmup + i))
                torch.cuda.synchronize()
            out[f"line_{seconds:g}s"] = kernel_table(prof.key_averages(), runs)
    finally:
        timeline.restore()
    return out


def profile_decode(codec, seconds: float = 10.0, iters: int = 5, seed: int = 0) -> dict:
    """One chunk of `seconds` decoded `iters` times: wall ms, and per decode the device's kernel
    time and launches (CUDA) and the top-level operators by host time, with their counts."""
    from torch.profiler import ProfilerActivity, profile

    from bench.mixes import FRAME_RATE

    device = codec.model.audio_heads.weight.device
    gen = torch.Generator().manual_seed(seed)
    codebooks = codec.model.config.num_audio_codebook
    tokens = torch.randint(0, 1024, (codebooks, int(seconds * FRAME_RATE)), generator=gen).to(device)
    eager, wall_ms = _decode_wall_ms(codec, tokens, iters)  # on the default stream: always eager
    graphs = _decode_graph_timing(codec, tokens, eager, iters) if getattr(codec, "graphs", None) else {}
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            codec.decode(tokens)
    events = prof.events()
    kernels = [e for e in events if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
    top: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.cpu_parent is None and e.device_type == torch.autograd.DeviceType.CPU:
            top[e.name][0] += 1
            top[e.name][1] += e.cpu_time_total
    ops = sorted(top.items(), key=lambda kv: -kv[1][1])
    return {
        "seconds": seconds,
        "wall_ms": round(wall_ms, 3),
        **graphs,
        "kernel_ms": round(sum(e.device_time_total for e in kernels) / iters / 1e3, 3) if cuda else None,
        "kernel_launches": len(kernels) // iters if cuda else None,
        "host_operators": sum(n for n, _ in top.values()) // iters,
        "top_host_operators": [{"name": name, "calls": int(n) // iters, "host_ms": round(t / iters / 1e3, 3)}
                               for name, (n, t) in ops[:12]],
    }


def _decode_wall_ms(codec, tokens, iters: int, warmup: int = 3) -> tuple[np.ndarray, float]:
    """The last warm-up's audio and the mean wall ms of `iters` decodes after `warmup` (each
    call returns host audio, so each ends synchronised)."""
    for _ in range(warmup):
        audio = codec.decode(tokens)
    t0 = time.perf_counter()
    for _ in range(iters):
        codec.decode(tokens)
    return audio, (time.perf_counter() - t0) * 1e3 / iters


def _decode_graph_timing(codec, tokens, eager, iters: int) -> dict:
    """The same decode on a side stream, as the finisher's workers run it: its length
    bucket's graph replayed (captured on the first two calls where not warmed), against the
    exact-length eager decode (equal up to float rounding)."""
    with torch.cuda.stream(torch.cuda.Stream(tokens.device)):
        replayed, graph_ms = _decode_wall_ms(codec, tokens, iters)
    return {"graph_wall_ms": round(graph_ms, 3),
            "graph_max_abs_diff_vs_eager": float(np.abs(replayed - eager).max()),
            "eager_peak_abs": float(np.abs(eager).max())}


def reference_self_agreement(model, n: int = 4, seed: int = 5) -> dict:
    """Greedy reference tokens for n requests batched together vs each alone."""
    from bench.engine_bench import reference_tokens
    from bench.mixes import plain_mix

    specs = plain_mix(n, seed, 2.0, 12.0)
    greedy = dict(position_temperature=0.0, class_temperature=0.0)
    batched = reference_tokens(model, specs, **greedy)
    equal = total = 0
    per = {}
    for s in specs:
        alone = reference_tokens(model, [s], **greedy)[s.request_id]
        eq = int((alone == batched[s.request_id]).sum())
        per[s.request_id] = round(eq / alone.size, 4)
        equal += eq
        total += alone.size
    return {"requests": n, "fraction_equal": round(equal / max(total, 1), 4), "per_request": per}
