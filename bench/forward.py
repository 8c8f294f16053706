"""Forward-level measurements on the GPU: parity with the reference forward, speed, MFU."""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from bench.metrics import Arch, forward_flops, mfu
from bench.parity import compare, parity_canvas, random_items, reference_target_logits
from server.engine.model.canvas import build_packed_canvas

log = logging.getLogger("chorus.bench")


def cuda_ms(fn, warmup: int = 3, iters: int = 10) -> dict:
    """Median and spread of fn() in milliseconds, CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return {"median": round(times[len(times) // 2], 4), "min": round(times[0], 4), "max": round(times[-1], 4),
            "n": iters}


def parity(models: dict, dtypes: list[str], seed: int = 0) -> dict:
    """Each half-precision path's target logits against the same-dtype reference forward and
    against the float32 reference; the reference's own half-vs-float32 error is the yardstick."""
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.kernels.attention.torch_backend import TorchAttention
    from server.engine.model.backbone import OmniVoiceBackbone
    from server.engine.model.cuda_graphs import choose_bucket
    from server.engine.model.fused_backbone import FusedBackbone

    out: dict = {}
    ref32_model = models["float32"]
    arch = Arch.of(ref32_model)
    scale = arch.head_dim ** -0.5
    for dtype in dtypes:
        model = models[dtype]
        tdtype = model.audio_heads.weight.dtype
        fi = FlashInferAttention(model.device, tdtype, scale, arch.q_heads, arch.kv_heads, arch.head_dim)
        paths = {
            "fused_flashinfer": FusedBackbone(model, fi, graphs=False),
            "fused_flashinfer_graph": FusedBackbone(model, fi, graphs=True),
            "fused_flashinfer_separate_qk_rope": FusedBackbone(model, fi, graphs=False, fuse_qk_rope=False),
            "modules_flashinfer": OmniVoiceBackbone(model, fi),
            "modules_torch": OmniVoiceBackbone(model, TorchAttention(scale)),
        }
        if tdtype == torch.bfloat16 and torch.cuda.get_device_capability(model.device)[0] == 9:
            paths["fused_flashinfer_fp8"] = FusedBackbone(model, fi, graphs=False, quantize="fp8")
        rows = {}
        for case, n_items in (("mixed_6_items", 6), ("small_2_items", 2)):
            canvas = parity_canvas(model, seed + n_items, model.device, n_items=n_items)
            canvas32 = parity_canvas(ref32_model, seed + n_items, ref32_model.device, n_items=n_items)
            ref = reference_target_logits(model, canvas)
            ref32 = reference_target_logits(ref32_model, canvas32)
            case_rows = {"tokens": canvas.total_len, "documents": len(canvas.doc_lens),
                         "qk_rope_kernel": paths["fused_flashinfer"].qk_rope_kernel,
                         "graph_bucket": choose_bucket(canvas.total_len, len(canvas.doc_lens)),
                         "reference_vs_float32": compare(ref, ref32)}
            for name, backbone in paths.items():
                if name.endswith("graph") and case_rows["graph_bucket"] is None:
                    continue
                logits = backbone(canvas)
                torch.cuda.synchronize()
                case_rows[name] = {"vs_reference": compare(logits, ref), "vs_float32": compare(logits, ref32)}
                if name == "fused_flashinfer":
                    bf16_logits = logits
                if name == "fused_flashinfer_fp8":  # against the bf16 path it replaces
                    case_rows[name]["vs_fused_bf16"] = compare(logits, bf16_logits)
            # Pad rows must not touch real ones: the padded arithmetic equals the plain one.
            bucket = choose_bucket(canvas.total_len, len(canvas.doc_lens), (canvas.total_len + 512,),
                                   (len(canvas.doc_lens) + 3,), fine=())
            fused = paths["fused_flashinfer"]
            plain = fused.hidden_states(canvas)
            padded = fused.hidden_states_padded(canvas, bucket)
            case_rows["padding_max_abs_diff"] = float((plain.float() - padded.float()).abs().max())
            rows[case] = case_rows
            shown = {k: v.get("vs_reference", {}).get("rel_l2") if isinstance(v, dict) else v
                     for k, v in case_rows.items()}
            log.info("parity %s %s: %s", dtype, case, shown)
        out[dtype] = rows
    return out


def fp8_fidelity(parity_result: dict) -> dict | None:
    """FP8's target logits against bf16 (the fused path it replaces) and against float32, on
    the parity scenario's mixed step: relative L2 error and greedy (argmax) token agreement."""
    row = parity_result.get("bfloat16", {}).get("mixed_6_items", {}).get("fused_flashinfer_fp8")
    if row is None:
        return None
    bf16 = parity_result["bfloat16"]["mixed_6_items"]["fused_flashinfer"]
    return {
        "logit_rel_error_vs_bf16": round(row["vs_fused_bf16"]["rel_l2"], 5),
        "token_agreement_vs_bf16": round(row["vs_fused_bf16"]["argmax_agree"], 4),
        "logit_rel_error_vs_float32": round(row["vs_float32"]["rel_l2"], 5),
        "token_agreement_vs_float32": round(row["vs_float32"]["argmax_agree"], 4),
        "bf16_logit_rel_error_vs_float32": round(bf16["vs_float32"]["rel_l2"], 5),
        "bf16_token_agreement_vs_float32": round(bf16["vs_float32"]["argmax_agree"], 4),
    }


def speed(model, sizes=(1, 2, 4, 8, 16, 32, 64), seconds: float = 10.0, reference_sizes=(1, 8, 32),
          module_sizes=(1, 16)) -> dict:
    """Forward time of steps of n 10 s requests with CFG (n x ~530 tokens)."""
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.backbone import OmniVoiceBackbone
    from server.engine.model.cuda_graphs import choose_bucket
    from server.engine.model.fused_backbone import FusedBackbone

    arch = Arch.of(model)
    dtype = model.audio_heads.weight.dtype
    fi = FlashInferAttention(model.device, dtype, arch.head_dim ** -0.5, arch.q_heads, arch.kv_heads, arch.head_dim)
    eager = FusedBackbone(model, fi, graphs=False)
    separate = FusedBackbone(model, fi, graphs=False, fuse_qk_rope=False)
    graphed = FusedBackbone(model, fi, graphs=True)
    modules = OmniVoiceBackbone(model, fi)
    frames = int(seconds * 25)
    rows = []
    result: dict = {"rows": rows}
    for n in sizes:
        items = random_items(model, [(26, frames, 2.0)] * n, seed=n, device=model.device)
        canvas = build_packed_canvas(items, model.device)
        flops = forward_flops(canvas.doc_lens, int(canvas.tgt_index.numel()), arch)
        row = {"requests": n, "tokens": canvas.total_len, "documents": len(canvas.doc_lens),
               "target_rows": int(canvas.tgt_index.numel()), "gflop": round(flops / 1e9, 1)}
        t = cuda_ms(lambda: eager(canvas))
        row["fused_eager_ms"] = t["median"]
        row["fused_eager_tflops"] = round(flops / t["median"] / 1e9, 1)
        row["fused_eager_mfu"] = round(mfu(flops, t["median"] / 1e3), 4)
        row["qk_rope_kernel"] = eager.qk_rope_kernel
        if n in module_sizes + (64,):
            row["fused_eager_separate_qk_rope_ms"] = cuda_ms(lambda: separate(canvas))["median"]
        bucket = choose_bucket(canvas.total_len, len(canvas.doc_lens))
        if bucket is not None:
            t0 = time.perf_counter()
            graphed(canvas)
            torch.cuda.synchronize()
            row["graph_bucket"] = list(bucket)
            row["graph_first_call_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            row["fused_graph_ms"] = cuda_ms(lambda: graphed(canvas))["median"]
        # host time to enqueue one eager forward (the GPU starves when this exceeds the GPU time)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eager(canvas)
        row["fused_eager_host_enqueue_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        torch.cuda.synchronize()
        if n in module_sizes:
            row["modules_flashinfer_ms"] = cuda_ms(lambda: modules(canvas))["median"]
        if n in reference_sizes:
            row["reference_forward_padded_ms"] = cuda_ms(lambda: reference_target_logits(model, canvas), 2, 5)["median"]
        rows.append(row)
        log.info("speed %s", row)
    for row in rows:
        if row["tokens"] >= 8000 and "mfu_8k_tokens" not in result:
            result["mfu_8k_tokens"] = row["fused_eager_mfu"]
            result["mfu_8k_at_tokens"] = row["tokens"]
        if row["tokens"] >= 16000 and "mfu_16k_tokens" not in result:
            result["mfu_16k_tokens"] = row["fused_eager_mfu"]
        if row["tokens"] >= 32000 and "mfu_32k_tokens" not in result:
            result["mfu_32k_tokens"] = row["fused_eager_mfu"]
            result["mfu_32k_at_tokens"] = row["tokens"]
    # the two ceilings on this card, for the record
    a = torch.randn(8192, 8192, device=model.device, dtype=dtype)
    b = torch.randn(8192, 8192, device=model.device, dtype=dtype)
    gemm = cuda_ms(partial(torch.matmul, a, b), 3, 10)
    result["measured_gemm_tflops_8192"] = round(2 * 8192**3 / gemm["median"] / 1e9, 1)
    del a, b
    return result
