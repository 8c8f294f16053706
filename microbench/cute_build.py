"""Build the CuTe DSL GEMMs ahead of time: compile on any machine with the DSL (no GPU), link
on the GPU machine with nvcc, time with `python -m microbench.cutlass_gemm --kind cute`.

    CUTE_DSL_ARCH=sm_90a python -m microbench.cute_build export --out .cute-build     # the DSL, no GPU
    python -m microbench.cute_build link --dir .cute-build --runtime LIBCUDA_DIALECT_RUNTIME_STATIC.a

`export` compiles every configuration of `microbench/cute_configs.py` for each projection (the
token count stays a runtime value), once plainly and once launched with programmatic dependent
launch, and writes each as an object file and header (`export_to_c`) with one C++ file that puts
them behind the CUTLASS library's entry points: `<name>_run(x, w, d, m, n, k, splits, ws,
ws_bytes, stream, flags)` (flags bit 0: the PDL build) and `<name>_workspace`. `link` makes the
shared library from them with the DSL's static runtime (`nvidia_cutlass_dsl/cu13/lib/`): the
objects are small, so only they cross to the GPU machine, not the DSL's compiler.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from microbench.cute_configs import CUTE_CONFIGS
from microbench.cutlass_configs import PROJECTIONS

LIBRARY = "libchorus_cute.so"


def _variant(config, proj: str, pdl: bool) -> str:
    return f"{config.name}_{proj}" + ("_pdl" if pdl else "")


def _fakes(n: int, k: int):
    """w (n, k, 1), x (t, k, 1), y (n, t, 1) over row-major W, X and Y; t is left to run time."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    t = cute.SymInt()
    w = make_fake_tensor(cutlass.BFloat16, (n, k, 1), (k, 1, n * k), assumed_align=16)
    x = make_fake_tensor(cutlass.BFloat16, (t, k, 1), (k, 1, cute.SymInt(divisibility=k)), assumed_align=16)
    y = make_fake_tensor(cutlass.BFloat16, (n, t, 1), (1, n, cute.SymInt(divisibility=n)), assumed_align=16)
    return w, x, y


def export(out: Path) -> int:
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    from microbench.cute_dsl.gemm import SmallStepGemm

    out.mkdir(parents=True, exist_ok=True)
    made, failed = [], []
    for c in CUTE_CONFIGS:
        for proj, (n, k) in PROJECTIONS.items():
            if not c.fits(n, k):
                continue
            for pdl in (False, True):
                name = _variant(c, proj, pdl)
                t0 = time.perf_counter()
                try:
                    fn = cute.compile(SmallStepGemm(c.tm, c.tn, pdl, c.ksplit, c.mcast), *_fakes(n, k),
                                      stream=cuda.CUstream(0))
                    fn.export_to_c(file_path=str(out), file_name=name, function_prefix=name)
                except Exception as exc:  # noqa: BLE001 (the DSL raises many kinds) a shape it refuses is left out, and said
                    failed.append(name)
                    print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr, flush=True)
                    continue
                made.append((c, proj, pdl, name))
                print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    (out / "chorus_cute.cc").write_text(_entry_points(out, made))
    (out / "configs.txt").write_text("".join(f"{c.name}\n" for c in CUTE_CONFIGS
                                             if any(m[0] == c for m in made)))
    print(f"{len(made)} kernels exported to {out}, {len(failed)} refused")
    return 0


def _tensor(header: str, struct: str, data: str, dynamic: dict[str, str]) -> str:
    """A C initialiser of an exported tensor struct: its pointer, then each dynamic field the
    header declares (which ones depend on the shapes and strides left to run time)."""
    body = header.split(f"}} {struct};")[0].rsplit("typedef struct {", 1)[1]
    fields = [f"{{{dynamic[f]}}}" for f in ("dynamic_shapes", "dynamic_strides") if f in body]
    return "{" + ", ".join([data, *fields]) + "}"


def _entry_points(out: Path, made: list) -> str:
    """C source: each configuration's `_run` picks the kernel of its projection (n, k), split
    and launch kind, and fills the exported wrappers' tensor structs from raw pointers."""
    lines = ['#include <stddef.h>', '#include <stdint.h>', '#include <cuda_runtime.h>']
    lines += [f'#include "{m[-1]}.h"' for m in made]
    lines.append('extern "C" {  /* C++ (the exported headers include cuda_fp16.h); plain C names */')
    for m in made:
        name = m[-1]
        header = (out / f"{name}.h").read_text()
        tw = _tensor(header, f"{name}_Tensor_w_t", "(void*)w", {})
        tx = _tensor(header, f"{name}_Tensor_x_t", "(void*)x", {"dynamic_shapes": "t",
                                                                 "dynamic_strides": "(int64_t)t * k"})
        ty = _tensor(header, f"{name}_Tensor_y_t", "d", {"dynamic_shapes": "t", "dynamic_strides": "(int64_t)n * t"})
        lines.append(f"static {name}_Kernel_Module_t {name}_module; static int {name}_loaded;")
        lines.append(
            f"static int {name}_call(const void* x, const void* w, void* d, int t, int n, int k, "
            f"cudaStream_t stream) {{\n"
            f"  if (!{name}_loaded) {{ {name}_Kernel_Module_Load(&{name}_module); {name}_loaded = 1; }}\n"
            f"  {name}_Tensor_w_t tw = {tw};\n"
            f"  {name}_Tensor_x_t tx = {tx};\n"
            f"  {name}_Tensor_y_t ty = {ty};\n"
            f"  return cute_dsl_{name}_wrapper(&{name}_module, &tw, &tx, &ty, stream);\n}}")
    by_config: dict = {}
    for c, proj, pdl, name in made:
        by_config.setdefault(c.name, []).append((PROJECTIONS[proj], pdl, name))
    for cname, variants in by_config.items():
        lines.append(f'size_t {cname}_workspace(int m, int n, int k, int splits) {{ return 0; }}')
        body = [f'int {cname}_run(const void* x, const void* w, void* d, int m, int n, int k, int splits, '
                f'void* ws, size_t ws_bytes, cudaStream_t stream, int flags) {{']
        for (pn, pk), pdl, name in variants:
            body.append(f'  if (n == {pn} && k == {pk} && splits == 1 && (flags & 1) == {int(pdl)}) '
                        f'return {name}_call(x, w, d, m, n, k, stream) ? 4 : 0;')
        body.append('  return 1;\n}')
        lines.append("\n".join(body))
    lines.append("int chorus_cute_load(void) {")
    lines += [f"  if (!{m[-1]}_loaded) {{ {m[-1]}_Kernel_Module_Load(&{m[-1]}_module); {m[-1]}_loaded = 1; }}"
              for m in made]
    lines.append("  return (int)cudaGetLastError();\n}\n}")
    return "\n".join(lines) + "\n"


def link(folder: Path, runtime: str, nvcc: str) -> int:
    kernels = sorted(str(p) for p in folder.glob("*.o") if p.name != "chorus_cute.o")
    entry = folder / "chorus_cute.o"
    for cmd in ([nvcc, "-c", "-x", "c++", "-Xcompiler", "-fPIC", str(folder / "chorus_cute.cc"), "-o", str(entry)],
                [nvcc, "-shared", str(entry), *kernels, runtime, "-lcudart", "-lcuda", "-o", str(folder / LIBRARY)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
            return 1
    objects = kernels
    print(f"wrote {folder / LIBRARY} ({len(objects)} kernels)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m microbench.cute_build", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("export", help="compile and export every kernel (needs nvidia-cutlass-dsl, no GPU)")
    e.add_argument("--out", required=True)
    k = sub.add_parser("link", help="link the exported kernels into one shared library (needs nvcc)")
    k.add_argument("--dir", required=True)
    k.add_argument("--runtime", required=True, help="the DSL's libcuda_dialect_runtime_static.a")
    k.add_argument("--nvcc", default="nvcc")
    args = p.parse_args(argv)
    if args.what == "export":
        return export(Path(args.out))
    return link(Path(args.dir), args.runtime, args.nvcc)


if __name__ == "__main__":
    raise SystemExit(main())
