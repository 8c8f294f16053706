"""TunedLinear: `F.linear` with, per projection and row count, the cuBLASLt algorithm that
timed fastest on this GPU when the backbone was made (`cublaslt.py`).

Tuned once at start for each row count a step graph can have from `TUNE_MIN_ROWS` up, and for
a few classes of the larger, eager steps; below that the GEMMs sit at their latency floor and
no candidate beat cuBLAS's own choice on an H200. A step of any other row count uses the
algorithm of the nearest tuned count at or above it (checked to support the shape), or
`F.linear` where that count kept it. Only candidates giving `F.linear`'s output bit for bit
are kept, so turning this on or off (`CHORUS_GEMM_TUNING=0`) changes time, never numbers.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

TUNE_MIN_ROWS = 768
EAGER_ROW_CLASSES = (12288, 16384, 24576, 32768)
MIN_GAIN = 0.03  # a candidate must beat F.linear by this much to replace it
MAX_CACHED_SHAPES = 512  # row counts met outside the tuned ones, kept per (n, k)


def weights_timed(m: int) -> int:
    """Layers' weights a timing cycles through: enough that they stream from memory as in a
    step (8 x 8 MiB and more exceeds the L2), fewer where one call is long already."""
    return 8 if m <= 8192 else 2


class TunedLinear:
    """Callable as `F.linear(x, w)` for 2-D bias-free projections."""

    def __init__(self, lt, plans: dict[tuple[int, int, torch.dtype], list[tuple[int, object]]]):
        """`plans`: per (n, k, dtype), (rows, algorithm or None for F.linear) sorted by rows."""
        self.lt = lt
        self.plans = {key: sorted(rows, key=lambda r: r[0]) for key, rows in plans.items()}
        self._exact: dict[tuple, tuple | None] = {}
        self._other: OrderedDict[tuple, tuple | None] = OrderedDict()
        self.summary: dict = {"replaced": {f"{n}x{k}": [m for m, algo in rows if algo is not None]
                                           for (n, k, _), rows in self.plans.items()}}

    @classmethod
    def tuned(cls, device: torch.device, weights: dict[tuple[int, int], list[torch.Tensor]],
              rows: Iterable[int]) -> TunedLinear:
        """Tune every shape in `weights` ((n, k) -> the layers' weights) at every count in `rows`."""
        from server.engine.cublaslt import CublasLt, tune

        lt = CublasLt(device)
        started = time.perf_counter()
        plans, replaced = {}, 0
        for (n, k), ws in weights.items():
            key = (n, k, ws[0].dtype)
            plans[key] = []
            for m in sorted(set(rows)):
                result = tune(lt, ws[:weights_timed(m)], m, min_gain=MIN_GAIN)
                plans[key].append((m, result.algo))
                replaced += result.algo is not None
        seconds = time.perf_counter() - started
        log.info("GEMM tuning: %d of %d (shape, rows) pairs use another cuBLASLt algorithm (%.1f s)",
                 replaced, sum(len(p) for p in plans.values()), seconds)
        tuned = cls(lt, plans)
        tuned.summary["seconds"] = round(seconds, 2)
        return tuned

    def _make_gemm(self, m: int, n: int, k: int, dtype: torch.dtype):
        from server.engine.cublaslt import LtGemm

        return LtGemm(self.lt, m, n, k, dtype)

    def plan_for(self, m: int, n: int, k: int, dtype: torch.dtype) -> tuple | None:
        """(gemm, algorithm) for this shape, or None for F.linear."""
        key = (m, n, k, dtype)
        if key in self._exact:
            return self._exact[key]
        if key in self._other:
            self._other.move_to_end(key)
            return self._other[key]
        rows = self.plans.get((n, k, dtype))
        if not rows or m < rows[0][0]:
            plan = None
        else:
            i = min(bisect_left([r for r, _ in rows], m), len(rows) - 1)
            tuned_rows, algo = rows[i]
            plan = None if algo is None else self._checked(m, n, k, dtype, algo)
            if tuned_rows == m:  # graph buckets: kept for good
                self._exact[key] = plan
                return plan
        self._other[key] = plan
        if len(self._other) > MAX_CACHED_SHAPES:
            _, old = self._other.popitem(last=False)
            if old is not None:
                old[0].close()
        return plan

    def _checked(self, m, n, k, dtype, algo) -> tuple | None:
        gemm = self._make_gemm(m, n, k, dtype)
        if gemm.supports(algo):
            return gemm, algo
        gemm.close()
        return None

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            plan = self.plan_for(x.shape[0], w.shape[0], w.shape[1], x.dtype)
            if plan is not None and plan[0].fits(x, w):
                return plan[0].run(x, w, plan[1])
        return F.linear(x, w)
