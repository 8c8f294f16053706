"""The q/k norm + RoPE kernel's program shapes at a step's sizes, from CUDA graphs.

Shapes are the full-size model's (16 q and 8 k heads of 128) at the packed rows of a
fast-start chunk (135), a lone 10 s line (544), three lines (1605), eight (4296), sixteen
(8561) and the 256 mix's step (34256). For each `ProgramShape` (`server/engine/kernels/qk_norm_rope.py`:
the `heads` layout, a token's heads cut into programs; the `tokens` layout, a few tokens' q heads
and k heads a program) it reports microseconds a call (28 calls in one graph, as a forward's
28 layers call it), the memory bandwidth that is, and whether its q and k equal the default
shape's bit for bit.

    python -m microbench.qk_rope_sweep --out qk.json
"""

from __future__ import annotations

import torch

from microbench.sweeps import cuda_sweep_parser, run_cuda_sweep, variant_timings

Q_HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
ROWS = (135, 544, 1605, 4296, 8561, 34256)


def _shapes():
    from server.engine.kernels.qk_norm_rope import ProgramShape as S

    heads = [S("heads", 32, 4), S("heads", 16, 2), S("heads", 8, 1), S("heads", 8, 2)]
    tokens = [S("tokens", bt, w) for bt, w in ((1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (4, 4), (4, 8),
                                               (8, 4), (8, 8), (16, 8))]
    return heads + tokens


def sweep(rows: tuple[int, ...] = ROWS) -> dict:
    from server.engine.kernels.qk_norm_rope import program_shape, qk_norm_rope

    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    out: dict = {"meta": {"command": "python -m microbench.qk_rope_sweep", "gpu": torch.cuda.get_device_name(device)},
                 "rows": {}}
    for m in rows:
        qkv = (torch.randn(m, Q_HEADS + 2 * KV_HEADS, HEAD_DIM, generator=gen) * 3).to(device, torch.bfloat16)
        w = (1 + 0.1 * torch.randn(2, HEAD_DIM, generator=gen)).to(device, torch.bfloat16)
        pos = torch.randint(0, 600, (m,), generator=gen).to(device)
        q = qkv.new_empty(m, Q_HEADS, HEAD_DIM)
        k = qkv.new_empty(m, KV_HEADS, HEAD_DIM)
        args = (qkv, w, pos, Q_HEADS, KV_HEADS, 1e-6, 1e6, q, k)
        default = program_shape(m, Q_HEADS + KV_HEADS)
        base_q, base_k = (t.clone() for t in qk_norm_rope(*args, shape=default))
        moved = 2 * m * (Q_HEADS + KV_HEADS) * HEAD_DIM * 2  # q and k read and written, bf16
        results = variant_timings(
            {f"{shape.layout}_{shape.per_program}_w{shape.warps}": shape for shape in _shapes()},
            lambda shape, args=args: qk_norm_rope(*args, shape=shape),
            lambda shape, args=args, base=(base_q, base_k): all(map(torch.equal, qk_norm_rope(*args, shape=shape),
                                                                     base)))
        best = results.pop("best")
        for result in results.values():
            result["tb_per_s"] = round(moved / result["us"] / 1e6, 2)
        out["rows"][str(m)] = {"default": f"{default.layout}_{default.per_program}_w{default.warps}",
                               "best": best, "shapes": results}
        print(m, out["rows"][str(m)]["default"], "->", best, results[best]["us"], "us", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = cuda_sweep_parser("microbench.qk_rope_sweep", __doc__).parse_args(argv)
    return run_cuda_sweep("python -m microbench.qk_rope_sweep", sweep, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
