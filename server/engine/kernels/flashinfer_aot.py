"""Build the FlashInfer kernels Chorus uses ahead of time, so no request waits on nvcc.

`python -m server.engine.kernels.flashinfer_aot` compiles exactly Chorus's kernels for the
architectures in `FLASHINFER_CUDA_ARCH_LIST` (default `9.0a`) where FlashInfer looks first.
It needs nvcc, not a GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path


def chorus_jit_specs(backend: str = "fa3") -> list:
    import torch  # lazy: this build tool's dependencies load when it runs
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.attention import gen_batch_prefill_module
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module

    specs = [
        gen_batch_prefill_module(backend, dtype, dtype, dtype, torch.int32, 128, 128, 0, False, False, False)
        for dtype in (torch.float16, torch.bfloat16)
    ]
    return specs + [gen_norm_module(), gen_rope_module(), gen_act_and_mul_module("silu")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fa3", choices=["fa2", "fa3"],
                        help="fa3 for Hopper (sm90), fa2 elsewhere")
    args = parser.parse_args(argv)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")

    from flashinfer.jit import build_jit_specs, env as jit_env  # lazy: as above

    specs = chorus_jit_specs(args.backend)
    build_jit_specs(specs, verbose=True, skip_prebuilt=False)
    for spec in specs:
        target: Path = spec.aot_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(jit_env.FLASHINFER_JIT_DIR / spec.name / f"{spec.name}.so", target)
        print("installed", target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
