"""One-off: TileLang swap-AB GEMMs for small steps (the weights as the MMA's M side, every token
in one tile, optional split-K into float32 slices, as the engine's O and down projections are
split) against cuBLAS, 28 calls a CUDA graph with one weight copy a layer.

    python -m microbench.tilelang_swap_ab 135,256,535 '{"kind": "cuda", "arch": "sm_90a"}' swap.json
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

HIDDEN, QKV, INTER, ATTN_OUT = 1024, 4096, 3072, 2048
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, ATTN_OUT), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
LAYERS = 28


def swap_program(M, N, K, bn, bm, bk, stages, threads, splits):
    import tilelang.language as T
    ksplit = K // splits

    @T.prim_func
    def swap(X: T.Tensor((M, K), "bfloat16"), W: T.Tensor((N, K), "bfloat16"),
             C: T.Tensor((splits, M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), splits, threads=threads) as (bx, by, bz):
            w = T.alloc_shared((bn, bk), "bfloat16")
            x = T.alloc_shared((bm, bk), "bfloat16")
            acc = T.alloc_fragment((bn, bm), "float32")
            T.clear(acc)
            for k in T.Pipelined(ksplit // bk, num_stages=stages):
                T.copy(W[bx * bn, bz * ksplit + k * bk], w)
                T.copy(X[by * bm, bz * ksplit + k * bk], x)
                T.gemm(w, x, acc, transpose_B=True)
            for i, j in T.Parallel(bn, bm):
                if by * bm + j < M:
                    C[bz, by * bm + j, bx * bn + i] = acc[i, j]

    return swap


def configs(m):
    bms = [b for b in (144, 160, 192, 256) if b >= m][:2] if m <= 256 else [128, 256]
    out = []
    for bm in bms:
        for bn, threads in ((64, 128), (128, 256)):
            for splits in (1, 2, 4):
                out.append((bn, bm, 64, 4 if bm <= 160 else 3, threads, splits))
    return out


def build(m, name, cfg, target):
    import tilelang
    n, k = SHAPES[name]
    return tilelang.compile(swap_program(m, n, k, *cfg), target=target, execution_backend="tvm_ffi")


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


def main():
    rows = [int(r) for r in sys.argv[1].split(",")]
    target = json.loads(sys.argv[2])
    out_path = sys.argv[3] if len(sys.argv) > 3 else None
    jobs = [(m, name, cfg) for m in rows for name in SHAPES for cfg in configs(m)]
    t = time.perf_counter()
    with ThreadPoolExecutor(14) as pool:
        futs = {j: pool.submit(build, *j, target) for j in jobs}
    built, errors = {}, {}
    for j, f in futs.items():
        try:
            built[j] = f.result()
        except Exception as e:  # noqa: BLE001
            errors[str(j)] = f"{type(e).__name__}: {str(e)[-400:]}"
    print(f"compiled {len(built)} of {len(jobs)} in {time.perf_counter() - t:.0f} s", flush=True)
    if out_path is None:
        for k, v in list(errors.items())[:5]:
            print(k, v)
        return
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = {n: [torch.randn(*SHAPES[n], device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
               for n in SHAPES}
    results = []
    for m in rows:
        for name, (n, k) in SHAPES.items():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ref = (x @ weights[name][0].t()).float()
            cublas = graphed_us([lambda w=w: torch.mm(x, w.t(), out=y) for w in weights[name]])
            row = {"rows": m, "shape": name, "cublas_us": round(cublas, 2), "tilelang": []}
            for cfg in configs(m):
                kern = built.get((m, name, cfg))
                if kern is None:
                    continue
                c = torch.empty(cfg[-1], m, n, device=dev, dtype=torch.float32)
                try:
                    kern(x, weights[name][0], c)
                    err = float((c.sum(0) - ref).norm() / ref.norm())
                    us = graphed_us([lambda w=w: kern(x, w, c) for w in weights[name]])
                except Exception as e:  # noqa: BLE001
                    errors[str(("run", m, name, cfg))] = f"{type(e).__name__}: {str(e)[-300:]}"
                    continue
                row["tilelang"].append({"config": cfg, "us": round(us, 2), "rel_err": err})
            if row["tilelang"]:
                best = min(row["tilelang"], key=lambda r: r["us"])
                row["best"] = best
                row["vs_cublas"] = round(row["cublas_us"] / best["us"], 3)
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "tilelang"}), flush=True)
    import tilelang

    doc = {"benchmark": "tilelang_swap_ab", "gpu": torch.cuda.get_device_name(), "tilelang": tilelang.__version__,
           "config_fields": ["weight rows a tile", "tokens a tile", "k a step", "stages", "threads", "k slices"],
           "command": "python -m microbench.tilelang_swap_ab " + ",".join(map(str, rows)) + " TARGET OUT",
           "results": results, "errors": errors}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print("errors", len(errors))
    for k, v in list(errors.items())[:5]:
        print(k, v)


if __name__ == "__main__":
    main()
