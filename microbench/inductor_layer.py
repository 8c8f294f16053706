"""Experiment: does torch.compile (Inductor, max-autotune) fuse a Qwen3 layer's non-attention
work into fewer, faster kernels than the engine's hand-assembled path at small steps?

Per packed-row count: 28 layers' blocks (distinct weights, as in the model) captured in one CUDA
graph, replayed; per-layer medians. Blocks: `pre` = QKV GEMM + q/k norm + RoPE; `post` = O proj
+ add + norm + gate-up + SiLU gate + down + add + norm.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from server.engine.kernels import qk_norm_rope, split_k
from server.engine.kernels.layer_ops import FlashInferOps

torch._inductor.config.max_autotune_gemm_backends = "ATEN,TRITON"
out_dir = os.environ.get("OUT", "/tmp")
dev, dt = "cuda", torch.bfloat16
H, HQ, HKV, D, INTER, L = 1024, 16, 8, 128, 3072, 28
eps, theta = 1e-6, 1e6
ops = FlashInferOps()
torch.manual_seed(0)


def w(*shape, s=0.02):
    return (torch.randn(*shape, device=dev) * s).to(dt)


layers = [dict(w_qkv=w(4096, H), w_o=w(H, HQ * D), ln2=1 + w(H, s=0.1), w_gu=w(2 * INTER, H), w_down=w(H, INTER),
               ln1=1 + w(H, s=0.1), qk_norms=1 + w(2, D, s=0.1)) for _ in range(L)]
for lay in layers:
    lay["w_g"], lay["w_u"] = lay["w_gu"][:INTER].contiguous(), lay["w_gu"][INTER:].contiguous()


def post_current(o, residual, lay, splits):
    if splits > 1:
        h = split_k.split_add_rmsnorm(split_k.split_linear(o, lay["w_o"], splits), residual, lay["ln2"], eps)
    else:
        h = F.linear(o, lay["w_o"])
        ops.fused_add_rmsnorm(h, residual, lay["ln2"], eps)
    g = ops.silu_and_mul(F.linear(h, lay["w_gu"]))
    if splits > 1:
        return split_k.split_add_rmsnorm(split_k.split_linear(g, lay["w_down"], splits), residual, lay["ln1"], eps)
    h = F.linear(g, lay["w_down"])
    ops.fused_add_rmsnorm(h, residual, lay["ln1"], eps)
    return h


def _norm(r, weight):
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dt)


def post_plain(o, residual, w_o, ln2, w_g, w_u, w_down, ln1):
    r = residual.float() + F.linear(o, w_o).float()
    h = _norm(r, ln2)
    g = F.silu(F.linear(h, w_g)) * F.linear(h, w_u)
    r2 = r.to(dt).float() + F.linear(g, w_down).float()
    return _norm(r2, ln1), r2.to(dt)


def pre_current(h, lay, pos):
    qkv = F.linear(h, lay["w_qkv"]).view(h.shape[0], HQ + 2 * HKV, D)
    return qk_norm_rope.qk_norm_rope(qkv, lay["qk_norms"], pos, HQ, HKV, eps, theta)


def pre_plain(h, w_qkv, qk_norms, cos, sin):
    qkv = F.linear(h, w_qkv).view(h.shape[0], HQ + 2 * HKV, D).float()
    q, k = qkv[:, :HQ], qkv[:, HQ:HQ + HKV]
    out = []
    for t, wt in ((q, qk_norms[0]), (k, qk_norms[1])):
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * wt.float()
        t = t.to(dt).float()
        rot = torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
        out.append((t * cos + rot * sin).to(dt))
    return out[0], out[1]


def graph_time(fn, reps=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2] * 1000 / L  # us a layer


results = []
post_c = torch.compile(post_plain, mode="max-autotune-no-cudagraphs", dynamic=False, fullgraph=True)
pre_c = torch.compile(pre_plain, mode="max-autotune-no-cudagraphs", dynamic=False, fullgraph=True)
for M in [int(a) for a in sys.argv[1:]] or [544, 1088, 2176]:
    row = {"rows": M}
    splits = split_k.splits_for(M, (HQ * D, INTER))
    o = w(M, HQ * D, s=1.0)
    base_res = w(M, H, s=1.0)
    residual = base_res.clone()
    h0 = w(M, H, s=1.0)
    pos = torch.arange(M, device=dev) % 300
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    fr = pos.float()[:, None] * inv[None]
    cos = torch.cat([fr.cos(), fr.cos()], -1)[:, None]
    sin = torch.cat([fr.sin(), fr.sin()], -1)[:, None]

    def run_post_current():
        for lay in layers:
            post_current(o, residual, lay, splits)

    def run_post_compiled():
        for lay in layers:
            post_c(o, base_res, lay["w_o"], lay["ln2"], lay["w_g"], lay["w_u"], lay["w_down"], lay["ln1"])

    def run_pre_current():
        for lay in layers:
            pre_current(h0, lay, pos)

    def run_pre_compiled():
        for lay in layers:
            pre_c(h0, lay["w_qkv"], lay["qk_norms"], cos, sin)

    t0 = time.time()
    run_post_compiled()
    run_pre_compiled()
    torch.cuda.synchronize()
    row["compile_s"] = round(time.time() - t0, 1)
    # agreement, one layer
    r1 = base_res.clone()
    a = post_current(o, r1, layers[0], splits)
    b, _ = post_c(o, base_res, layers[0]["w_o"], layers[0]["ln2"], layers[0]["w_g"], layers[0]["w_u"],
                  layers[0]["w_down"], layers[0]["ln1"])
    row["post_rel_err"] = ((a.float() - b.float()).norm() / a.float().norm()).item()
    qa, ka = pre_current(h0, layers[0], pos)
    qb, kb = pre_c(h0, layers[0]["w_qkv"], layers[0]["qk_norms"], cos, sin)
    row["pre_rel_err"] = ((qa.float() - qb.float()).norm() / qa.float().norm()).item()
    row["post_current_us"] = graph_time(run_post_current)
    row["post_inductor_us"] = graph_time(run_post_compiled)
    row["pre_current_us"] = graph_time(run_pre_current)
    row["pre_inductor_us"] = graph_time(run_pre_compiled)
    print(json.dumps(row), flush=True)
    results.append(row)
    with open(os.path.join(out_dir, "inductor_layer.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, f, indent=1)
