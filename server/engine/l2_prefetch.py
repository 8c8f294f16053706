"""Weights pulled into the GPU's L2 cache ahead of the GEMMs of a small step (Hopper, Triton).

A small step's projections read each layer's ~31 MB of weights from HBM once, with so few
rows that cuBLAS runs 32-80 tiles: too few loads in flight to reach HBM's bandwidth (at 128
rows the QKV projection moves its 8 MB at ~1.5 TB/s). Weights already in L2 arrive several
times faster. So while a layer's other kernels run, a tiny kernel asks the copy engine for
the weights the next GEMMs will read (`cp.async.bulk.prefetch.L2`, sm_90): it issues the
requests and exits, the copies go on in the background, nothing waits for them, and the
results cannot change (a prefetch moves no data anyone reads). What is prefetched is sized to
stay well inside L2 (50 MB on an H100/H200) beside the weights in use.
"""

from __future__ import annotations

import torch

try:  # Triton is optional: without it nothing is prefetched
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

CHUNK_BYTES = 16 * 1024  # one bulk prefetch request; a multiple of 16, as the instruction needs
LANES = 128  # requests per program


if triton is not None:

    @triton.jit
    def _prefetch_chunks(ptr, chunks, tail, lane, CHUNK: tl.constexpr):
        """Lane i asks for bytes [i * CHUNK, ...) of ptr's buffer: CHUNK of them, `tail` for
        the last chunk, none past the end."""
        size = tl.where(lane < chunks - 1, CHUNK, tl.where(lane == chunks - 1, tail, 0)).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr.to(tl.pointer_type(tl.int8)) + lane.to(tl.int64) * CHUNK, size], dtype=tl.int32,
            is_pure=False, pack=1)

    @triton.jit
    def _prefetch_kernel(a_ptr, a_chunks, a_tail, b_ptr, b_chunks, b_tail, CHUNK: tl.constexpr,
                         LANES: tl.constexpr):
        """Program p asks for chunks [p * LANES, (p + 1) * LANES) of a and of b."""
        lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
        _prefetch_chunks(a_ptr, a_chunks, a_tail, lane, CHUNK)
        _prefetch_chunks(b_ptr, b_chunks, b_tail, lane, CHUNK)


def chunks_of(nbytes: int, chunk: int = CHUNK_BYTES) -> tuple[int, int]:
    """(requests, bytes of the last one) covering `nbytes`, the last rounded up to 16."""
    if nbytes <= 0:
        return 0, 0
    count = -(-nbytes // chunk)
    tail = nbytes - (count - 1) * chunk
    return count, -(-tail // 16) * 16


def available(device: torch.device | None) -> bool:
    """Triton is here and the device is a Hopper GPU (the instruction is sm_90's)."""
    return (triton is not None and device is not None and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] == 9)


def prefetch(a: torch.Tensor, b: torch.Tensor) -> None:
    """Ask for two contiguous tensors to be brought into L2; returns at once."""
    a_chunks, a_tail = chunks_of(a.numel() * a.element_size())
    b_chunks, b_tail = chunks_of(b.numel() * b.element_size())
    programs = -(-max(a_chunks, b_chunks) // LANES)
    if programs:
        _prefetch_kernel[(programs,)](a, a_chunks, a_tail, b, b_chunks, b_tail, CHUNK=CHUNK_BYTES, LANES=LANES,
                                      num_warps=4)


class L2Prefetcher:
    """Prefetches for the forward of steps of at most `max_rows` rows, on the step's stream
    (`same`) or on a side stream joined at the end of the forward (`side`), or never (`off`)."""

    def __init__(self, device: torch.device, mode: str = "off", max_rows: int = 0):
        if mode not in ("off", "same", "side"):
            raise ValueError(f"L2 prefetch mode {mode!r}: off, same or side")
        self.mode = mode if available(device) and max_rows > 0 else "off"
        self.max_rows = max_rows
        self._side = torch.cuda.Stream(device) if self.mode == "side" else None
        self._forked = False

    def active(self, rows: int) -> bool:
        return self.mode != "off" and rows <= self.max_rows

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        if self._side is None:
            prefetch(a, b)
            return
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            prefetch(a, b)
        self._forked = True

    def join(self) -> None:
        """Rejoin the side stream (a CUDA graph's capture must end with every fork joined)."""
        if self._forked:
            torch.cuda.current_stream().wait_stream(self._side)
            self._forked = False
