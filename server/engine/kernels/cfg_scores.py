"""A step's CFG scoring in one pass over half-precision logits (Triton, CUDA).

One program per (conditional row, codebook) reads the row's two logit vectors once and writes
only the confidence and the predicted id, with the torch path's float32 arithmetic (only the
order of each sum differs). Used for steps where every item does CFG and none samples classes,
when `check()` passes (docs/architecture.md, "Kernels").
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from server.engine.kernels.sampling_ops import best_unmasked, cfg_mix
from server.engine.kernels.triton_env import INTERPRET as _INTERPRET, kernels_can_run

log = logging.getLogger(__name__)

try:  # Triton is optional: CPU installs keep the torch path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

CONFIDENCE_LIMIT = 1e-4  # max |difference| of a confidence (values are ~ -1..-20)
AGREEMENT_LIMIT = 0.999  # share of predicted ids equal to the torch path's

if triton is not None:
    from server.engine.kernels.triton_libm import libm_exp as _exp, libm_log as _log

    @triton.jit
    def _log_softmax(x, INTERPRET: tl.constexpr):
        """Log-softmax of a block whose every lane is a column."""
        shifted = x - tl.max(x, axis=0)
        return shifted - _log(tl.sum(_exp(shifted, INTERPRET), axis=0), INTERPRET)

    @triton.jit
    def _log_softmax_split(x, t, keep_t, INTERPRET: tl.constexpr):
        """Log-softmax of one vector held as a head block `x` (every lane a column) and a tail
        block `t` (lanes past the vector's end masked by `keep_t`)."""
        top = tl.maximum(tl.max(x, axis=0), tl.max(t, axis=0))
        x = x - top
        t = t - top
        total = tl.sum(_exp(x, INTERPRET), axis=0) + tl.sum(tl.where(keep_t, _exp(t, INTERPRET), 0.0), axis=0)
        log_total = _log(total, INTERPRET)
        return x - log_total, t - log_total

    @triton.jit
    def _cfg_mix(lc, lu, s, keep):
        """`lc + s * (lc - lu)` of one block, lanes past the end at -inf."""
        return tl.where(keep, lc + s * (lc - lu), -float("inf"))

    @triton.jit
    def _best(out, keep, offs, MASK_ID):
        """A block's (has NaN, maximum, first index of it), MASK and lanes past the end out.
        NaNs rank lowest (a row with one fails whatever is picked; an all-NaN block has an index)."""
        nan = out != out
        out = tl.where(keep & (offs != MASK_ID) & ~nan, out, -float("inf"))
        return tl.max(nan.to(tl.int32), axis=0) > 0, tl.max(out, axis=0), tl.argmax(out, axis=0)

    # the conditional rows' count changes step to step: no variant compiled per divisibility of it
    @triton.jit(do_not_specialize=["uncond_offset"])
    def _cfg_scores_kernel(logits, scale, confidence, predicted, uncond_offset, V, MASK_ID, C: tl.constexpr,
                           HEAD: tl.constexpr, TAIL: tl.constexpr, INTERPRET: tl.constexpr):
        """One (conditional row, codebook) a program. The row's V columns are a HEAD block
        and, when V is not a power of two, a TAIL block after it: 1025 columns are 1024 + 1
        lanes instead of 2048, half of them masked, each paying three `expf`s."""
        pid = tl.program_id(0).to(tl.int64)  # conditional row * C + codebook
        row_c = logits + pid * V
        row_u = logits + (pid + uncond_offset) * V
        offs = tl.arange(0, HEAD)
        keep = offs < V
        x = tl.load(row_c + offs, mask=keep, other=-float("inf")).to(tl.float32)
        u = tl.load(row_u + offs, mask=keep, other=-float("inf")).to(tl.float32)
        s = tl.load(scale + pid // C)
        if TAIL > 0:
            offs_t = HEAD + tl.arange(0, TAIL)
            keep_t = offs_t < V
            x_t = tl.load(row_c + offs_t, mask=keep_t, other=-float("inf")).to(tl.float32)
            u_t = tl.load(row_u + offs_t, mask=keep_t, other=-float("inf")).to(tl.float32)
            lc, lc_t = _log_softmax_split(x, x_t, keep_t, INTERPRET)
            lu, lu_t = _log_softmax_split(u, u_t, keep_t, INTERPRET)
            out, out_t = _log_softmax_split(_cfg_mix(lc, lu, s, keep),
                                            _cfg_mix(lc_t, lu_t, s, keep_t), keep_t, INTERPRET)
            has_nan, best, index = _best(out, keep, offs, MASK_ID)
            nan_t, best_t, index_t = _best(out_t, keep_t, offs_t, MASK_ID)
            has_nan = has_nan | nan_t
            index = tl.where(best_t > best, HEAD + index_t, index)  # the first maximum on ties
            best = tl.maximum(best, best_t)
        else:
            lc = _log_softmax(x, INTERPRET)  # lanes past the end hold -inf: exp gives 0
            lu = _log_softmax(u, INTERPRET)
            out = _log_softmax(_cfg_mix(lc, lu, s, keep), INTERPRET)
            has_nan, best, index = _best(out, keep, offs, MASK_ID)
        tl.store(confidence + pid, tl.where(has_nan, float("nan"), best))
        tl.store(predicted + pid, index.to(tl.int64))


available = kernels_can_run  # whether this kernel can run on a device


# Few programs hide latency with more warps; many run best on one (the sweep's choice).
FEW_PROGRAMS = 1024  # programs (rows x codebooks) below which a program gets FEW_PROGRAMS_WARPS
FEW_PROGRAMS_WARPS = 4
MANY_PROGRAMS_WARPS = 1


def warps_for(programs: int) -> int:
    """Warps a program for a step of `programs` (conditional rows x codebooks)."""
    return FEW_PROGRAMS_WARPS if programs < FEW_PROGRAMS else MANY_PROGRAMS_WARPS


def blocks(v: int, split: bool = True) -> tuple[int, int]:
    """(HEAD, TAIL) lanes for V columns: the largest power of two up to V and the tail's next
    power of two (0 when V is one), or, unsplit, one block of V's next power of two."""
    if not split or v & (v - 1) == 0:
        return triton.next_power_of_2(v), 0
    head = 1 << (v.bit_length() - 1)
    return head, triton.next_power_of_2(v - head)


def cfg_scores(logits: torch.Tensor, n_cond: int, scale: torch.Tensor, mask_id: int, *,
               num_warps: int | None = None, split: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (2 n_cond, C, V) half (conditional rows, then each one's unconditional row in
    the same order), scale (n_cond,) float32 -> confidence (n_cond, C) float32 and
    predicted (n_cond, C) int64, as `reference` computes them. `num_warps` defaults to
    `warps_for` the step; `split=False` reads each row as one block of V's next power of two
    (the kernel's earlier shape)."""
    rows, c, v = logits.shape
    assert rows == 2 * n_cond and logits.is_contiguous() and scale.numel() == n_cond
    confidence = torch.empty((n_cond, c), dtype=torch.float32, device=logits.device)
    predicted = torch.empty((n_cond, c), dtype=torch.int64, device=logits.device)
    if n_cond:
        head, tail = blocks(v, split)
        _cfg_scores_kernel[(n_cond * c,)](
            logits, scale.reshape(-1).float().contiguous(), confidence, predicted, n_cond * c, v, mask_id, C=c,
            HEAD=head, TAIL=tail, INTERPRET=_INTERPRET, num_warps=num_warps or warps_for(n_cond * c),
            enable_fp_fusion=False,
        )
    return confidence, predicted


def reference(logits: torch.Tensor, n_cond: int, scale: torch.Tensor, mask_id: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's torch path for an all-CFG step, from its own functions (the yardstick of
    `check` and the tests)."""
    logits = logits.float()
    cond = F.log_softmax(logits[:n_cond], dim=-1)
    uncond = F.log_softmax(logits[n_cond:], dim=-1)
    return best_unmasked(cfg_mix(cond, uncond, scale.reshape(-1, 1, 1)), mask_id)


def check(device, dtype: torch.dtype = torch.bfloat16, num_codebooks: int = 8, vocab: int = 1025,
          mask_id: int = 1024, rows: int = 96) -> dict:
    """The kernel against `reference` on random logits: max |confidence difference| and the
    share of equal predicted ids; raises when the kernel cannot run."""
    if not available(device):
        raise RuntimeError(f"the CFG scoring kernel cannot run on {device}")
    gen = torch.Generator(device="cpu").manual_seed(11)
    logits = (torch.randn(2 * rows, num_codebooks, vocab, generator=gen) * 4).to(device, dtype)
    scale = torch.empty(rows).uniform_(0.5, 4.0, generator=gen).to(device)
    conf, pred = cfg_scores(logits, rows, scale, mask_id)
    want_conf, want_pred = reference(logits, rows, scale, mask_id)
    return {"confidence_max_abs_diff": float((conf - want_conf).abs().max()),
            "predicted_agreement": float((pred == want_pred).float().mean())}


def passes(result: dict) -> bool:
    return (result["confidence_max_abs_diff"] <= CONFIDENCE_LIMIT
            and result["predicted_agreement"] >= AGREEMENT_LIMIT)
