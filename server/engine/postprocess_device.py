"""The post-processing port where the decode left the audio: on the GPU, the same samples.

On an H200's host the numpy port (`postprocess.py`) of a lone 10 s chunk took 2.6-3.3 ms
right after the steps (a cold core; the same port runs in ~0.6 ms warm), all of it between
the last step and the first sound. Here the passes over the samples run on the device: the
int16 conversion, one int64 prefix sum of the squares, the joins, the loudness, the fades
and the padding. Only window sums (a few thousand int64) and the finished clip cross to the
host. The silence decisions are the numpy port's own functions, on frames whose sums of
squares are differences of that prefix sum (exact, as the port's are); every other step is
the port's elementwise operation in its order and dtype, so the samples are identical
(tests compare the two on many clips, on the CPU and on CUDA).

One care: CUDA divides by a host scalar as a multiply by its reciprocal, which can round
differently from a division, so a divisor that is not a power of two goes in as a tensor on
the device.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from server.engine.postprocess import _Frames, _ramp, check_rate, silence_removed

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


class _DeviceFrames(_Frames):
    """int16 frames (N, C) in a device tensor; sums of squares from one prefix sum of them."""

    def __init__(self, data: torch.Tensor, rate: int):
        super().__init__(data, rate)
        self._prefix: torch.Tensor | None = None

    @staticmethod
    def _padded(data: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cat([data, data.new_zeros(rows - len(data), data.shape[1])])

    def reversed(self) -> _DeviceFrames:
        return _DeviceFrames(torch.flip(self.data, [0]), self.rate)

    def joined(self, parts: list[_Frames]) -> _DeviceFrames:
        return _DeviceFrames(torch.cat([part.data for part in parts]), self.rate)

    def nothing(self) -> _DeviceFrames:
        return _DeviceFrames(self.data.new_zeros(0, 1), self.rate)

    def _energies(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        if self._prefix is None:
            squares = self.data.to(torch.int64).square().sum(1)
            self._prefix = torch.cat([squares.new_zeros(1), squares.cumsum(0)])
        at = torch.from_numpy(np.concatenate([first, last])).to(self._prefix.device)
        sums = self._prefix[at].cpu().numpy()
        return sums[len(first):] - sums[:len(first)]


@lru_cache(maxsize=64)
def _device_ramp(n: int, rising: bool, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The port's float32 fade ramp on the device (in `dtype` as numpy would promote it)."""
    return torch.from_numpy(_ramp(n, rising).copy()).to(device=device, dtype=dtype)


def post_process_audio(audio: torch.Tensor, ref_rms: float | None, postprocess: bool, sample_rate: int,
                       pad_duration: float = 0.1, fade_duration: float = 0.1) -> torch.Tensor:
    """`postprocess.post_process_audio` on a (C, T) float32 tensor, on its device: (C', T')."""
    if postprocess:
        check_rate(sample_rate)
        samples = (audio * 32768.0).clamp(-32768, 32767).to(torch.int16)  # numpy_to_audiosegment
        frames = silence_removed(_DeviceFrames(samples.t(), sample_rate), 500, 100, 100).data
        body = frames.t().to(torch.float32) / 32768.0  # a power of two: exact either way
        np_dtype = np.dtype(np.float32)
    else:
        body = audio.clone()
        np_dtype = np.dtype(np.float32) if audio.dtype == torch.float32 else np.dtype(np.float64)
    n = body.shape[-1]
    if ref_rms is not None and ref_rms < 0.1:  # the dtype `audio * ref_rms / 0.1` has in numpy
        dtype = _TORCH_DTYPES[(np.zeros(0, np_dtype) * ref_rms / 0.1).dtype]
        body = body.to(dtype)
        body.mul_(ref_rms)
        body.div_(torch.tensor(0.1, dtype=dtype, device=body.device))
    elif ref_rms is None:
        if n == 0:  # what numpy's max of an empty array raises, as the reference does
            raise ValueError("zero-size array to reduction operation maximum which has no identity")
        peak = body.abs().max()
        if np.float32(peak.item()) > 1e-6:
            body = body / peak
            body.mul_(0.5)
    if n > 0:
        k = min(int(fade_duration * sample_rate), n // 2)
        if k > 0:
            body[..., :k] *= _device_ramp(k, True, body.device, body.dtype)
            body[..., -k:] *= _device_ramp(k, False, body.device, body.dtype)
    pad = int(pad_duration * sample_rate) if n > 0 else 0  # an empty clip is not padded
    out = body.new_zeros(body.shape[0], n + 2 * pad)
    out[:, pad:pad + n] = body
    return out
