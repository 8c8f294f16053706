"""G.711 mu-law and A-law written out from the standard (CCITT's reference coder, as in Sun's
`g711.c`): the check the server's telephony output is held to. numpy only, no codec library."""

from __future__ import annotations

import numpy as np

_MU_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_A_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
MU_BIAS, MU_CLIP = 0x21, 8159  # on 14-bit magnitudes


def linear_to_mulaw(pcm16: np.ndarray) -> np.ndarray:
    v = pcm16.astype(np.int32) >> 2  # 14-bit
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), MU_CLIP) + MU_BIAS
    seg = np.searchsorted(_MU_SEGMENT_ENDS, v)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((v >> (seg + 1)) & 0xF))
    return (code ^ mask).astype(np.uint8)


def linear_to_alaw(pcm16: np.ndarray) -> np.ndarray:
    v = pcm16.astype(np.int32) >> 3  # 13-bit
    negative = v < 0
    mask = np.where(negative, 0x55, 0xD5)
    v = np.where(negative, -v - 1, v)
    seg = np.searchsorted(_A_SEGMENT_ENDS, v)
    mantissa = np.where(seg < 2, (v >> 1) & 0xF, (v >> np.maximum(seg, 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | mantissa)
    return (code ^ mask).astype(np.uint8)


def mulaw_to_linear(codes: np.ndarray) -> np.ndarray:
    u = ~codes.astype(np.int32) & 0xFF
    t = (((u & 0xF) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)
