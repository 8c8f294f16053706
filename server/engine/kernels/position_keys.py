"""The tail of a step's scoring in one launch: position noise, layer penalty, temperature,
finiteness flags and the mask-aware selection key (Triton, CUDA).

Operation for operation the torch path's float32 arithmetic (`sampling_ops`), each rounded on
its own, so the keys are bit-identical; the sampler uses it only when `check()` finds them equal.
"""

from __future__ import annotations

import torch

from server.engine.kernels.sampling_ops import gumbel_, selection_key
from server.engine.kernels.triton_env import INTERPRET as _INTERPRET, kernels_can_run

try:  # Triton is optional: CPU installs keep the torch path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

BLOCK_ROWS = 128

if triton is not None:
    from server.engine.kernels.triton_libm import ieee_div as _div, libm_log as _logf

    @triton.jit
    def _isfinite(x):
        return (x == x) & (tl.abs(x) != float("inf"))

    # A step's row count and the strides of its views change with the texts' lengths: Triton
    # would compile a variant of the kernel for each new divisibility or alignment of them
    # (hundreds of ms, on some request's path to its first sound); this kernel moves a few KB
    # and gains nothing from such hints, so none is taken.
    @triton.jit(do_not_specialize=["rows", "su_r", "su_c", "st_r", "st_c", "sk_r", "sk_c"],
                do_not_specialize_on_alignment=["conf", "pred", "unif", "pen", "temp", "tok", "key_out", "pred_out",
                                                "finite_out"])
    def _position_keys_kernel(conf, pred, unif, pen, temp, tok, key_out, pred_out, finite_out,
                              rows, vocab_last, mask_id, big,
                              su_r, su_c, st_r, st_c, sk_r, sk_c,
                              C: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
        row = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
        r = row[:, None]
        c = tl.arange(0, C)[None, :]
        ok = r < rows
        m = ok & (c < C)
        x = tl.load(conf + r * C + c, mask=m, other=0.0)
        finite = tl.min(tl.where(_isfinite(x), 1, 0), axis=1)
        # the reference's Gumbel noise: -log(-log(u + 1e-10) + 1e-10), one rounding per op
        g = tl.load(unif + r * su_r + c * su_c, mask=m, other=0.5)
        g = -_logf(g + 1e-10, INTERPRET)
        g = -_logf(g + 1e-10, INTERPRET)
        s = x - tl.load(pen + r * C + c, mask=m, other=0.0)
        s = _div(s, tl.load(temp + r, mask=ok, other=1.0), INTERPRET)
        s = s + g
        revealed = tl.load(tok + r * st_r + c * st_c, mask=m, other=0) != mask_id
        finite = finite & tl.min(tl.where(_isfinite(tl.where(revealed, 0.0, s)), 1, 0), axis=1)
        key = tl.where(s != s, -big, tl.where(s == float("inf"), big, tl.where(s == -float("inf"), -big, s)))
        key = tl.where(revealed, -float("inf"), key)
        ids = tl.load(pred + r * C + c, mask=m, other=0)
        ids = tl.minimum(tl.maximum(ids, 0), vocab_last)
        tl.store(key_out + r * sk_r + c * sk_c, key, mask=m)
        tl.store(pred_out + r * sk_r + c * sk_c, ids, mask=m)
        tl.store(finite_out + row, finite != 0, mask=row < rows)


available = kernels_can_run  # whether this kernel can run on a device


def position_keys(confidence: torch.Tensor, predicted: torch.Tensor, uniform: torch.Tensor,
                  row_penalty: torch.Tensor, row_temp: torch.Tensor, tokens: torch.Tensor, mask_id: int,
                  vocab: int, codebook_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """confidence (rows, C) float32, predicted (rows, C) int64, uniform (rows, C) draws,
    row_penalty (rows, C), row_temp (rows, 1), tokens (rows, C) the canvas -> the selection
    key (float32), the clamped ids (int64), both (rows, C) or, `codebook_major`, (C, rows)
    contiguous, and the finiteness flag of every row; as `reference` computes them."""
    rows, c = confidence.shape
    confidence, predicted = confidence.contiguous(), predicted.contiguous()
    shape = (c, rows) if codebook_major else (rows, c)
    key = torch.empty(shape, dtype=torch.float32, device=confidence.device)
    ids = torch.empty(shape, dtype=torch.int64, device=confidence.device)
    finite = torch.empty(rows, dtype=torch.bool, device=confidence.device)
    if rows:
        sk_r, sk_c = (1, rows) if codebook_major else (c, 1)
        _position_keys_kernel[(triton.cdiv(rows, BLOCK_ROWS),)](
            confidence, predicted, uniform, row_penalty.contiguous(), row_temp.contiguous(), tokens, key, ids, finite,
            rows, vocab - 1, mask_id, torch.finfo(torch.float32).max,
            uniform.stride(0), uniform.stride(1), tokens.stride(0), tokens.stride(1), sk_r, sk_c,
            C=c, BLOCK=BLOCK_ROWS, INTERPRET=_INTERPRET, num_warps=4, enable_fp_fusion=False,
        )
    return key, ids, finite


def reference(confidence: torch.Tensor, predicted: torch.Tensor, uniform: torch.Tensor, row_penalty: torch.Tensor,
              row_temp: torch.Tensor, tokens: torch.Tensor, mask_id: int, vocab: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampler's torch path (rows, C), from its own functions, on copies of the inputs."""
    predicted = predicted.clone()
    key, finite = selection_key(confidence.clone(), gumbel_(uniform.clone()), row_penalty, row_temp, predicted,
                                tokens, mask_id, vocab)
    return key, predicted, finite


def check(device, num_codebooks: int = 8, vocab: int = 1025, mask_id: int = 1024, rows: int = 300) -> dict:
    """The kernel against `reference` on random inputs with NaN, infinities, huge and tiny
    values and revealed positions, in both layouts: how many keys, ids and row flags differ
    and the largest key difference (`passes` wants none); raises when it cannot run."""
    rows = max(rows, 14)  # room for the planted values below
    if not available(device):
        raise RuntimeError(f"the position-key kernel cannot run on {device}")
    gen = torch.Generator(device="cpu").manual_seed(5)
    c = num_codebooks
    confidence = -torch.rand(rows, c, generator=gen) * 20
    confidence[3, 1 % c], confidence[5, 2 % c], confidence[7, 0] = float("nan"), float("inf"), -float("inf")
    confidence[9, 4 % c] = -3e38
    predicted = torch.randint(-3, vocab + 3, (rows, c), generator=gen)
    uniform = torch.rand(c, rows, generator=gen).t()  # drawn (C, T) and laid out by rows, as the sampler does
    uniform[0, 0], uniform[1, 1] = 0.0, 1.0 - 2**-24
    penalty = torch.arange(c, dtype=torch.float32) * (torch.rand(rows, 1, generator=gen) * 10)
    penalty[11, 3 % c] = 3e38
    temp = torch.rand(rows, 1, generator=gen) * 8 + 0.01
    temp[13, 0] = 1e-30  # a temperature this small overflows the scores to infinity
    tokens = torch.randint(0, vocab, (c, rows), generator=gen).t()
    tokens[torch.rand(rows, c, generator=gen) < 0.5] = mask_id
    args = [t.to(device) for t in (confidence, predicted, uniform, penalty, temp, tokens)]
    want_key, want_ids, want_finite = reference(*args, mask_id, vocab)
    out = {"key_mismatches": 0, "id_mismatches": 0, "flag_mismatches": 0, "key_max_abs_diff": 0.0}
    for major in (False, True):
        key, ids, finite = position_keys(*args, mask_id, vocab, codebook_major=major)
        if major:
            key, ids = key.t(), ids.t()
        same = (key == want_key) | (key.isnan() & want_key.isnan())
        out["key_mismatches"] += int((~same).sum())
        out["id_mismatches"] += int((ids != want_ids).sum())
        out["flag_mismatches"] += int((finite != want_finite).sum())
        both = torch.isfinite(key) & torch.isfinite(want_key)
        if both.any():
            out["key_max_abs_diff"] = max(out["key_max_abs_diff"], float((key - want_key)[both].abs().max()))
    return out


def passes(result: dict) -> bool:
    """Bit-identical keys, ids and flags: the kernel may replace the torch path."""
    return result["key_mismatches"] == result["id_mismatches"] == result["flag_mismatches"] == 0
