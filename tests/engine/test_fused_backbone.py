"""The fused packed forward on CPU (torch kernels): same logits as the reference forward,
padding for CUDA graphs leaves real rows untouched, the backbone factory's choices."""

from __future__ import annotations

import pytest
import torch

from bench.parity import compare, parity_canvas, random_items, reference_target_logits
from server.engine.kernels.attention.torch_backend import TorchAttention
from server.engine.kernels.layer_ops import TorchOps
from server.engine.model.backbone import OmniVoiceBackbone
from server.engine.model.backbones import make_backbone
from server.engine.model.canvas import build_packed_canvas
from server.engine.model.cuda_graphs import (
    GRAPH_DOC_BUCKETS,
    GRAPH_TOKEN_BUCKETS,
    bucket_grid,
    choose_bucket,
    pad_doc_lens,
    token_buckets_up_to,
)
from server.engine.model.fused_backbone import FusedBackbone


def _attention(model):
    return TorchAttention(model.llm.config.head_dim ** -0.5)


def test_fused_matches_reference_forward(reference_model):
    canvas = parity_canvas(reference_model, seed=3, device="cpu", n_items=5)
    ref = reference_target_logits(reference_model, canvas)
    out = FusedBackbone(reference_model, _attention(reference_model), TorchOps())(canvas)
    assert out.shape == ref.shape and out.dtype == torch.float32
    result = compare(out, ref)
    assert result["rel_l2"] < 1e-5 and result["argmax_agree"] == 1.0


def test_fused_matches_module_backbone_with_guidance_zero_items(reference_model):
    items = random_items(reference_model, [(3, 40, 0.0), (5, 70, 2.0), (2, 17, 0.0)], seed=1, device="cpu")
    canvas = build_packed_canvas(items, "cpu")
    a = FusedBackbone(reference_model, _attention(reference_model), TorchOps())(canvas)
    b = OmniVoiceBackbone(reference_model, _attention(reference_model))(canvas)
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_padding_to_a_graph_bucket_leaves_real_rows_unchanged(reference_model):
    canvas = parity_canvas(reference_model, seed=4, device="cpu", n_items=3)
    backbone = FusedBackbone(reference_model, _attention(reference_model), TorchOps())
    plain = backbone.hidden_states(canvas)
    for extra_tokens, extra_docs in ((1, 1), (7, 3), (300, 1), (64, 16)):
        bucket = (canvas.total_len + extra_tokens, len(canvas.doc_lens) + extra_docs)
        padded = backbone.hidden_states_padded(canvas, bucket)
        assert torch.allclose(plain, padded, atol=1e-6), bucket


def test_choose_bucket_fits_and_is_smallest():
    for total in (1, 100, 537, 1023, 1500, 2040):
        for docs in (1, 2, 5, 16, 32):
            bucket = choose_bucket(total, docs)
            if bucket is None:  # only when no bucket has room for the step plus pad documents
                assert all(d <= docs or total + (d - docs) > GRAPH_TOKEN_BUCKETS[-1] for d in GRAPH_DOC_BUCKETS)
                continue
            tokens, slots = bucket
            pad = pad_doc_lens(total, docs, bucket)
            assert len(pad) == slots - docs >= 1 and min(pad) >= 1 and total + sum(pad) == tokens
            smaller = [t for t in bucket_grid()[slots] if t < tokens]
            assert not smaller or smaller[-1] < total + (slots - docs)
    assert choose_bucket(GRAPH_TOKEN_BUCKETS[-1], 1) is None  # no room for a pad document
    assert choose_bucket(100, GRAPH_DOC_BUCKETS[-1]) is None


def test_fine_buckets_where_a_lone_request_steps_and_never_past_the_limit():
    assert choose_bucket(537, 2) == (544, 3)  # a lone 10 s line: 1% padding, not 7% (576)
    assert choose_bucket(1070, 4) == (1152, 5)  # two of them: not 1280
    assert choose_bucket(2140, 8) == (2304, 9)  # four: the common buckets
    grid = bucket_grid()
    assert set(GRAPH_TOKEN_BUCKETS) <= set(grid[33]) == set(GRAPH_TOKEN_BUCKETS)
    assert len(grid[3]) > len(grid[9]) > len(grid[17])
    limited = bucket_grid(token_buckets_up_to(1024))
    assert all(max(tokens) == 1024 for tokens in limited.values())
    with pytest.raises(ValueError):
        pad_doc_lens(100, 3, (100, 4))


def test_make_backbone_on_cpu(reference_model):
    assert isinstance(make_backbone(reference_model, "auto"), OmniVoiceBackbone)
    assert isinstance(make_backbone(reference_model, "torch"), OmniVoiceBackbone)
    attention = _attention(reference_model)
    backbone = make_backbone(reference_model, attention)
    assert isinstance(backbone, OmniVoiceBackbone) and backbone.attention is attention
    with pytest.raises(RuntimeError):
        make_backbone(reference_model, "flashinfer")
    with pytest.raises(ValueError):
        make_backbone(reference_model, "nope")


def test_flashinfer_boot_check_names_what_is_missing(monkeypatch):
    import importlib

    from server.engine.kernels.attention import flashinfer_backend as fa
    real_import = importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name.startswith("flashinfer"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setitem(__import__("sys").modules, "flashinfer", None)
    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(fa.FlashInferMissing):
        fa.check_flashinfer()


def test_doc_indptr():
    from server.engine.kernels.attention.flashinfer_backend import doc_indptr

    out = doc_indptr([3, 1, 5])
    assert out.dtype == torch.int32 and out.device.type == "cpu" and out.tolist() == [0, 3, 4, 9]
    assert doc_indptr([]).tolist() == [0]
