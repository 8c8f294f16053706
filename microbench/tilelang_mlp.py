"""One-off: a small step's whole MLP (gate-up GEMM, SiLU gate, down GEMM into k slices) as ONE
persistent TileLang kernel with a grid barrier between the phases, against what the engine runs
(cuBLAS gate-up, a SiLU-gate pass, cuBLAS down), 28 calls a CUDA graph, one weight set a layer.

    python -m microbench.tilelang_mlp 117,135 '{"kind": "cuda", "arch": "sm_90a"}' mlp.json

(`-` for OUT compiles only; no GPU needed.) The first run's configurations are in the result's
`runs`.
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

H, INTER = 1024, 3072
LAYERS = 28


def fused_program(M, bm, bi, bk, stages, threads, splits, tn=64):
    import tilelang.language as T
    p1 = INTER // bi  # phase-1 tiles: bi intermediate columns, gate and up
    p2 = (H // tn) * splits  # phase-2 tiles: tn output columns x one k slice
    grid = max(p1, p2)
    ks = INTER // splits

    @T.prim_func
    def mlp(X: T.Tensor((M, H), "bfloat16"), Wgu: T.Tensor((2 * INTER, H), "bfloat16"),
            Wd: T.Tensor((H, INTER), "bfloat16"), Act: T.Tensor((M, INTER), "bfloat16"),
            Out: T.Tensor((splits, M, H), "float32")):
        with T.Kernel(grid, threads=threads) as bid:
            g = T.alloc_shared((bi, bk), "bfloat16")
            u = T.alloc_shared((bi, bk), "bfloat16")
            x = T.alloc_shared((bm, bk), "bfloat16")
            acc_g = T.alloc_fragment((bi, bm), "float32")
            acc_u = T.alloc_fragment((bi, bm), "float32")
            w = T.alloc_shared((tn, bk), "bfloat16")
            a = T.alloc_shared((bm, bk), "bfloat16")
            acc = T.alloc_fragment((tn, bm), "float32")
            if bid < p1:
                T.clear(acc_g)
                T.clear(acc_u)
                for k in T.Pipelined(H // bk, num_stages=stages):
                    T.copy(Wgu[bid * bi, k * bk], g)
                    T.copy(Wgu[INTER + bid * bi, k * bk], u)
                    T.copy(X[0, k * bk], x)
                    T.gemm(g, x, acc_g, transpose_B=True)
                    T.gemm(u, x, acc_u, transpose_B=True)
                for i, j in T.Parallel(bi, bm):
                    if j < M:
                        Act[j, bid * bi + i] = acc_g[i, j] / (1.0 + T.exp(-acc_g[i, j])) * acc_u[i, j]
            T.sync_grid()
            if bid < p2:
                nt = bid % (H // tn)
                s = bid // (H // tn)
                T.clear(acc)
                for k in T.Pipelined(ks // bk, num_stages=stages):
                    T.copy(Wd[nt * tn, s * ks + k * bk], w)
                    T.copy(Act[0, s * ks + k * bk], a)
                    T.gemm(w, a, acc, transpose_B=True)
                for i, j in T.Parallel(tn, bm):
                    if j < M:
                        Out[s, j, nt * tn + i] = acc[i, j]

    return mlp


CONFIGS = [  # (bm, bi, bk, stages, threads, splits, pass configs); "default": TileLang's TMA producer warps
    (144, 64, 64, 3, 128, 8, "no_ws"),
    (144, 32, 64, 3, 128, 8, "no_ws"),
    (144, 64, 64, 2, 128, 4, "no_ws"),
    (144, 32, 64, 2, 128, 8, "default"),
    (144, 64, 64, 2, 128, 8, "default"),
    (144, 64, 64, 3, 128, 8, "default"),
]
PASS_CONFIGS = {"default": {}, "no_ws": {"tl.disable_warp_specialized": True}}


def build(m, cfg, target):
    import tilelang
    *shape, pc = cfg
    return tilelang.compile(fused_program(m, *shape), target=target, execution_backend="tvm_ffi",
                            pass_configs=PASS_CONFIGS[pc])


def graphed_us(calls, replays=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(calls))
    return sorted(ts)[len(ts) // 2]


def eager_us(calls, replays=30):
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for c in calls:
            c()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(calls))
    return sorted(ts)[len(ts) // 2]


def silu_mul_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def k(gu, out, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        keep = offs < inter
        g = tl.load(gu + row * 2 * inter + offs, mask=keep).to(tl.float32)
        u = tl.load(gu + row * 2 * inter + inter + offs, mask=keep).to(tl.float32)
        tl.store(out + row * inter + offs, (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16), mask=keep)

    return lambda gu, out: k[(gu.shape[0],)](gu, out, INTER, BLOCK=4096, num_warps=8)


def main():
    rows = [int(r) for r in sys.argv[1].split(",")]
    target = json.loads(sys.argv[2])
    out_path = None if sys.argv[3] == "-" else sys.argv[3]
    jobs = [(m, cfg) for m in rows for cfg in CONFIGS]
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        futs = {j: pool.submit(build, *j, target) for j in jobs}
    built, errors = {}, {}
    for j, f in futs.items():
        try:
            built[j] = f.result()
        except Exception as e:  # noqa: BLE001
            errors[str(j)] = f"{type(e).__name__}: {str(e)[-600:]}"
    print(f"compiled {len(built)} of {len(jobs)} in {time.perf_counter() - t:.0f} s", flush=True)
    if out_path is None:
        for k, v in list(errors.items())[:4]:
            print(k, v)
        if built:
            src = next(iter(built.values())).get_kernel_source()
            print("sync:", "grid" in src and src.count("sync"), "wgmma" in src, "tma_load" in src)
        return
    dev = torch.device("cuda")
    torch.manual_seed(0)
    wgu = [torch.randn(2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.03 for _ in range(LAYERS)]
    wd = [torch.randn(H, INTER, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
    silu_mul = silu_mul_kernel()
    results = []
    for m in rows:
        x = torch.randn(m, H, device=dev, dtype=torch.bfloat16)
        gu = torch.empty(m, 2 * INTER, device=dev, dtype=torch.bfloat16)
        act = torch.empty(m, INTER, device=dev, dtype=torch.bfloat16)
        y = torch.empty(m, H, device=dev, dtype=torch.bfloat16)

        def engine_like(a, b):
            torch.mm(x, a.t(), out=gu)
            silu_mul(gu, act)
            torch.mm(act, b.t(), out=y)

        engine_like(wgu[0], wd[0])
        ref = y.float().clone()
        row = {"rows": m,
               "cublas_gate_up_us": round(graphed_us([lambda a=a: torch.mm(x, a.t(), out=gu) for a in wgu]), 2),
               "silu_us": round(graphed_us([lambda: silu_mul(gu, act)] * LAYERS), 2),
               "cublas_down_us": round(graphed_us([lambda b=b: torch.mm(act, b.t(), out=y) for b in wd]), 2),
               "engine_like_us": round(graphed_us([lambda a=a, b=b: engine_like(a, b) for a, b in zip(wgu, wd)]), 2),
               "fused": []}
        for cfg in CONFIGS:
            kern = built.get((m, cfg))
            if kern is None:
                continue
            outp = torch.zeros(cfg[5], m, H, device=dev, dtype=torch.float32)
            act2 = torch.empty(m, INTER, device=dev, dtype=torch.bfloat16)
            try:
                kern(x, wgu[0], wd[0], act2, outp)
                torch.cuda.synchronize()
                err = float((outp.sum(0) - ref).norm() / ref.norm())
                act_err = float((act2.float() - act.float()).norm() / act.float().norm())
                calls = [lambda a=a, b=b: kern(x, a, b, act2, outp) for a, b in zip(wgu, wd)]
                try:
                    us, how = graphed_us(calls), "graph"
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    us, how = eager_us(calls), f"eager ({type(e).__name__})"
            except Exception as e:  # noqa: BLE001
                errors[str(("run", m, cfg))] = f"{type(e).__name__}: {str(e)[-400:]}"
                continue
            row["fused"].append({"config": cfg, "us": round(us, 2), "timed": how, "rel_err": err,
                                 "act_rel_err": act_err})
        print(json.dumps(row), flush=True)
        results.append(row)
    with open(out_path, "w") as f:
        json.dump({"results": results, "errors": errors}, f, indent=1)
    print("errors", len(errors))
    for k, v in list(errors.items())[:4]:
        print(k, v)


if __name__ == "__main__":
    main()
