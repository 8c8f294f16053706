"""Bytes for an encoded voice, so the voice library can store one without touching torch.

The layout is a numpy `.npz` (no pickles): codec tokens as int16 (codes are 0..1023),
the transcript and the reference RMS, plus a format number for later changes; and, where the
voice gives the speaker but not the speaking rate (a kept voice from a short first chunk:
`server.voices.pace`), `sets_pace` false (absent: true).
"""

from __future__ import annotations

import io

import numpy as np
import torch

from server.engine.types import VoicePrompt

FORMAT_VERSION = 1


def voice_to_bytes(voice: VoicePrompt) -> bytes:
    tokens = voice.tokens.detach().cpu()
    if tokens.ndim != 2:
        raise ValueError(f"voice tokens must be (codebooks, frames), got shape {tuple(tokens.shape)}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) > np.iinfo(np.int16).max):
        raise ValueError("voice tokens out of the int16 range")
    buf = io.BytesIO()
    np.savez(
        buf,
        format=np.array(FORMAT_VERSION, dtype=np.int64),
        tokens=tokens.numpy().astype(np.int16),
        text=np.array(voice.text),
        rms=np.array(voice.rms, dtype=np.float64),
        sets_pace=np.array(voice.sets_pace),
    )
    return buf.getvalue()


def voice_from_bytes(data: bytes) -> VoicePrompt:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        version = int(npz["format"])
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported stored voice format {version}")
        tokens = torch.from_numpy(npz["tokens"].astype(np.int64))
        rms = float(npz["rms"])  # NaN: written from None (a voice made of generated tokens)
        sets_pace = bool(npz["sets_pace"]) if "sets_pace" in npz.files else True
        return VoicePrompt(tokens=tokens, text=str(npz["text"]), rms=None if np.isnan(rms) else rms,
                           sets_pace=sets_pace)
