"""Qwen3's per-head q/k RMSNorm and RoPE in one pass over the fused QKV output (Triton).

Each q and k head is loaded once, normalised in float32, rotated and written contiguous; V is
never touched. Two program layouts (`ProgramShape`: `heads` for small steps, `tokens` for large
ones) are chosen by step size; the backbone uses the kernel only when `check()` passes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

try:  # Triton is optional: CPU installs and machines without it keep the unfused path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None


if triton is not None:

    @triton.jit
    def rotation(p, log2_theta, HALF: tl.constexpr):
        """cos and sin of the rotate-half angles `p * theta ** (-i / HALF)`, i < HALF, for
        positions `p` (a scalar or (R, 1), float32): (1 or R, HALF) each."""
        d = tl.arange(0, HALF)[None, :]
        inv_freq = tl.exp2(-(d.to(tl.float32) / HALF) * log2_theta)
        ang = p * inv_freq
        # range-reduce so the fast sin/cos stay accurate for long documents
        two_pi = 6.283185307179586
        ang = ang - two_pi * tl.floor(ang / two_pi + 0.5)
        return tl.cos(ang), tl.sin(ang)

    @triton.jit
    def norm_rope_halves(x1, x2, w1, w2, p, eps, log2_theta, HALF: tl.constexpr):
        """Rows of heads as their two float32 halves (R, HALF), RMS-normalised over the whole
        head, scaled by the norm weight's halves `w1`, `w2` and rotated (rotate-half) by the
        positions `p` (a scalar or (R, 1), float32). An experiment's attention kernel that
        normalises as it loads (`bench/normed_attention.py`) shares this arithmetic."""
        ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
        r = (1.0 / tl.sqrt(ms + eps))[:, None]
        n1 = x1 * r * w1
        n2 = x2 * r * w2
        c, s = rotation(p, log2_theta, HALF)
        return n1 * c - n2 * s, n2 * c + n1 * s

    @triton.jit
    def _qk_norm_rope_kernel(qkv, q_out, k_out, w, pos, stride_tok, eps, log2_theta,
                             NQ: tl.constexpr, NK: tl.constexpr, HP: tl.constexpr, HALF: tl.constexpr):
        """The `heads` layout: one program per token and group of `HP` heads."""
        t = tl.program_id(0).to(tl.int64)
        # this program's HP heads of the token: q heads, then k heads (the last group masked)
        h = tl.program_id(1) * HP + tl.arange(0, HP)[:, None]
        d = tl.arange(0, HALF)[None, :]
        hmask = h < NQ + NK
        src = qkv + t * stride_tok + h * (2 * HALF) + d
        x1 = tl.load(src, mask=hmask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=hmask, other=0.0).to(tl.float32)
        wrow = (h >= NQ).to(tl.int32) * (2 * HALF)  # w is [q_norm; k_norm], (2, D)
        w1 = tl.load(w + wrow + d, mask=hmask, other=0.0).to(tl.float32)
        w2 = tl.load(w + wrow + HALF + d, mask=hmask, other=0.0).to(tl.float32)
        p = tl.load(pos + t).to(tl.float32)
        o1, o2 = norm_rope_halves(x1, x2, w1, w2, p, eps, log2_theta, HALF)
        qm = h < NQ
        km = (h >= NQ) & hmask
        qdst = q_out + t * (NQ * 2 * HALF) + h * (2 * HALF) + d
        kdst = k_out + t * (NK * 2 * HALF) + (h - NQ) * (2 * HALF) + d
        tl.store(qdst, o1.to(q_out.dtype.element_ty), mask=qm)
        tl.store(qdst + HALF, o2.to(q_out.dtype.element_ty), mask=qm)
        tl.store(kdst, o1.to(k_out.dtype.element_ty), mask=km)
        tl.store(kdst + HALF, o2.to(k_out.dtype.element_ty), mask=km)

    @triton.jit
    def _norm_rotate_heads(qkv, out, w, t, t_ok, c, s, stride_tok, eps,
                           HEAD0: tl.constexpr, NH: tl.constexpr, NHP: tl.constexpr, HALF: tl.constexpr):
        """Heads HEAD0 .. HEAD0 + NH of tokens `t` ((BT,), int64) as one (BT, NHP, HALF) tile
        per half: each head RMS-normalised in float32 and rotated by the tokens' cos and sin
        `c`, `s` ((BT, 1, HALF)), written to `out` ((S, NH, 2 HALF)), rounding once."""
        h = tl.arange(0, NHP)[None, :, None]
        d = tl.arange(0, HALF)[None, None, :]
        t3 = t[:, None, None]
        ok = t_ok[:, None, None] & (h < NH)
        src = qkv + t3 * stride_tok + (HEAD0 + h) * (2 * HALF) + d
        x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
        ms = (tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * HALF)
        r = (1.0 / tl.sqrt(ms + eps))[:, :, None]
        n1 = x1 * r * tl.load(w + d).to(tl.float32)
        n2 = x2 * r * tl.load(w + HALF + d).to(tl.float32)
        dst = out + t3 * (NH * 2 * HALF) + h * (2 * HALF) + d
        tl.store(dst, (n1 * c - n2 * s).to(out.dtype.element_ty), mask=ok)
        tl.store(dst + HALF, (n2 * c + n1 * s).to(out.dtype.element_ty), mask=ok)

    # the row count changes every step: not specialised on (one build serves every step)
    @triton.jit(do_not_specialize=["seq"])
    def _qk_norm_rope_tokens_kernel(qkv, q_out, k_out, w, pos, seq, stride_tok, eps, log2_theta,
                                    NQ: tl.constexpr, NK: tl.constexpr, NQP: tl.constexpr, NKP: tl.constexpr,
                                    BT: tl.constexpr, HALF: tl.constexpr):
        """The `tokens` layout: one program per `BT` tokens, all their q heads as one tile and
        all their k heads as another, the rotation's cos and sin made once per token."""
        t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
        t_ok = t < seq
        p = tl.load(pos + t, mask=t_ok, other=0).to(tl.float32)[:, None]
        c, s = rotation(p, log2_theta, HALF)
        c, s = c[:, None, :], s[:, None, :]
        _norm_rotate_heads(qkv, q_out, w, t, t_ok, c, s, stride_tok, eps, 0, NQ, NQP, HALF)
        _norm_rotate_heads(qkv, k_out, w + 2 * HALF, t, t_ok, c, s, stride_tok, eps, NQ, NK, NKP, HALF)


def available(device: torch.device | None = None) -> bool:
    return triton is not None and (device is None or torch.device(device).type == "cuda")


@dataclass(frozen=True)
class ProgramShape:
    """How a step's q/k heads are cut into programs: `layout` `heads` (one token's
    `per_program` heads a program) or `tokens` (`per_program` tokens' q heads and k heads a
    program), on `warps` warps."""

    layout: str
    per_program: int
    warps: int


TOKENS_LAYOUT_FROM = 1024  # packed rows from which a step takes the `tokens` layout


def program_shape(seq: int, heads: int) -> ProgramShape:
    """The shape for a step of `seq` tokens, the fastest the sweep on Hopper found at the
    full-size model's heads: from `TOKENS_LAYOUT_FROM` rows one token a program on two warps;
    below, eight heads a program on one warp."""
    if seq >= TOKENS_LAYOUT_FROM:
        return ProgramShape("tokens", 1, 2)
    if heads % 8 == 0:
        return ProgramShape("heads", 8, 1)
    return ProgramShape("heads", triton.next_power_of_2(heads), 4)


def qk_norm_rope(qkv: torch.Tensor, weights: torch.Tensor, pos: torch.Tensor, num_q_heads: int,
                 num_kv_heads: int, eps: float, theta: float,
                 q_out: torch.Tensor | None = None, k_out: torch.Tensor | None = None, *,
                 shape: ProgramShape | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (S, Hq + 2 Hkv, D) (last dim contiguous), weights (2, D) = [q_norm; k_norm],
    pos (S,) -> q (S, Hq, D), k (S, Hkv, D), normalised and rotated, by programs of `shape`
    (default: `program_shape`); the arithmetic is the same whatever the shape, up to the
    order of the norm's sum."""
    seq, _, d = qkv.shape
    if q_out is None:
        q_out = qkv.new_empty(seq, num_q_heads, d)
    if k_out is None:
        k_out = qkv.new_empty(seq, num_kv_heads, d)
    if seq == 0:
        return q_out, k_out
    assert qkv.stride(2) == 1 and qkv.stride(1) == d and weights.is_contiguous()
    heads = num_q_heads + num_kv_heads
    shape = shape or program_shape(seq, heads)
    if shape.layout == "tokens":
        _qk_norm_rope_tokens_kernel[(triton.cdiv(seq, shape.per_program),)](
            qkv, q_out, k_out, weights, pos, seq, qkv.stride(0), float(eps), float(math.log2(theta)),
            NQ=num_q_heads, NK=num_kv_heads, NQP=triton.next_power_of_2(num_q_heads),
            NKP=triton.next_power_of_2(num_kv_heads), BT=shape.per_program, HALF=d // 2, num_warps=shape.warps,
        )
    else:
        _qk_norm_rope_kernel[(seq, triton.cdiv(heads, shape.per_program))](
            qkv, q_out, k_out, weights, pos, qkv.stride(0), float(eps), float(math.log2(theta)),
            NQ=num_q_heads, NK=num_kv_heads, HP=shape.per_program, HALF=d // 2, num_warps=shape.warps,
        )
    return q_out, k_out


def reference(qkv: torch.Tensor, weights: torch.Tensor, pos: torch.Tensor, num_q_heads: int,
              num_kv_heads: int, eps: float, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same arithmetic in float32 torch (the yardstick of `check` and the tests)."""
    d = qkv.shape[-1]
    x = qkv[:, : num_q_heads + num_kv_heads].float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    w = torch.cat([weights[0:1].expand(num_q_heads, d), weights[1:2].expand(num_kv_heads, d)]).float()
    x = x * w
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=qkv.device) / d))
    ang = pos.float()[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    y = (x * cos + rot * sin).to(qkv.dtype)
    return y[:, :num_q_heads], y[:, num_q_heads:]


def check(device, dtype: torch.dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, eps: float,
          theta: float, tokens: int = 777) -> float:
    """Max relative error of the kernel against `reference` on random data (half-precision
    rounding is about 4e-3 in bfloat16); raises when the kernel cannot run."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    qkv = (torch.randn(tokens, num_q_heads + 2 * num_kv_heads, head_dim, generator=gen) * 3).to(device, dtype)
    weights = (1 + 0.1 * torch.randn(2, head_dim, generator=gen)).to(device, dtype)
    pos = torch.randint(0, 2048, (tokens,), generator=gen).to(device)
    q, k = qk_norm_rope(qkv, weights, pos, num_q_heads, num_kv_heads, eps, theta)
    rq, rk = reference(qkv, weights, pos, num_q_heads, num_kv_heads, eps, theta)
    err = max(float((q.float() - rq.float()).norm() / rq.float().norm()),
              float((k.float() - rk.float()).norm() / rk.float().norm()))
    return err
