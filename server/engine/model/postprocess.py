"""The reference's post-processing on whole arrays, with the very same output.

A vectorised port of `OmniVoice._post_process_audio` (pydub's silence removal, loudness, fade
and pad) that does the same arithmetic for all windows at once, off the GIL; every sample is
bit-identical to the reference's (tests/unit/test_postprocess_port.py).
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import pairwise

import numpy as np

_FULL_SCALE = 32768.0  # pydub's `max_possible_amplitude` for 16-bit samples
_SILENCE_DB = -50.0  # the reference's threshold for every silence test
_SILENT_SEGMENT_RATE = 11025  # `AudioSegment.silent()`'s rate, which the joined segments start from


def _loudest_silent_rms(db: float) -> int:
    """Largest integer RMS that `detect_silence` calls silent (`rms <= db_to_float(db) * full`)."""
    return math.floor(10 ** (float(db) / 20) * _FULL_SCALE)


def _loudest_quiet_rms(db: float) -> int:
    """Largest integer RMS whose dBFS (`20 * log(rms / full, 10)`, -inf at 0) is below `db`:
    `detect_leading_silence`'s test. The expression only grows with rms."""
    rms = 0
    while rms < 32768 and 20 * math.log((rms + 1) / _FULL_SCALE, 10) < db:
        rms += 1
    return rms


_SILENT_RMS = _loudest_silent_rms(_SILENCE_DB)
_QUIET_RMS = _loudest_quiet_rms(_SILENCE_DB)


class _Frames:
    """int16 frames (N, C) at `rate`, measured and sliced in milliseconds as pydub does."""

    def __init__(self, data: np.ndarray, rate: int):
        self.data = data
        self.rate = rate
        self.n = data.shape[0]
        self.ms = round(1000 * (float(self.n) / rate))  # len(AudioSegment)

    def pos(self, ms):
        """`AudioSegment._parse_position` for ms >= 0: int(ms * (rate / 1000.0))."""
        return (np.asarray(ms, dtype=np.float64) * (self.rate / 1000.0)).astype(np.int64)

    def slice(self, start_ms: int, end_ms: int) -> _Frames:
        """`segment[start_ms:end_ms]`, zero-padded where pydub pads it."""
        s, e = (int(p) for p in self.pos([min(start_ms, self.ms), min(end_ms, self.ms)]))
        data = self.data[s:e]
        if 0 < len(data) < e - s:
            pad = np.zeros((e - s - len(data), data.shape[1]), dtype=data.dtype)
            data = np.concatenate([data, pad])
        return _Frames(data, self.rate)

    def reversed(self) -> _Frames:
        return _Frames(self.data[::-1], self.rate)

    def _energies(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Exact sums of squares of frames [first, last) for each pair (first < last), from
        one segmented sum over the frames they cover."""
        lo, hi = int(first.min()), int(last.max())
        cuts = np.unique(np.concatenate([first, last]))  # lo .. hi
        part = self.data[lo:hi]
        if part.shape[1] == 1:  # int16 squares fit int32; sum them in int64
            squares = part[:, 0].astype(np.int32)
            np.multiply(squares, squares, out=squares)
        else:
            squares = part.astype(np.int64)
            squares = (squares * squares).sum(axis=1)
        between = np.add.reduceat(squares, cuts[:-1] - lo, dtype=np.int64)
        running = np.zeros(len(cuts), dtype=np.int64)
        np.cumsum(between, out=running[1:])
        return running[np.searchsorted(cuts, last)] - running[np.searchsorted(cuts, first)]

    def rms(self, start_ms: np.ndarray, end_ms: np.ndarray) -> np.ndarray:
        """`segment[start:end].rms` for each pair: audioop's truncated sqrt of the mean square
        over the padded slice (an empty slice has rms 0)."""
        s = self.pos(np.minimum(start_ms, self.ms))
        e = self.pos(np.minimum(end_ms, self.ms))
        first, last = np.minimum(s, self.n), np.minimum(e, self.n)
        present = last > first
        out = np.zeros(len(s), dtype=np.int64)
        if present.any():
            total = self._energies(first[present], last[present]).astype(np.float64)
            count = ((e[present] - s[present]) * self.data.shape[1]).astype(np.float64)
            out[present] = np.sqrt(total / count).astype(np.int64)
        return out


def _silent_ranges(frames: _Frames, min_len: int, step: int) -> list[list[int]]:
    """`pydub.silence.detect_silence(frames, min_len, -50, step)`."""
    if frames.ms < min_len:
        return []
    last_start = frames.ms - min_len
    starts = np.arange(0, last_start + 1, step, dtype=np.int64)
    if last_start % step:
        starts = np.append(starts, last_start)
    silent = starts[frames.rms(starts, starts + min_len) <= _SILENT_RMS]
    if len(silent) == 0:
        return []
    prev, cur = silent[:-1], silent[1:]
    breaks = (cur != prev + step) & (cur > prev + min_len)
    range_starts = np.concatenate([silent[:1], cur[breaks]])
    range_ends = np.concatenate([prev[breaks], silent[-1:]]) + min_len
    return [[int(a), int(b)] for a, b in zip(range_starts, range_ends)]


def _nonsilent_ranges(frames: _Frames, min_len: int, step: int) -> list[list[int]]:
    """`pydub.silence.detect_nonsilent`."""
    silent = _silent_ranges(frames, min_len, step)
    if not silent:
        return [[0, frames.ms]]
    if silent[0][0] == 0 and silent[0][1] == frames.ms:
        return []
    ranges, prev_end = [], 0
    for start, end in silent:
        ranges.append([prev_end, start])
        prev_end = end
    if silent[-1][1] != frames.ms:
        ranges.append([prev_end, frames.ms])
    if ranges[0] == [0, 0]:
        ranges.pop(0)
    return ranges


def _split_on_silence(frames: _Frames, min_len: int, keep: int, step: int) -> list[_Frames]:
    """`pydub.silence.split_on_silence` (keep_silence in ms)."""
    ranges = [[start - keep, end + keep] for start, end in _nonsilent_ranges(frames, min_len, step)]
    for before, after in pairwise(ranges):
        if after[0] < before[1]:
            before[1] = (before[1] + after[0]) // 2
            after[0] = before[1]
    return [frames.slice(max(start, 0), min(end, frames.ms)) for start, end in ranges]


def _leading_silence_ms(frames: _Frames, chunk_ms: int = 10) -> int:
    """`pydub.silence.detect_leading_silence(frames, -50, chunk_ms)`, looking only as far as
    the sound starts."""
    start, batch = 0, 64
    while start < frames.ms:
        t = np.arange(start, min(start + batch * chunk_ms, frames.ms), chunk_ms, dtype=np.int64)
        loud = np.flatnonzero(frames.rms(t, t + chunk_ms) > _QUIET_RMS)
        if len(loud):
            return int(t[loud[0]])
        start, batch = int(t[-1]) + chunk_ms, batch * 2
    return min(start, frames.ms)


def _trim_edges(frames: _Frames, lead_ms: int, trail_ms: int) -> _Frames:
    """The reference's `remove_silence_edges(frames, lead_ms, trail_ms, -50)`."""
    frames = frames.slice(max(0, _leading_silence_ms(frames) - lead_ms), frames.ms).reversed()
    return frames.slice(max(0, _leading_silence_ms(frames) - trail_ms), frames.ms).reversed()


def _silence_removed_frames(audio: np.ndarray, sample_rate: int, mid_sil: int, lead_sil: int,
                            trail_sil: int) -> np.ndarray:
    """The reference's `remove_silence` up to its last step: int16 frames (N', C')."""
    if sample_rate < _SILENT_SEGMENT_RATE:
        raise ValueError(f"sample rate {sample_rate} below {_SILENT_SEGMENT_RATE}: pydub would resample")
    samples = (audio * 32768.0).clip(-32768, 32767).astype(np.int16)  # numpy_to_audiosegment
    frames = _Frames(samples.T, sample_rate)
    if mid_sil > 0:
        kept = _split_on_silence(frames, mid_sil, mid_sil, 10)
        if not kept:  # joined onto `AudioSegment.silent(0)`: nothing, mono
            return np.zeros((0, 1), dtype=np.int16)
        frames = _Frames(np.concatenate([seg.data for seg in kept]), sample_rate)
    return _trim_edges(frames, lead_sil, trail_sil).data


def remove_silence(audio: np.ndarray, sampling_rate: int, mid_sil: int = 300, lead_sil: int = 100,
                   trail_sil: int = 300) -> np.ndarray:
    """The reference's `omnivoice.utils.audio.remove_silence`, (C, T) float -> (C', T') float32."""
    frames = _silence_removed_frames(audio, sampling_rate, mid_sil, lead_sil, trail_sil)
    return frames.T.astype(np.float32) / 32768.0


@lru_cache(maxsize=64)
def _ramp(n: int, rising: bool) -> np.ndarray:
    ramp = np.linspace(0, 1, n, dtype=np.float32) if rising else np.linspace(1, 0, n, dtype=np.float32)
    ramp.flags.writeable = False
    return ramp


def _fade_in_place(audio: np.ndarray, fade_samples: int) -> None:
    """The reference's fade-in and fade-out of `fade_and_pad_audio` (on a non-empty clip)."""
    if fade_samples > 0:
        k = min(fade_samples, audio.shape[-1] // 2)
        if k > 0:
            audio[..., :k] *= _ramp(k, True)
            audio[..., -k:] *= _ramp(k, False)


def post_process_audio(audio: np.ndarray, ref_rms: float | None, postprocess: bool, sample_rate: int,
                       pad_duration: float = 0.1, fade_duration: float = 0.1) -> np.ndarray:
    """`OmniVoice._post_process_audio(audio, ref_rms, config)`: (C, T) float -> (C', T').

    Silence removal as the reference configures it (`postprocess`), loudness to `ref_rms`
    (or to half scale at the peak without one), fade, pad.
    """
    frames = None
    if postprocess:
        frames = _silence_removed_frames(audio, sample_rate, mid_sil=500, lead_sil=100, trail_sil=100)
        channels, n, dtype = frames.shape[1], frames.shape[0], np.dtype(np.float32)
    else:
        channels, n, dtype = audio.shape[0], audio.shape[-1], audio.dtype
    scale = ref_rms is not None and ref_rms < 0.1
    if scale:  # the dtype `audio * ref_rms / 0.1` has (a numpy float64 ref_rms promotes)
        dtype = (np.zeros(0, dtype) * ref_rms / 0.1).dtype
    pad = int(pad_duration * sample_rate) if n > 0 else 0  # an empty clip is not padded
    out = np.empty((channels, n + 2 * pad), dtype=dtype)
    out[:, :pad] = 0
    out[:, pad + n:] = 0
    body = out[:, pad:pad + n]
    if frames is not None:
        np.divide(frames.T, 32768.0, out=body, dtype=np.float32)  # audiosegment_to_numpy
    else:
        body[...] = audio
    if scale:
        np.multiply(body, ref_rms, out=body)
        np.divide(body, 0.1, out=body)
    elif ref_rms is None:
        peak = np.abs(body).max()  # raises on an empty clip, as the reference does
        if peak > 1e-6:
            np.divide(body, peak, out=body)
            np.multiply(body, 0.5, out=body)
    if n > 0:
        _fade_in_place(body, int(fade_duration * sample_rate))
    return out


def cross_fade_chunks(chunks: list[np.ndarray], sample_rate: int, silence_duration: float = 0.3) -> np.ndarray:
    """The reference's `cross_fade_chunks`, writing each chunk once into the joined buffer."""
    if len(chunks) == 1:
        return chunks[0]
    fade_n = int(silence_duration * sample_rate) // 3
    silence_n = fade_n
    dtype = np.result_type(chunks[0].dtype, np.float32, *(c.dtype for c in chunks[1:]))
    lengths = [c.shape[-1] for c in chunks]
    out = np.zeros((chunks[0].shape[0], sum(lengths) + silence_n * (len(chunks) - 1)), dtype=dtype)
    offset = 0
    for i, chunk in enumerate(chunks):
        if i > 0:
            fade_out = min(fade_n, offset)  # the joined audio so far ends at `offset`
            if fade_out > 0:
                out[..., offset - fade_out:offset] *= _ramp(fade_out, False)
            offset += silence_n
        out[..., offset:offset + lengths[i]] = chunk
        fade_in = min(fade_n, lengths[i]) if i > 0 else 0
        if fade_in > 0:
            out[..., offset:offset + fade_in] *= _ramp(fade_in, True)
        offset += lengths[i]
    return out
