"""The CuTe DSL GEMM configurations `microbench.cutlass_gemm --kind cute` sweeps (pure logic: no
GPU, no DSL). Each is `microbench/cute_dsl/gemm.py`'s kernel with one tile shape, exported ahead
of time by `microbench.cute_build` behind the same C entry points as the CUTLASS C++ library
(`<name>_run`, `<name>_workspace`), so one harness times both.

Always swap-AB (the weights are the WGMMA's M side): `tm` weight rows and `tn` tokens a CTA.
`ksplit`: a cluster of that many CTAs shares one output tile, each a share of k, their fp32
partial tiles summed through distributed shared memory (bf16 out, no second kernel).
`mcast`: a cluster of that many CTAs (neighbouring weight rows) loads the token tile once,
each a share of it multicast to all.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CuteConfig:
    tm: int
    tn: int
    ksplit: int = 1
    mcast: int = 1
    partials = False  # bf16 out always (the harness also times fp32-partial kernels)

    @property
    def name(self) -> str:
        return (f"dsl_sw_{self.tm}x{self.tn}" + (f"_k{self.ksplit}" if self.ksplit > 1 else "")
                + (f"_m{self.mcast}" if self.mcast > 1 else ""))

    def splits(self, projection: str, rows: int) -> tuple[int, ...]:
        """The harness's split count (fp32 partials): none here, the k split is in the cluster."""
        return (1,)

    def fits(self, n: int, k: int) -> bool:
        """Whether k's 64-wide tiles share out evenly over a k split, and the weight rows' tiles
        over a multicast cluster."""
        return (k // 64) % self.ksplit == 0 and (n // self.tm) % self.mcast == 0


CUTE_CONFIGS: tuple[CuteConfig, ...] = tuple(
    # 80 and 96 tokens: a fast-start step in two tiles, as cuBLAS's own kernels take it (72)
    [CuteConfig(64, tn) for tn in (64, 80, 96, 128, 144, 192, 256)]
    + [CuteConfig(128, tn) for tn in (64, 128, 144, 192)]
    + [CuteConfig(64, 144, s) for s in (2, 4, 8)]
    + [CuteConfig(64, tn, s) for tn in (80, 96, 192) for s in (2, 4)]
    + [CuteConfig(64, tn, mcast=2) for tn in (80, 96, 128, 144, 192)]
    + [CuteConfig(64, 128, mcast=4), CuteConfig(128, 144, mcast=2), CuteConfig(128, 192, mcast=2)]
)
