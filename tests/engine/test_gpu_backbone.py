"""GPU checks of the fused FlashInfer forward (skipped without CUDA and FlashInfer):
half-precision parity with the reference forward, graphs equal eager, plans reused."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def flashinfer_ok():
    from server.engine.kernels.attention.flashinfer_backend import FlashInferMissing, check_flashinfer

    try:
        check_flashinfer()
    except FlashInferMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def models(tiny_checkpoint, flashinfer_ok):
    """A small random OmniVoice with the real attention geometry (16 q / 8 kv heads of 128,
    the head size Chorus's prebuilt FlashInfer kernels are for), two layers, the tiny
    checkpoint's text tokenizer."""
    import dataclasses

    from transformers import AutoTokenizer

    from server.checkpoint import SPECS, build_omnivoice

    spec = dataclasses.replace(SPECS["tiny"], hidden_size=256, num_hidden_layers=2, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, intermediate_size=512)
    base = build_omnivoice(spec, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    out = {}
    for dt in ("float32", "float16", "bfloat16"):
        model = build_omnivoice(spec, seed=0)
        model.load_state_dict(base.state_dict())
        model = model.to("cuda", getattr(torch, dt)).eval()
        model.text_tokenizer = tokenizer
        out[dt] = model
    return out


def _fi(model, small_rows: int | None = None):
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention

    c = model.llm.config
    return FlashInferAttention(model.device, model.audio_heads.weight.dtype, c.head_dim ** -0.5,
                               c.num_attention_heads, c.num_key_value_heads, c.head_dim, small_rows=small_rows)


@pytest.mark.parametrize("small_rows", [0, 1 << 20])  # FlashInfer for every step; the Triton kernel for every step
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_parity_in_half_precision(models, dtype, small_rows):
    from bench.parity import compare, parity_canvas, reference_target_logits
    from server.engine.model.fused_backbone import FusedBackbone

    model, model32 = models[dtype], models["float32"]
    canvas = parity_canvas(model, 7, "cuda", n_items=6)
    ref32 = reference_target_logits(model32, parity_canvas(model32, 7, "cuda", n_items=6))
    ref = reference_target_logits(model, canvas)
    floor = compare(ref, ref32)["rel_l2"]  # the reference's own half-precision error
    fi = _fi(model, small_rows)
    assert (fi.small is not None) == (small_rows > 0)
    for graphs in (False, True):
        out = FusedBackbone(model, fi, graphs=graphs)(canvas)
        assert torch.isfinite(out).all()
        assert compare(out, ref32)["rel_l2"] < 1.5 * floor + 1e-4


def test_graph_replay_equals_eager_and_reuses_plans(models):
    from bench.parity import random_items
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.model.fused_backbone import FusedBackbone

    model = models["bfloat16"]
    fi = _fi(model)
    eager, graphed = FusedBackbone(model, fi, graphs=False), FusedBackbone(model, fi, graphs=True)
    for n in (1, 3, 1, 2):
        canvas = build_packed_canvas(random_items(model, [(5, 30 + 7 * n, 2.0)] * n, n, "cuda"), "cuda")
        a, b = eager(canvas), graphed(canvas)
        b2 = graphed(canvas)  # same layout again: the plan is reused
        assert torch.equal(b, b2)
        assert (a - b).abs().max() <= 0.05 * a.abs().max()
    assert graphed.stats.graph_steps == 8 and graphed.stats.captures


@pytest.mark.parametrize(("seed", "n_items", "splits"), [(10, 1, 4), (9, 1, 2), (5, 2, 2)])  # 85, 549, 557 rows
def test_split_projections_change_nothing_but_rounding(models, seed, n_items, splits):
    """Small steps split the O and down projections by default; the forward must stay as
    close to the unsplit one as the reference's half precision is to float32, graphed too."""
    from bench.parity import compare, parity_canvas, reference_target_logits
    from server.engine.kernels import split_k
    from server.engine.model.fused_backbone import FusedBackbone

    model = models["bfloat16"]
    canvas = parity_canvas(model, seed, "cuda", n_items=n_items)
    assert split_k.splits_for(canvas.total_len) == splits
    floor = compare(reference_target_logits(model, canvas),
                    reference_target_logits(models["float32"], parity_canvas(models["float32"], seed, "cuda",
                                                                               n_items=n_items)))["rel_l2"]
    unsplit = FusedBackbone(model, _fi(model), graphs=False, split_k=False)(canvas)
    for graphs in (False, True):
        backbone = FusedBackbone(model, _fi(model), graphs=graphs)
        assert backbone.split_k
        result = compare(backbone(canvas), unsplit)
        assert result["finite"] and result["rel_l2"] < floor, (result, floor)


def test_fp8_fused_activation_quantisation_changes_nothing_but_rounding(models):
    """With `--quantize fp8` the norms and the gate write e4m3 rows themselves; the forward
    must give what the unfused fp8 path (bf16 rows, then a quantising pass) gives, far
    closer than fp8 is to bf16, graphed or not."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("fp8 needs a Hopper GPU")
    from bench.parity import compare, parity_canvas
    from server.engine.model.fused_backbone import FusedBackbone

    model = models["bfloat16"]
    canvas = parity_canvas(model, 4, "cuda", n_items=4)
    bf16 = FusedBackbone(model, _fi(model), graphs=False)(canvas)
    unfused = FusedBackbone(model, _fi(model), graphs=False, quantize="fp8")
    unfused.fp8_fused = False
    reference = unfused(canvas)
    fp8_error = compare(reference, bf16)["rel_l2"]
    for graphs in (False, True):
        fused = FusedBackbone(model, _fi(model), graphs=graphs, quantize="fp8")
        assert fused.fp8_fused
        result = compare(fused(canvas), reference)
        assert result["finite"] and result["rel_l2"] < 0.1 * fp8_error, (result, fp8_error)


# In a fresh process, so that no earlier test has built any variant of the kernels.
FRESH_PROCESS_WARM_UP = textwrap.dedent("""
    import dataclasses, sys
    import torch
    from transformers import AutoTokenizer
    from bench.parity import random_items
    from server.checkpoint import SPECS, build_omnivoice
    from server.engine.kernels import embed_merge
    from server.engine.kernels import qk_norm_rope
    from server.engine.kernels import split_k
    from server.engine.kernels.attention import triton_backend as triton_attention
    from server.engine.model.canvas import build_packed_canvas
    from server.engine.kernels.attention.flashinfer_backend import FlashInferAttention
    from server.engine.model.fused_backbone import FusedBackbone

    def built():
        kernels = (embed_merge._embed_merge_kernel, qk_norm_rope._qk_norm_rope_kernel,
                   qk_norm_rope._qk_norm_rope_tokens_kernel, split_k._split_add_rmsnorm_kernel,
                   triton_attention._doc_attention_kernel, triton_attention._doc_attention_tma_kernel)
        # each device's cache entry starts with its dict of compiled kernels
        return {k.fn.__name__: sum(len(entry[0]) for entry in k.device_caches.values()) for k in kernels}

    def canvas_of(frames):  # two requests with CFG: about 3 * frames rows
        items = random_items(model, [(6, frames, 2.0), (4, frames // 2, 2.0)], frames, "cuda")
        return build_packed_canvas(items, "cuda")

    spec = dataclasses.replace(SPECS["tiny"], hidden_size=256, num_hidden_layers=2, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, intermediate_size=512)
    model = build_omnivoice(spec, seed=0).to("cuda", torch.bfloat16).eval()
    model.text_tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    c = model.llm.config
    fi = FlashInferAttention(model.device, torch.bfloat16, c.head_dim ** -0.5, c.num_attention_heads,
                             c.num_key_value_heads, c.head_dim)
    small = {}  # a row count that is a multiple of 16, and one that is not, below 1024
    for frames in range(110, 320, 3):
        canvas = canvas_of(frames)
        small.setdefault(canvas.total_len % 16 == 0, canvas)
        if len(small) == 2:
            break
    large = next(canvas for canvas in map(canvas_of, range(380, 500, 3)) if canvas.total_len % 16)
    assert len(small) == 2 and all(c.total_len < 1024 for c in small.values()) and 1024 <= large.total_len < 2000
    with torch.inference_mode():
        backbone = FusedBackbone(model, fi, graphs=False)
        assert backbone.embed_order and backbone.qk_rope_kernel == "triton" and backbone.split_k
        assert torch.isfinite(backbone(small[True])).all()  # a small step's program shapes built
        shaped = built()
        assert torch.isfinite(backbone(small[False])).all()
        assert built() == shaped, (shaped, built())  # no build for another row count
        assert backbone.warm_eager(2000)  # 2000 rows: a large step's program shapes
        warmed = built()
        assert warmed["_qk_norm_rope_tokens_kernel"] > shaped["_qk_norm_rope_tokens_kernel"], warmed
        assert torch.isfinite(backbone(large)).all()
        assert built() == warmed, (warmed, built())
        assert backbone.stats.eager_steps == 3
        graphed = FusedBackbone(model, fi, graphs=True, token_buckets=(128, 256))
        assert not graphed.warm_eager(200) and graphed.warm_eager(300)  # 200 rows replay a graph
    print("ok")
""")


def test_an_eager_step_after_the_warm_up_builds_no_kernel(tiny_checkpoint, flashinfer_ok):
    """No eager step builds a Triton kernel on a request's path (100-300 ms each with an empty
    kernel cache): the kernels are not specialised on a step's row count (steps of a multiple
    of 16 rows and of others share one build), and `warm_eager` runs a large step's kernels
    before traffic."""
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS_WARM_UP, str(tiny_checkpoint)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
