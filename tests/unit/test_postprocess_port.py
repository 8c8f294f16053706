"""The vectorised post-processing gives exactly the reference's samples (pydub's path and all).

Every comparison is bit-for-bit: same dtype, same shape, equal floats. The reference here is
the installed omnivoice's own `_post_process_audio`, `remove_silence` and `cross_fade_chunks`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from omnivoice.models.omnivoice import OmniVoice, OmniVoiceGenerationConfig
from omnivoice.utils import audio as reference_audio

from server.engine.model import postprocess as port
from server.engine.model.codec import join_and_post_process, post_process
from tests.conftest import make_reference_clip

RATE = 24000
REF_RMS = [None, 0.05, 0.2, 0.0]


def reference_post_process(audio, ref_rms, postprocess, rate=RATE):
    config = OmniVoiceGenerationConfig(postprocess_output=postprocess)
    return OmniVoice._post_process_audio(SimpleNamespace(sampling_rate=rate), audio, ref_rms=ref_rms,
                                         gen_config=config)


def assert_identical(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


def outcome(fn, *args):
    """The function's array, or the type of what it raised (the reference raises on some clips)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared between the two implementations
        return type(exc)


def assert_same_post_process(audio: np.ndarray, ref_rms, postprocess: bool, rate: int = RATE) -> None:
    before = audio.copy()
    ours = outcome(port.post_process_audio, audio, ref_rms, postprocess, rate)
    theirs = outcome(reference_post_process, audio, ref_rms, postprocess, rate)
    np.testing.assert_array_equal(audio, before)  # the input is left alone
    if isinstance(theirs, type):
        assert ours is theirs
    else:
        assert not isinstance(ours, type), ours
        assert_identical(ours, theirs)


def speech(ms: int, seed: int = 7, rate: int = RATE) -> np.ndarray:
    n = ms * rate // 1000
    return make_reference_clip(n / rate + 0.01, rate, seed=seed)[:n]


def silence(ms: int, level: float = 0.0, seed: int = 0, rate: int = RATE) -> np.ndarray:
    n = ms * rate // 1000
    return (level * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def clip(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(0, np.float32), *parts]).astype(np.float32)[np.newaxis, :]


def _named_clips() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    clips = {
        "speech_2s": clip(speech(2000)),
        "speech_10s": clip(speech(10_000, seed=3)),
        "noise_loud": clip(rng.standard_normal(30_000).astype(np.float32) * 0.3),
        "noise_clipping": clip(rng.standard_normal(30_000).astype(np.float32) * 2.0),
        "noise_near_threshold": clip(rng.standard_normal(40_000).astype(np.float32) * 0.0032),
        "lead_and_trail_silence": clip(silence(900), speech(1500), silence(1300)),
        "faint_lead_and_trail": clip(silence(700, 2e-4), speech(1200), silence(800, 2e-4, seed=1)),
        "all_silent": clip(silence(3000)),
        "all_faint": clip(silence(2000, 1e-4)),
        "empty": clip(),
        "one_sample": clip(speech(1)[:1] + 0.2),
        "tiny": clip(np.full(23, 0.3, np.float32)),
        "one_ms": clip(np.full(24, -0.3, np.float32)),
        "just_under_500ms": clip(speech(499)),
        "just_over_500ms": clip(speech(501)),
        "exactly_500ms": clip(speech(500)),
        "exactly_500ms_silent": clip(silence(500)),
        "odd_length": clip(speech(1000), silence(0)[:0], np.full(13, 0.1, np.float32)),
        "impulse_in_silence": clip(silence(1200), np.array([0.5], np.float32), silence(1200)),
    }
    # internal silences of many lengths around the 500 ms cut, the 10 ms windows and the margins
    for gap in (0, 10, 100, 250, 490, 499, 500, 501, 510, 600, 990, 1000, 1001, 1500, 2500):
        clips[f"gap_{gap}ms"] = clip(speech(800, seed=gap), silence(gap), speech(700, seed=gap + 1))
        clips[f"gap_{gap}ms_faint"] = clip(speech(600, seed=gap), silence(gap, 3e-4), speech(600))
    clips["many_gaps"] = clip(*[p for g in (520, 80, 1300, 505, 2000, 30) for p in (speech(400, seed=g), silence(g))])
    # lengths at and around frame/window boundaries (24 samples a ms; 240 a window)
    for n in (239, 240, 241, 11_999, 12_000, 12_001, 12_012, 12_013, 24_011, 24_012, 24_013):
        clips[f"len_{n}"] = clip(np.resize(speech(600, seed=n), n))
    for n in (12_000, 12_012, 12_013, 24_013):
        clips[f"silent_len_{n}"] = clip(np.zeros(n, np.float32))
    # the last window runs past the samples and pydub pads it with zeros:
    # 13 samples at 120 are loud alone, quiet over the padded 24; 104 throughout is silent only
    # over the padded final 500 ms window
    clips["loud_only_unpadded_tail"] = clip(np.zeros(24_000, np.float32), np.full(13, 120 / 32768, np.float32))
    clips["at_threshold_unpadded"] = clip(np.full(24_013, 104 / 32768, np.float32))
    return clips


NAMED_CLIPS = _named_clips()


@pytest.mark.parametrize("name", sorted(NAMED_CLIPS))
def test_post_process_matches_the_reference(name):
    for ref_rms in REF_RMS:
        for postprocess in (True, False):
            assert_same_post_process(NAMED_CLIPS[name], ref_rms, postprocess)


def test_all_silent_clip_without_reference_rms_raises_like_the_reference():
    silent = NAMED_CLIPS["all_silent"]
    with pytest.raises(ValueError):
        reference_post_process(silent, None, True)
    with pytest.raises(ValueError):
        port.post_process_audio(silent, None, True, RATE)
    assert port.post_process_audio(silent, 0.05, True, RATE).shape == (1, 0)


def test_random_clips_match_the_reference():
    rng = np.random.default_rng(2024)
    for i in range(40):
        parts = []
        for _ in range(int(rng.integers(1, 8))):
            ms = int(rng.integers(1, 1600))
            level = float(rng.choice([0.0, 1e-4, 2e-3, 0.02]))
            parts.append(speech(ms, seed=i) if rng.random() < 0.5 else silence(ms, level, seed=i))
        audio = clip(*parts)
        assert_same_post_process(audio, [None, 0.03, 0.5][i % 3], postprocess=True)
        if i % 4 == 0:
            assert_same_post_process(audio, 0.07, postprocess=False)


segments = st.lists(
    st.tuples(st.sampled_from(["speech", "silence", "faint", "noise"]), st.integers(0, 1200),
              st.integers(0, 2**16)),
    min_size=0, max_size=6,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments, st.sampled_from(REF_RMS), st.booleans(), st.integers(0, 239))
def test_hypothesis_clips_match_the_reference(parts, ref_rms, postprocess, extra_samples):
    pieces = []
    for kind, ms, seed in parts:
        if kind == "speech":
            pieces.append(speech(ms, seed=seed))
        elif kind == "noise":
            pieces.append(silence(ms, 0.1, seed=seed))
        else:
            pieces.append(silence(ms, 1e-4 if kind == "faint" else 0.0, seed=seed))
    pieces.append(np.full(extra_samples, 0.01, np.float32))
    assert_same_post_process(clip(*pieces), ref_rms, postprocess)


@pytest.mark.parametrize("rate", [16000, 22050, 44100, 48000])
def test_other_sample_rates_match_the_reference(rate):
    # 44100 and 22050 make pydub's millisecond positions inexact floats
    audio = clip(silence(300, rate=rate), speech(900, rate=rate), silence(700, rate=rate),
                 speech(500, seed=2, rate=rate), silence(260, 1e-4, rate=rate),
                 np.full(7, 0.2, np.float32))
    for ref_rms in (None, 0.05):
        assert_same_post_process(audio, ref_rms, True, rate)


@pytest.mark.parametrize("margins", [(300, 100, 300), (0, 100, 300), (500, 0, 0), (200, 50, 900)])
def test_remove_silence_with_other_margins_matches_the_reference(margins):
    mid, lead, trail = margins
    for name in ("many_gaps", "lead_and_trail_silence", "gap_600ms_faint", "len_12013", "all_silent",
                 "loud_only_unpadded_tail", "at_threshold_unpadded"):
        audio = NAMED_CLIPS[name]
        assert_identical(port.remove_silence(audio, RATE, mid, lead, trail),
                         reference_audio.remove_silence(audio, RATE, mid, lead, trail))


def test_stereo_remove_silence_matches_the_reference():
    left = clip(silence(400), speech(900), silence(800), speech(300, seed=5), silence(200))[0]
    right = np.roll(left, 333) * 0.5
    stereo = np.stack([left, right])
    assert_identical(port.remove_silence(stereo, RATE, 500, 100, 100),
                     reference_audio.remove_silence(stereo, RATE, 500, 100, 100))
    assert_identical(port.post_process_audio(stereo, 0.05, False, RATE), reference_post_process(stereo, 0.05, False))


def test_numpy_scalar_reference_rms_keeps_the_reference_dtype():
    audio = NAMED_CLIPS["speech_2s"]
    for ref_rms in (np.float64(0.05), np.float32(0.05), 0):
        for postprocess in (True, False):
            assert_same_post_process(audio, ref_rms, postprocess)


CHUNK_SETS = {
    "one": [speech(700)],
    "two": [speech(700), speech(900, seed=2)],
    "five": [speech(ms, seed=ms) for ms in (300, 1200, 50, 800, 450)],
    "shorter_than_the_fade": [speech(40), speech(20, seed=3), speech(60, seed=4)],
    "empty_chunks": [speech(0), speech(500), speech(0, seed=1), speech(200)],
}


@pytest.mark.parametrize("name", sorted(CHUNK_SETS))
def test_cross_fade_chunks_matches_the_reference(name):
    chunks = [clip(c) for c in CHUNK_SETS[name]]
    before = [c.copy() for c in chunks]
    assert_identical(port.cross_fade_chunks(chunks, RATE), reference_audio.cross_fade_chunks(chunks, RATE))
    for chunk, original in zip(chunks, before):
        np.testing.assert_array_equal(chunk, original)


@pytest.mark.parametrize("ref_rms", [None, 0.05])
def test_codec_functions_give_the_reference_samples(ref_rms):
    """What the engine calls: one chunk, and a whole request's chunks joined then processed."""
    audio = NAMED_CLIPS["many_gaps"]
    expected = reference_post_process(audio, ref_rms, True)
    assert_identical(post_process(audio, ref_rms, True, RATE), np.ascontiguousarray(expected[0]))
    chunks = [clip(c) for c in CHUNK_SETS["five"]]
    joined = reference_post_process(reference_audio.cross_fade_chunks(chunks, RATE), ref_rms, True)
    assert_identical(join_and_post_process(chunks, ref_rms, True, RATE), np.ascontiguousarray(joined[0]))


def test_fade_and_pad_lengths_are_the_reference_defaults():
    config = OmniVoiceGenerationConfig()
    audio = NAMED_CLIPS["speech_2s"]
    assert_identical(port.post_process_audio(audio, 0.2, False, RATE, config.pad_duration, config.fade_duration),
                     port.post_process_audio(audio, 0.2, False, RATE))
