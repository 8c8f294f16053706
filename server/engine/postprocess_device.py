"""The post-processing port where the decode left the audio: on the GPU, the same samples.

On an H200's host the numpy port (`postprocess.py`) of a lone 10 s chunk took 2.6-3.3 ms
right after the steps, all of it between the last step and the first sound: a dozen passes
over a megabyte on a slow core. Here the passes run on the device and the host only decides:

1. On the device: the int16 samples (the reference's `numpy_to_audiosegment`), their float
   values, and one int64 prefix sum of their squares, which alone crosses to the host.
2. On the host: the silence removal, by the numpy port's own functions, on frames kept as
   *pieces* of that clip (a run of its samples, forwards or backwards, or a run of zeros):
   slicing, reversing and joining move no sample, and any window's sum of squares is a
   difference of the prefix sum (exact, as the port's integer sums are).
3. On the device: the kept pieces copied into the padded output, then loudness and fades as
   the port's elementwise steps, in its order and dtype; the finished clip crosses back.

So a 10 s chunk costs about twenty small launches and three waits instead of a dozen
host passes; the samples are the numpy port's (tests compare the two on many clips, on the
CPU and on CUDA). One care: CUDA divides by a host scalar as a multiply by its reciprocal,
which can round differently from a division, so a divisor that is not a power of two goes
in as a tensor on the device.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from server.engine.postprocess import _Frames, _ramp, check_rate, silence_removed

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
_ZEROS = -1  # a piece's source start for a run of zeros


class _Pieces(_Frames):
    """Frames as pieces of one clip: (source start, length, backwards), or (`_ZEROS`, length,
    False) for zeros; sums of squares from the prefix sum of the clip's squares (host int64)."""

    def __init__(self, prefix: np.ndarray, pieces: list[tuple[int, int, bool]], channels: int, rate: int):
        self.prefix, self.pieces, self._channels, self.rate = prefix, pieces, channels, rate
        self.n = sum(length for _, length, _ in pieces)
        self.ms = round(1000 * (float(self.n) / rate))  # len(AudioSegment)
        self._offsets = np.cumsum([0] + [length for _, length, _ in pieces])

    @property
    def channels(self) -> int:
        return self._channels

    def _like(self, pieces: list[tuple[int, int, bool]]) -> _Pieces:
        return _Pieces(self.prefix, pieces, self._channels, self.rate)

    def _cut(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """The pieces of frames [a, b)."""
        out = []
        for (src, length, back), start in zip(self.pieces, self._offsets):
            u, w = max(a, start) - start, min(b, start + length) - start
            if u >= w:
                continue
            if src == _ZEROS:
                out.append((_ZEROS, w - u, False))
            else:
                out.append((src + length - w if back else src + u, w - u, back))
        return out

    def slice(self, start_ms: int, end_ms: int) -> _Pieces:
        s, e = (int(p) for p in self.pos([min(start_ms, self.ms), min(end_ms, self.ms)]))
        have = max(0, min(e, self.n) - min(s, self.n))  # len(data[s:e])
        pieces = self._cut(s, s + have)
        if 0 < have < e - s:  # pydub's zero padding
            pieces.append((_ZEROS, e - s - have, False))
        return self._like(pieces)

    def reversed(self) -> _Pieces:
        return self._like([(src, length, not back and src != _ZEROS) for src, length, back in self.pieces[::-1]])

    def joined(self, parts: list[_Frames]) -> _Pieces:
        return self._like([piece for part in parts for piece in part.pieces])

    def nothing(self) -> _Pieces:
        return _Pieces(self.prefix, [], 1, self.rate)

    def _before(self, x: np.ndarray) -> np.ndarray:
        """Sum of squares of frames [0, x) for each x in [0, n]."""
        if not self.pieces:
            return np.zeros(len(x), dtype=np.int64)
        src, length, back = (np.array(column) for column in zip(*self.pieces))
        zeros = src == _ZEROS
        src = np.where(zeros, 0, src)
        p = self.prefix
        whole = np.where(zeros, 0, p[src + length] - p[src])
        done = np.concatenate([[0], np.cumsum(whole)])
        j = np.searchsorted(self._offsets[:-1], x, side="right") - 1
        within = np.where(zeros[j], 0, x - self._offsets[j])  # a run of zeros adds nothing
        s, n = src[j], np.where(zeros[j], 0, length[j])
        return done[j] + np.where(back[j], p[s + n] - p[s + n - within], p[s + within] - p[s])

    def _energies(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        return self._before(last) - self._before(first)


@lru_cache(maxsize=64)
def _device_ramp(n: int, rising: bool, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The port's float32 fade ramp on the device (in `dtype` as numpy would promote it)."""
    return torch.from_numpy(_ramp(n, rising).copy()).to(device=device, dtype=dtype)


def _kept(audio: torch.Tensor, sample_rate: int) -> tuple[torch.Tensor, _Pieces]:
    """The int16 samples' float values (C, N) on the device, and the pieces the reference's
    silence removal keeps of them."""
    check_rate(sample_rate)
    samples = (audio * 32768.0).clamp(-32768, 32767).to(torch.int16)  # numpy_to_audiosegment
    wide = samples.to(torch.int64)
    squares = wide.square_().sum(0)
    prefix = squares.new_zeros(squares.shape[0] + 1)
    torch.cumsum(squares, 0, out=prefix[1:])
    values = samples.to(torch.float32) / 32768.0  # a power of two: exact either way
    clip = _Pieces(prefix.cpu().numpy(), [(0, samples.shape[1], False)] if samples.shape[1] else [],
                   samples.shape[0], sample_rate)
    return values, silence_removed(clip, 500, 100, 100)


def post_process_audio(audio: torch.Tensor, ref_rms: float | None, postprocess: bool, sample_rate: int,
                       pad_duration: float = 0.1, fade_duration: float = 0.1) -> torch.Tensor:
    """`postprocess.post_process_audio` on a (C, T) float32 tensor, on its device: (C', T')."""
    if postprocess:
        values, kept = _kept(audio, sample_rate)
        channels, n, np_dtype = kept.channels, kept.n, np.dtype(np.float32)
    else:
        values, kept = audio, None
        channels, n = audio.shape[0], audio.shape[-1]
        np_dtype = np.dtype(np.float32) if audio.dtype == torch.float32 else np.dtype(np.float64)
    scale = ref_rms is not None and ref_rms < 0.1
    if scale:  # the dtype `audio * ref_rms / 0.1` has in numpy
        np_dtype = (np.zeros(0, np_dtype) * ref_rms / 0.1).dtype
    pad = int(pad_duration * sample_rate) if n > 0 else 0  # an empty clip is not padded
    out = values.new_zeros(channels, n + 2 * pad, dtype=_TORCH_DTYPES[np_dtype])
    body = out[:, pad:pad + n]
    if kept is None:
        body.copy_(values)
    else:
        at = 0
        for src, length, back in kept.pieces:
            if src != _ZEROS:
                piece = values[:, src:src + length]
                body[:, at:at + length] = piece.flip(-1) if back else piece
            at += length
    if scale:
        body.mul_(ref_rms)
        body.div_(torch.tensor(0.1, dtype=body.dtype, device=body.device))
    elif ref_rms is None:
        if n == 0:  # what numpy's max of an empty array raises, as the reference does
            raise ValueError("zero-size array to reduction operation maximum which has no identity")
        peak = body.abs().max()
        if np.float32(peak.item()) > 1e-6:
            body.div_(peak)
            body.mul_(0.5)
    if n > 0:
        k = min(int(fade_duration * sample_rate), n // 2)
        if k > 0:
            body[..., :k] *= _device_ramp(k, True, body.device, body.dtype)
            body[..., -k:] *= _device_ramp(k, False, body.device, body.dtype)
    return out
