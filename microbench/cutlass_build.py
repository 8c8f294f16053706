"""Build `microbench.cutlass_gemm`'s kernels: one shared library with every configuration of
`microbench/cutlass_configs.py` behind a plain C entry point (no GPU needed: nvcc only).

    python -m microbench.cutlass_build --out .cutlass-build/libchorus_cutlass.so \\
        [--cutlass-include DIR] [--nvcc PATH] [--cudart-dir DIR] [--jobs 2] [--only NAME ...]

CUTLASS's headers default to the ones inside the installed FlashInfer package
(`flashinfer/data/cutlass/include`, CUTLASS 4.5 in 0.6.15). Every kernel is built for sm_90a
with programmatic dependent launch compiled in (`CUTLASS_ENABLE_GDC_FOR_SM90`); the library
links the CUDA runtime dynamically (libcudart.so.13, which PyTorch's CUDA build loads first).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from microbench.cutlass_configs import CONFIGS

HERE = Path(__file__).resolve().parent / "cutlass"
FLAGS = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
         "-DCUTLASS_ENABLE_GDC_FOR_SM90=1", "-DNDEBUG", "-Xcompiler", "-fPIC", "-diag-suppress", "20012"]


def flashinfer_cutlass_include() -> Path | None:
    """`flashinfer/data/cutlass/include` of the installed FlashInfer, found without importing it."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        inc = Path(root) / "data" / "cutlass" / "include"
        if (inc / "cutlass" / "cutlass.h").exists():
            return inc
    return None


def compile_one(nvcc: str, include: Path, src: Path, obj: Path) -> tuple[str, float, str]:
    t = time.perf_counter()
    cmd = [nvcc, *FLAGS, f"-I{HERE}", f"-I{include}", "-c", str(src), "-o", str(obj)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return src.stem, time.perf_counter() - t, "" if r.returncode == 0 else (r.stderr[-3000:] or "failed")


def build(out: Path, include: Path, nvcc: str, cudart_dir: str | None, jobs: int, only: list[str]) -> int:
    work = out.parent / "src"
    work.mkdir(parents=True, exist_ok=True)
    configs = [c for c in CONFIGS if not only or c.name in only]
    jobs_list = []
    for c in configs:
        src = work / f"{c.name}.cu"
        text = c.source()
        if not src.exists() or src.read_text() != text:
            src.write_text(text)
        obj = work / f"{c.name}.o"
        stale = not obj.exists() or obj.stat().st_mtime < max(src.stat().st_mtime, (HERE / "gemm.cuh").stat().st_mtime)
        if stale:
            jobs_list.append((src, obj))
    print(f"{len(configs)} configurations, {len(jobs_list)} to compile, {jobs} at a time", flush=True)
    failed = []
    with ThreadPoolExecutor(jobs) as pool:
        for name, secs, err in pool.map(lambda j: compile_one(nvcc, include, *j), jobs_list):
            print(f"  {name}: {secs:.0f} s{' FAILED' if err else ''}", flush=True)
            if err:
                failed.append(name)
                print(err, file=sys.stderr)
    if failed:
        print(f"{len(failed)} failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    link = [nvcc, "-shared", "-cudart", "shared", "-gencode=arch=compute_90a,code=sm_90a",
            *[str(work / f"{c.name}.o") for c in configs], "-o", str(out)]
    if cudart_dir:
        link[1:1] = [f"-L{cudart_dir}"]
    r = subprocess.run(link, capture_output=True, text=True)
    if r.returncode:
        print(r.stderr, file=sys.stderr)
        return 1
    (out.parent / "configs.txt").write_text("".join(f"{c.name}\n" for c in configs))
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB, {len(configs)} kernels)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m microbench.cutlass_build", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the shared library to write (its folder also holds sources, objects)")
    p.add_argument("--cutlass-include", default=None, help="CUTLASS's include folder (default: FlashInfer's)")
    p.add_argument("--nvcc", default=None, help="nvcc (default: $CUDA_HOME/bin/nvcc, else on PATH)")
    p.add_argument("--cudart-dir", default=None, help="a folder with libcudart.so to link against")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--only", nargs="*", default=[], help="build only these configurations")
    args = p.parse_args(argv)
    include = Path(args.cutlass_include) if args.cutlass_include else flashinfer_cutlass_include()
    if include is None:
        print("no CUTLASS headers: install flashinfer-python or pass --cutlass-include", file=sys.stderr)
        return 2
    nvcc = args.nvcc or (str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc") if "CUDA_HOME" in os.environ
                         else shutil.which("nvcc"))
    if not nvcc:
        print("no nvcc: pass --nvcc or set CUDA_HOME", file=sys.stderr)
        return 2
    return build(Path(args.out), include, nvcc, args.cudart_dir, args.jobs, args.only)


if __name__ == "__main__":
    raise SystemExit(main())
