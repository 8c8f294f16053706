"""CUTLASS C++ GEMMs against the engine's cuBLAS path at a small step's shapes (CUDA).

    python -m microbench.cutlass_build --out .cutlass-build/libchorus_cutlass.so   # nvcc, no GPU
    python -m microbench.cutlass_gemm --lib .cutlass-build/libchorus_cutlass.so --out cutlass.json
    python -m microbench.cutlass_gemm --kind cute --lib .cute-build/libchorus_cute.so --out cute.json

`--kind cute` times the CuTe DSL kernels of `microbench/cute_configs.py` instead (built by
`microbench.cute_build`, the same entry points) with the same harness.

The four projections (QKV 1024 -> 4096, O 2048 -> 1024, gate-up 1024 -> 6144, down
3072 -> 1024) at 135, 535 and 1088 rows, each call on its own of 28 weight copies, 28 calls a
CUDA graph (so weights stream from memory as in a step). The reference is timed in the same
process: `F.linear`, and for O and down the engine's split strided-batched GEMM into float32
partials (`split_k.split_linear`) where the engine splits that step. Every configuration of
`microbench/cutlass_configs.py` (swap-AB or not, 64- and 128-row tiles, ping-pong, cooperative,
stream-K / split-K, clusters, fp32 partials for O and down) is checked against a float32 product
before it is timed; the best eligible one and the reference are then timed again, alternately,
three times each (`confirm`), and the go is read from those. Last, the layer's four GEMMs
chained (each projection's best configuration) are timed against the engine's four cuBLAS calls
back to back: plain launches, programmatic dependent launch (PDL), and PDL with each kernel
asking L2 for its weights before it waits on its predecessor.

The sweep runs in a child process: a kernel that faults is left out and the sweep resumes from
its partial result (written to `--out` as it goes). Random weights: speed figures only.

    python -m microbench.cutlass_gemm --lib LIB --chain-from SWEEP.json --out pdl.json
    ncu ... python -m microbench.cutlass_gemm --lib LIB --probe-from SWEEP.json

`--chain-from` times only the chained layer again (five rounds) and each projection's three
fastest kernels launched with PDL call after call (cuBLAS's own kernels overlap their neighbours
in a graph; plain CUTLASS launches do not); `--probe-from` runs each engine call and its best
kernel twice, eagerly, for a profiler.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from microbench.cutlass_configs import (
    CONFIGS,
    GO_ROWS,
    LAYERS,
    NARROW,
    PROJECTIONS,
    ROWS,
    eligible,
    engine_splits,
    report,
    summarise,
)
from microbench.sweeps import cuda_sweep_parser, per_layer_us

CHECK_REL_ERR = 1e-2  # bf16 operands land between 1e-3 and 1e-2; NaN never passes


KINDS = {
    "cutlass": "python -m microbench.cutlass_build --out LIB (CUTLASS 4.5 headers of FlashInfer 0.6.15.post1, "
               "nvcc 13.0, sm_90a)",
    "cute": "CUTE_DSL_ARCH=sm_90a python -m microbench.cute_build export --out DIR (nvidia-cutlass-dsl 4.8.1, "
            "no GPU); python -m microbench.cute_build link --dir DIR --runtime libcuda_dialect_runtime_static.a",
}


def configs_of(kind: str) -> dict:
    """The configurations a library of `kind` holds, by name."""
    if kind == "cute":
        from microbench.cute_configs import CUTE_CONFIGS

        return {c.name: c for c in CUTE_CONFIGS}
    return {c.name: c for c in CONFIGS}


class Library:
    """The built library's kernels, called with raw device pointers on the current stream."""

    def __init__(self, path: str, kind: str = "cutlass"):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        self.names = [name for name in configs_of(kind) if hasattr(self.lib, f"{name}_run")]
        if hasattr(self.lib, "chorus_cute_load"):  # modules load before any graph is captured
            status = self.lib.chorus_cute_load()
            if status:
                raise RuntimeError(f"loading the CuTe DSL kernels failed (CUDA error {status})")
        for name in self.names:
            run = getattr(self.lib, f"{name}_run")
            run.restype = ctypes.c_int
            run.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                         ctypes.c_void_p, ctypes.c_int]
            ws = getattr(self.lib, f"{name}_workspace")
            ws.restype = ctypes.c_size_t
            ws.argtypes = [ctypes.c_int] * 4

    def workspace(self, name: str, m: int, n: int, k: int, splits: int) -> int:
        return getattr(self.lib, f"{name}_workspace")(m, n, k, splits)

    def run(self, name: str, x, w, d, splits: int, ws, flags: int = 0) -> int:
        m, k = x.shape
        n = w.shape[0]
        return getattr(self.lib, f"{name}_run")(x.data_ptr(), w.data_ptr(), d.data_ptr(), m, n, k, splits,
                                                ws.data_ptr(), ws.numel(), torch.cuda.current_stream().cuda_stream,
                                                flags)


def _write(out: str | None, doc: dict) -> None:
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, out)


def _key(r: dict) -> tuple:
    return (r["projection"], r["rows"], r["config"], r["splits"])


class Bench:
    """Weights, inputs and outputs for one process, and the callables a sweep times."""

    def __init__(self, lib: Library):
        from server.engine.kernels.split_k import split_linear

        self.lib, self.split_linear = lib, split_linear
        self.dev = torch.device("cuda")
        torch.manual_seed(0)
        self.w = {p: [torch.randn(n, k, device=self.dev, dtype=torch.bfloat16) * k**-0.5 for _ in range(LAYERS)]
                  for p, (n, k) in PROJECTIONS.items()}
        ws_bytes = max([lib.workspace(c, m, n, k, s) for c in lib.names for m in ROWS
                        for (n, k) in PROJECTIONS.values() for s in (1, 2, 4)] + [256])
        self.ws = torch.zeros(ws_bytes, device=self.dev, dtype=torch.uint8)
        self.bufs: dict = {}

    def buffers(self, proj: str, m: int):
        if (proj, m) not in self.bufs:
            n, k = PROJECTIONS[proj]
            x = torch.randn(m, k, device=self.dev, dtype=torch.bfloat16)
            self.bufs[proj, m] = (x, torch.empty(m, n, device=self.dev, dtype=torch.bfloat16),
                                  torch.empty(4, m, n, device=self.dev, dtype=torch.float32))
        return self.bufs[proj, m]

    def reference(self, proj: str, m: int, splits: int):
        """The engine's call for layer i: F.linear, or the split batched GEMM into partials."""
        x = self.buffers(proj, m)[0]
        if splits > 1:
            return lambda i: self.split_linear(x, self.w[proj][i], splits)
        return lambda i: torch.nn.functional.linear(x, self.w[proj][i])

    def cutlass(self, name: str, partials: bool, proj: str, m: int, splits: int, flags: int = 0):
        x, d, dp = self.buffers(proj, m)
        out = dp if partials else d
        return lambda i: self.lib.run(name, x, self.w[proj][i], out, splits, self.ws, flags)

    def check(self, name: str, partials: bool, proj: str, m: int, splits: int) -> tuple[int, float]:
        """(status, relative error against float32) of one eager call on fresh inputs, outputs poisoned."""
        x, d, dp = self.buffers(proj, m)
        x.copy_(torch.randn_like(x))
        d.fill_(float("nan"))
        dp.fill_(float("nan"))
        status = self.cutlass(name, partials, proj, m, splits)(0)
        torch.cuda.synchronize()
        if status:
            return status, float("nan")
        got = dp[:splits].sum(0) if partials else d.float()
        ref = x.float() @ self.w[proj][0].float().t()
        return 0, float((got - ref).norm() / ref.norm())


def kernel_names(call) -> list[str]:
    """The CUDA kernels one eager call of `call(0)` launches (cuBLAS's choice, by name)."""
    from torch.profiler import ProfilerActivity, profile

    call(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(0)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if str(e.device_type).endswith("CUDA")})


def probe(args) -> int:
    """Eager calls for a profiler (`ncu ... python -m microbench.cutlass_gemm --probe-from JSON`):
    at the go's row counts, each projection's engine call and its best CUTLASS kernel from a
    finished sweep's confirmation, each twice (the second is the one to read), in printed order."""
    with open(args.probe_from) as f:
        picks = [c for c in json.load(f)["confirm"] if c["rows"] in GO_ROWS]
    b = Bench(Library(args.lib, args.kind))
    cfgs = configs_of(args.kind)
    for c in picks:
        proj, m = c["projection"], c["rows"]
        es = engine_splits(m) if proj in NARROW else 1
        calls = [(f"engine {proj} {m}", b.reference(proj, m, es)),
                 (f"cutlass {proj} {m} {c['config']}/{c['splits']}",
                  b.cutlass(c["config"], cfgs[c["config"]].partials, proj, m, c["splits"]))]
        for label, call in calls:
            for _ in range(2):
                call(1)
                torch.cuda.synchronize()
            print(f"probe: {label} (2 launches)", flush=True)
    return 0


def pdl_per_call(b: Bench, configs, sweep: dict, rows_list, top: int = 3, rounds: int = 5) -> list[dict]:
    """Each projection's `top` fastest eligible kernels of a finished sweep, 28 calls a graph as
    in the sweep, launched plainly and with PDL (each call behind the previous one), alternating
    with the engine's cuBLAS path `rounds` times."""
    out = []
    for base in sweep["baselines"]:
        proj, m = base["projection"], base["rows"]
        if m not in rows_list:
            continue
        mine = sorted((r for r in sweep["records"] if r["projection"] == proj and r["rows"] == m
                       and "us" in r and eligible(proj, m, r) and r["config"] in configs), key=lambda r: r["us"])
        es = engine_splits(m) if proj in NARROW else 1
        row = {"projection": proj, "rows": m, "engine_us": [], "kernels": []}
        picks = [{"config": r["config"], "splits": r["splits"], "plain_us": [], "pdl_us": []} for r in mine[:top]]
        for _ in range(rounds):
            row["engine_us"].append(per_layer_us(b.reference(proj, m, es)))
            for k in picks:
                cfg = configs[k["config"]]
                k["plain_us"].append(per_layer_us(b.cutlass(cfg.name, cfg.partials, proj, m, k["splits"])))
                k["pdl_us"].append(per_layer_us(b.cutlass(cfg.name, cfg.partials, proj, m, k["splits"], 1)))
        row["kernels"] = picks
        ref = statistics.median(row["engine_us"])
        med = statistics.median
        best = min(picks, key=lambda k: med(k["pdl_us"]))
        row["best_pdl"] = {"config": best["config"], "splits": best["splits"], "us": med(best["pdl_us"]),
                           "ratio": round(ref / med(best["pdl_us"]), 3)}
        shown = [f"{k['config']}/{k['splits']} {med(k['plain_us']):.2f} -> {med(k['pdl_us']):.2f}" for k in picks]
        print(f"pdl {m:5d} {proj:8s} engine {ref:7.2f}  " + "  ".join(shown), flush=True)
        out.append(row)
    return out


def chain_again(args) -> int:
    """Only the chained layer (kernels from a finished sweep's confirmation) and each
    projection's best kernels launched with PDL call after call."""
    with open(args.chain_from) as f:
        sweep = json.load(f)
    b = Bench(Library(args.lib, args.kind))
    configs = configs_of(args.kind)
    doc = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "from": args.chain_from,
                    "command": f"python -m microbench.cutlass_gemm --kind {args.kind} --lib LIB --chain-from SWEEP "
                               "--out OUT"}}
    doc["chain"] = chain(b, configs, sweep["confirm"], args.rows, rounds=5)
    _write(args.out, doc)
    doc["pdl_per_call"] = pdl_per_call(b, configs, sweep, args.rows)
    doc["pdl_go"] = all(r["best_pdl"]["ratio"] >= 1.0 for r in doc["pdl_per_call"] if r["rows"] in GO_ROWS)
    _write(args.out, doc)
    print(f"go with PDL between calls (every projection >= 1.0x at {GO_ROWS}): {doc['pdl_go']}")
    return 0


def child(args) -> int:
    """The sweep itself; resumes from `args.out` where a previous child left it."""
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    doc = {"meta": {}, "baselines": [], "records": [], "excluded": args.exclude}
    if args.resume and args.out and os.path.exists(args.out):
        with open(args.out) as f:
            doc = json.load(f)
        doc["excluded"] = args.exclude
    lib = Library(args.lib, args.kind)
    b = Bench(lib)
    configs = {name: c for name, c in configs_of(args.kind).items() if name in lib.names
               and name not in args.exclude and (not args.configs or name in args.configs)}
    doc["meta"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cuda": torch.version.cuda, "layers": LAYERS, "rows": args.rows,
                   "command": f"python -m microbench.cutlass_gemm --kind {args.kind} --lib LIB --out OUT"
                              + (" --rows " + " ".join(map(str, args.rows)) if list(args.rows) != list(ROWS) else ""),
                   "kind": args.kind, "build": KINDS[args.kind],
                   "timing": "median us a call, 28 calls (one weight copy each) a CUDA graph, 15 replays",
                   "configs": len(configs)}
    done = {_key(r) for r in doc["records"]}
    have_base = {(r["projection"], r["rows"]) for r in doc["baselines"]}
    for m in args.rows:
        for proj in PROJECTIONS:
            if (proj, m) not in have_base:
                split_us = {s: per_layer_us(b.reference(proj, m, s)) for s in (2, 4)} if proj in NARROW else {}
                f_us = per_layer_us(b.reference(proj, m, 1))
                es = engine_splits(m) if proj in NARROW else 1
                doc["baselines"].append({"projection": proj, "rows": m, "f_linear_us": f_us,
                                         "split_bmm_us": split_us, "engine_splits": es,
                                         "engine_kernels": kernel_names(b.reference(proj, m, es)),
                                         "engine_path": f"split bmm x{es}" if es > 1 else "F.linear",
                                         "engine_us": split_us[es] if es > 1 else f_us})
            for name, cfg in configs.items():
                for s in cfg.splits(proj, m):
                    rec = {"projection": proj, "rows": m, "config": name, "splits": s, "partials": cfg.partials}
                    if _key(rec) in done:
                        continue
                    if time.monotonic() > deadline:
                        doc["records"].append({**rec, "ok": False, "error": "out of time"})
                        continue
                    doc["inflight"] = name
                    _write(args.out, doc)
                    status, err = b.check(name, cfg.partials, proj, m, s)
                    rec.update(status=status, rel_err=err)
                    rec["ok"] = status == 0 and err < CHECK_REL_ERR
                    if rec["ok"]:
                        rec["us"] = per_layer_us(b.cutlass(name, cfg.partials, proj, m, s))
                    doc["records"].append(rec)
                    doc.pop("inflight", None)
            _write(args.out, doc)
            base = next(r for r in doc["baselines"] if (r["projection"], r["rows"]) == (proj, m))
            best = summarise([r for r in doc["records"] if "us" in r], [base])["table"][0]
            print(f"{m:5d} {proj:8s} engine {base['engine_us']:7.2f} us ({base['engine_path']}) "
                  f"F.linear {base['f_linear_us']:7.2f}  best {best['best']}  x{best['ratio']}", flush=True)
    doc.pop("inflight", None)
    timed = [r for r in doc["records"] if "us" in r]
    doc["summary"] = summarise(timed, doc["baselines"])
    _write(args.out, doc)
    if time.monotonic() < deadline:
        doc["confirm"] = confirm(b, configs, doc["summary"]["table"])
        doc["confirm_go"] = all(c["ratio"] >= 1.0 for c in doc["confirm"] if c["rows"] in GO_ROWS)
        _write(args.out, doc)
    if args.chain and time.monotonic() < deadline:
        doc["chain"] = chain(b, configs, doc.get("confirm") or [], args.rows)
        _write(args.out, doc)
    doc["sweep_s"] = round(time.monotonic() - t0, 1)
    _write(args.out, doc)
    print(report(doc), flush=True)
    return 0


def confirm(b: Bench, configs, table: list[dict], rounds: int = 3) -> list[dict]:
    """The reference and the best CUTLASS record timed again, alternately, `rounds` times each."""
    out = []
    for e in table:
        if e["best"] is None:
            continue
        proj, m, best = e["projection"], e["rows"], e["best"]
        es = engine_splits(m) if proj in NARROW else 1
        cfg = configs[best["config"]]
        ref, mine = [], []
        for _ in range(rounds):
            ref.append(per_layer_us(b.reference(proj, m, es)))
            mine.append(per_layer_us(b.cutlass(cfg.name, cfg.partials, proj, m, best["splits"])))
        r, c = statistics.median(ref), statistics.median(mine)
        out.append({"projection": proj, "rows": m, "config": cfg.name, "splits": best["splits"],
                    "engine_us": ref, "cutlass_us": mine, "ratio": round(r / c, 3)})
        print(f"confirm {m:5d} {proj:8s} engine {r:7.2f} cutlass {c:7.2f} x{r / c:.3f} ({cfg.name}/{best['splits']})",
              flush=True)
    return out


def chain(b: Bench, configs, confirmed: list[dict], rows_list, rounds: int = 3) -> list[dict]:
    """A layer's four GEMMs back to back, 28 layers a graph: the engine's cuBLAS calls against
    each projection's best CUTLASS kernel launched plainly, with PDL, and with PDL + weight prefetch."""
    out = []
    for m in rows_list:
        picks = {c["projection"]: c for c in confirmed if c["rows"] == m}
        if set(picks) != set(PROJECTIONS):
            continue
        refs = [b.reference(p, m, engine_splits(m) if p in NARROW else 1) for p in PROJECTIONS]

        def mine(flags):
            calls = [b.cutlass(picks[p]["config"], configs[picks[p]["config"]].partials, p, m,
                               picks[p]["splits"], flags) for p in PROJECTIONS]

            def layer(i):
                status = 0
                for c in calls:
                    status |= c(i)
                if status:
                    raise RuntimeError(f"a CUTLASS launch failed ({status})")
            return layer

        def outputs():  # what each kernel writes (a partials buffer's first `splits` slices)
            return [b.buffers(p, m)[2][:picks[p]["splits"]].clone() if configs[picks[p]["config"]].partials
                    else b.buffers(p, m)[1].clone() for p in PROJECTIONS]

        mine(0)(0)
        torch.cuda.synchronize()
        plain = outputs()
        mine(3)(0)
        torch.cuda.synchronize()
        same = all(torch.equal(a, z) for a, z in zip(plain, outputs()))
        row = {"rows": m, "configs": {p: [picks[p]["config"], picks[p]["splits"]] for p in PROJECTIONS},
               "pdl_prefetch_bitwise_equal": same, "engine_cublas_us": [], "cutlass_us": [], "cutlass_pdl_us": [],
               "cutlass_pdl_prefetch_us": [], "cutlass_prefetch_us": []}
        for _ in range(rounds):
            row["engine_cublas_us"].append(per_layer_us(lambda i: [f(i) for f in refs]))
            row["cutlass_us"].append(per_layer_us(mine(0)))
            row["cutlass_pdl_us"].append(per_layer_us(mine(1)))
            row["cutlass_pdl_prefetch_us"].append(per_layer_us(mine(3)))
            row["cutlass_prefetch_us"].append(per_layer_us(mine(2)))
        med = {k: statistics.median(v) for k, v in row.items() if k.endswith("_us")}
        row["median_us"] = med
        print(f"chain {m:5d}: " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()) + f"  equal={same}", flush=True)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = cuda_sweep_parser("microbench.cutlass_gemm", __doc__)
    p.add_argument("--lib", required=True, help="the library `python -m microbench.cutlass_build` wrote")
    p.add_argument("--kind", choices=sorted(KINDS), default="cutlass",
                   help="cute: the CuTe DSL kernels `python -m microbench.cute_build` linked")
    p.add_argument("--child-timeout-s", type=float, default=240,
                   help="a sweep child still running this long past its budget is taken for hung and killed")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--configs", nargs="*", default=[], help="only these configurations")
    p.add_argument("--budget-s", type=float, default=400, help="stop timing new configurations after this")
    p.add_argument("--no-chain", dest="chain", action="store_false", help="skip the chained layer (PDL)")
    p.add_argument("--probe-from", default=None, help="only run a finished sweep's best kernels for a profiler")
    p.add_argument("--chain-from", default=None, help="only time the chained layer, kernels from a finished sweep")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--exclude", nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{p.prog} needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.probe_from:
        return probe(args)
    if args.chain_from:
        return chain_again(args)
    if args.child:
        return child(args)
    if not args.out:
        p.error("--out is needed (the sweep writes its partial result there as it goes)")
    exclude: list[str] = []
    t0 = time.monotonic()
    for attempt in range(4):
        budget = args.budget_s - (time.monotonic() - t0)
        cmd = [sys.executable, "-m", "microbench.cutlass_gemm", "--child", "--lib", args.lib, "--out", args.out,
               "--budget-s", str(max(budget, 1.0)), "--rows", *map(str, args.rows)]
        cmd += ["--configs", *args.configs] if args.configs else []
        cmd += ["--exclude", *exclude] if exclude else []
        cmd += ["--resume"] if attempt else []
        cmd += [] if args.chain else ["--no-chain"]
        cmd += ["--kind", args.kind]
        try:
            rc = subprocess.run(cmd, timeout=max(budget, 1.0) + args.child_timeout_s).returncode
        except subprocess.TimeoutExpired:  # a kernel that never finishes: left out like one that faults
            rc = -9
        if rc == 0:
            return 0
        try:
            with open(args.out) as f:
                bad = json.load(f).get("inflight")
        except (OSError, ValueError):
            bad = None
        print(f"the sweep stopped (exit {rc}) during {bad}; leaving it out and resuming", file=sys.stderr, flush=True)
        if not bad or bad in exclude:
            return rc
        exclude.append(bad)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
