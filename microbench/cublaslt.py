"""cuBLASLt through ctypes, for `python -m microbench.gemm_algos`: every algorithm the library's
heuristics list for a projection's shape, timed against `F.linear`'s own choice.

`F.linear` gets one kernel per shape from cuBLAS's heuristics; cuBLASLt lists several (other
tile shapes and rasterisations of the same Hopper kernel family). Torch offers no way to
choose among them on CUDA (its TunableOp tunes only on ROCm), hence this binding to the
library torch itself has loaded. Only algorithms needing no workspace are listed, so a call
shares nothing with any other whatever stream or graph it runs in.

Row-major `y (M, N) = x (M, K) @ w (N, K)^T` is column-major `y^T = op_T(w') @ x'`: A is the
weight (K x N, ld K, transposed), B the activation (K x M, ld K), D the output (N x M, ld N).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from microbench.sweeps import per_call_us

log = logging.getLogger(__name__)

_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_R_32F = 0  # cudaDataType_t CUDA_R_32F
_DATA_TYPES = {torch.bfloat16: 14, torch.float16: 2}  # CUDA_R_16BF, CUDA_R_16F
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE = 1  # cublasLtMatmulPreferenceAttributes_t
_OP_N, _OP_T = 0, 1
_CONFIG_ATTRS = {"id": 0, "tile": 1, "split_k": 2, "reduction": 3, "swizzle": 4, "stages": 6}


class CublasLtError(RuntimeError):
    """A cuBLASLt call returned a status other than success."""


class Algo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: opaque, plain data."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _loaded_library() -> str | None:
    """Path of the libcublasLt torch has loaded, so both share one copy."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if "libcublasLt.so" in path:
                    return path
    except OSError:
        pass
    return None


class CublasLt:
    """The library, one handle and one shape-free matmul description per dtype."""

    def __init__(self, device: torch.device):
        self.device = device
        one = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
        torch.mm(one, one)  # torch loads cuBLAS and cuBLASLt on first use
        self.path = _loaded_library() or "libcublasLt.so"
        lib = self.lib = ctypes.CDLL(self.path)
        vp, sz, i32, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64
        argtypes = {  # every call's C signature, so sizes go as size_t and handles as pointers
            "cublasLtCreate": [vp],
            "cublasLtMatmulDescCreate": [vp, i32, i32],
            "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatrixLayoutCreate": [vp, i32, u64, u64, ctypes.c_int64],
            "cublasLtMatrixLayoutDestroy": [vp],
            "cublasLtMatmulPreferenceCreate": [vp],
            "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatmulPreferenceDestroy": [vp],
            "cublasLtMatmulAlgoGetHeuristic": [vp] * 7 + [i32, vp, vp],
            "cublasLtMatmulAlgoConfigGetAttribute": [vp, i32, vp, sz, vp],
            "cublasLtMatmul": [vp] * 14 + [sz, vp],
        }
        for name, types in argtypes.items():
            getattr(lib, name).argtypes = types
        lib.cublasLtGetVersion.restype = sz
        self.version = int(lib.cublasLtGetVersion())
        self.handle = vp()
        self.check(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self._descs: dict[torch.dtype, ctypes.c_void_p] = {}
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise CublasLtError(f"{what} failed with cuBLAS status {status}")

    def desc(self, dtype: torch.dtype) -> ctypes.c_void_p:
        """y^T = op_T(A) @ B in float32 accumulation (the same for every shape)."""
        if dtype not in self._descs:
            desc = ctypes.c_void_p()
            self.check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F),
                       "cublasLtMatmulDescCreate")
            for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
                val = ctypes.c_int32(op)
                self.check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(val), 4),
                           "cublasLtMatmulDescSetAttribute")
            self._descs[dtype] = desc
        return self._descs[dtype]

    def layout(self, dtype: torch.dtype, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), _DATA_TYPES[dtype], rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
        return out

    def config(self, algo: Algo) -> dict:
        """What an algorithm is (tile, split-K, stages...), for reports; -1 where unreadable."""
        out = {}
        for name, attr in _CONFIG_ATTRS.items():
            val, written = ctypes.c_uint32(), ctypes.c_size_t()
            status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(algo), attr, ctypes.byref(val), ctypes.sizeof(val), ctypes.byref(written))
            out[name] = int(val.value) if status == 0 else -1
        return out


class LtGemm:
    """`y = x @ w.T` for one shape (m rows, n out features, k in features, dtype)."""

    def __init__(self, lt: CublasLt, m: int, n: int, k: int, dtype: torch.dtype):
        self.lt, self.m, self.n, self.k, self.dtype = lt, m, n, k, dtype
        self.desc = lt.desc(dtype)
        self.a = lt.layout(dtype, k, n, k)
        self.b = lt.layout(dtype, k, m, k)
        self.d = lt.layout(dtype, n, m, n)

    def close(self) -> None:
        """Free the layouts (the shared description stays with the library object)."""
        for layout in (self.a, self.b, self.d):
            self.lt.lib.cublasLtMatrixLayoutDestroy(layout)
        self.a = self.b = self.d = None

    def candidates(self, count: int = 16) -> list[Algo]:
        """The heuristics' list for this shape, best guess first."""
        lt = self.lt
        pref = ctypes.c_void_p()
        lt.check(lt.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(0)
            lt.check(lt.lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws), 8),
                     "cublasLtMatmulPreferenceSetAttribute")
            results = (_HeuristicResult * count)()
            found = ctypes.c_int()
            lt.check(lt.lib.cublasLtMatmulAlgoGetHeuristic(lt.handle, self.desc, self.a, self.b, self.d, self.d,
                                                           pref, count, results, ctypes.byref(found)),
                     "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lt.lib.cublasLtMatmulPreferenceDestroy(pref)
        return [Algo.from_buffer_copy(bytes(results[i].algo)) for i in range(found.value) if results[i].state == 0]

    def run(self, x: torch.Tensor, w: torch.Tensor, algo: Algo) -> torch.Tensor:
        """y = x @ w.T on the current stream; x and w contiguous, 256-byte aligned (as torch
        allocates them), x (m, k) and w (n, k)."""
        out = torch.empty((self.m, self.n), dtype=self.dtype, device=x.device)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        lt = self.lt
        lt.check(lt.lib.cublasLtMatmul(
            lt.handle, self.desc, ctypes.byref(lt.alpha), w.data_ptr(), self.a, x.data_ptr(), self.b,
            ctypes.byref(lt.beta), out.data_ptr(), self.d, out.data_ptr(), self.d, ctypes.byref(algo),
            None, 0, stream), "cublasLtMatmul")
        return out


@dataclass
class TuneResult:
    """One shape's timings: F.linear's, each candidate's (inf: refused), the fastest one's."""

    m: int
    n: int
    k: int
    default_us: float
    candidates_us: list[float]
    best_index: int = -1  # the fastest candidate; -1: none ran
    bitwise_equal: bool = True  # the fastest candidate's output is F.linear's, bit for bit
    config: dict | None = None

    @property
    def best_us(self) -> float:
        return self.candidates_us[self.best_index] if self.best_index >= 0 else self.default_us

    @property
    def speedup(self) -> float:
        """F.linear's time over the fastest candidate's (above 1: a candidate beats it)."""
        return self.default_us / self.best_us


def tune(lt: CublasLt, weights: list[torch.Tensor], m: int, *, iters: int = 20, max_candidates: int = 16) -> TuneResult:
    """Time F.linear and each cuBLASLt candidate at `m` rows, one call per weight in `weights`
    (several layers' weights, so they stream from memory as in a step)."""
    n, k = weights[0].shape
    dtype, dev = weights[0].dtype, weights[0].device
    x = torch.randn(m, k, device=dev, dtype=dtype)
    calls = len(weights)

    def cycling(gemm_call):
        """A no-argument call that takes the next layer's weight each time: `calls` of them in a
        graph use each weight once."""
        turn = itertools.cycle(weights)
        return lambda: gemm_call(next(turn))

    default_us = per_call_us(cycling(lambda w: F.linear(x, w)), reps=calls, iters=iters)
    gemm = LtGemm(lt, m, n, k, dtype)
    try:
        cands = gemm.candidates(max_candidates)
        times = []
        for algo in cands:
            try:
                times.append(per_call_us(cycling(lambda w, a=algo: gemm.run(x, w, a)), reps=calls, iters=iters))
            except (CublasLtError, RuntimeError) as exc:  # a candidate the shape or the capture refuses
                log.debug("cuBLASLt candidate refused at %dx%dx%d: %s", m, n, k, exc)
                times.append(float("inf"))
        result = TuneResult(m, n, k, default_us, times)
        if times and min(times) < float("inf"):
            best = min(range(len(times)), key=times.__getitem__)
            expected, got = F.linear(x, weights[0]), gemm.run(x, weights[0], cands[best])
            result.best_index, result.config = best, lt.config(cands[best])
            result.bitwise_equal = bool(torch.equal(got, expected))
        return result
    finally:
        gemm.close()
