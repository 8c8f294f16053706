"""`--aligner`: the "aligned" source of word timestamps, a CTC forced aligner run on its own
thread. The checkpoint here is a small random one (`chorus make-aligner`): it shows that the
path works end to end (loading, resampling, emissions, `forced_align`, spans on the audio's
clock, words frames before `done`), not that it finds words in sound. What the alignment code
itself gets right is checked on real speech made here by espeak-ng, with word boundaries known
exactly (each word spoken alone, then joined with silences), by giving the aligner the
emissions a perfect acoustic model would; the same speech gives the model source's error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as audio_functional

from server.engine.model.aligner import CtcAligner, make_aligner_checkpoint
from server.timestamps.model_words import place
from tests.support.chorus_client import Audio, Session, stream_once

WORDS = "the quick brown fox jumps over the lazy dog near our house".split()
GAP_S = 0.12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_aligner_checkpoint(tmp_path_factory.mktemp("aligner") / "ctc", seed=0)


@pytest.fixture(scope="module")
def espeak_speech(tmp_path_factory):
    """(audio at 16 kHz, word spans in seconds): each word spoken by espeak-ng, its sound (the
    part above a silence threshold) placed after the previous one and a short gap."""
    if shutil.which("espeak-ng") is None:
        if os.environ.get("CHORUS_REQUIRE_POSTGRES") == "1":  # scripts/test.sh installs both
            pytest.fail("espeak-ng is required here (scripts/test.sh installs it)")
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    folder = tmp_path_factory.mktemp("espeak")
    pieces, spans, at = [], [], 0
    for i, word in enumerate(WORDS):
        path = folder / f"{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), word], check=True, capture_output=True)
        audio, rate = sf.read(path, dtype="float32")
        loud = np.flatnonzero(np.abs(audio) > 0.02)
        sound = audio[loud[0]:loud[-1] + 1]
        sound = audio_functional.resample(torch.from_numpy(sound), rate, 16000).numpy()
        gap = np.zeros(int(GAP_S * 16000), np.float32)
        pieces += [gap, sound]
        at += len(gap)
        spans.append((at / 16000, (at + len(sound)) / 16000))
        at += len(sound)
    pieces.append(np.zeros(int(GAP_S * 16000), np.float32))
    return np.concatenate(pieces), spans


def test_random_checkpoint_aligns_every_word_in_order(checkpoint, espeak_speech):
    audio, _ = espeak_speech
    aligner = CtcAligner(checkpoint)
    try:
        for rate in (16000, 24000):  # the engine's rate is resampled to the checkpoint's
            clip = audio if rate == 16000 else np.interp(np.arange(int(len(audio) * 1.5)) / 1.5,
                                                         np.arange(len(audio)), audio).astype(np.float32)
            spans = aligner.align(clip, rate, WORDS + ["42", "文"]).result()  # unknown characters too
            assert len(spans) == len(WORDS) + 2
            ends = [b for _, b in spans]
            assert all(0 <= a <= b for a, b in spans) and ends == sorted(ends)
            assert ends[-1] <= len(clip) / rate + 1e-6
    finally:
        aligner.close()


def _perfect_emissions(aligner: CtcAligner, truth, seconds: float) -> torch.Tensor:
    """Log-probabilities a perfect model would give: each word's letters spread over its
    sound, the word separator and blanks elsewhere."""
    frames = int(seconds * 50)  # wav2vec2: one frame per 20 ms
    labels = np.full(frames, aligner.blank)
    for word, (a, b) in zip(WORDS, truth):
        first, last = int(a * 50), max(int(a * 50) + len(word), int(b * 50))
        for k, char in enumerate(word):
            lo = first + (last - first) * k // len(word)
            hi = first + (last - first) * (k + 1) // len(word)
            labels[lo:max(hi, lo + 1)] = aligner.ids[char]
    logits = torch.full((1, frames, len(aligner.processor.tokenizer.get_vocab())), -8.0)
    logits[0, torch.arange(frames), torch.from_numpy(labels)] = 8.0
    return logits


def test_the_alignment_path_finds_espeak_word_boundaries_given_perfect_emissions(checkpoint, espeak_speech):
    audio, truth = espeak_speech
    aligner = CtcAligner(checkpoint)
    logits = _perfect_emissions(aligner, truth, len(audio) / 16000)
    aligner.model.forward = lambda *_, **__: type("Out", (), {"logits": logits})()
    try:
        spans = aligner.align(audio, 16000, WORDS).result()
    finally:
        aligner.close()
    errors = [abs(x - y) for (a, b), (c, d) in zip(spans, truth) for x, y in ((a, c), (b, d))]
    assert max(errors) <= 0.041, errors  # two frames: the frame grid and the even split of letters


def test_model_source_error_on_espeak_speech(espeak_speech):
    """The model's estimate from character weights, against espeak-ng's true boundaries (a
    different voice and pace than OmniVoice's: this bounds the estimate, it does not measure it
    on OmniVoice's speech). The figure is in docs/protocol.md."""
    audio, truth = espeak_speech
    text = " ".join(WORDS)
    words, _ = place(text, 0, len(audio))
    errors = [abs(w.start_samples / 16000 - a) for w, (a, _) in zip(words, truth)]
    errors += [abs(w.end_samples / 16000 - b) for w, (_, b) in zip(words, truth)]
    mean = sum(errors) / len(errors)
    print(f"model source on espeak-ng speech: mean boundary error {mean * 1000:.0f} ms, "
          f"max {max(errors) * 1000:.0f} ms")
    assert mean < 0.25  # an estimate: words in the right places, to a fraction of a word


@pytest.fixture(scope="module")
def aligned_server(start_inproc, tmp_path_factory, checkpoint):
    server = start_inproc(tmp_path_factory.mktemp("aligned"), "--aligner", str(checkpoint))
    yield server
    server.stop()


def test_server_sends_aligned_words_before_done(aligned_server):
    text = "The first sentence is short. The second one is longer than the first."

    async def main():
        session = await Session.open(aligned_server.ws_url)
        try:
            await session.synthesize("a", text, progress=False, timestamps="word",
                                     options={"num_step": 4, "seed": 2, "chunk_threshold": 0, "chunk_seconds": 2})
            return (await session.collect(["a"]))["a"]
        finally:
            await session.close()

    out = asyncio.run(main())
    assert out.end["type"] == "done", out.end
    words = out.of("words")
    assert len(words) == len(out.audio) >= 2 and all(w["source"] == "aligned" for w in words)
    assert [w["text"] for frame in words for w in frame["words"]] == text.split()
    total = sum(a.header["samples"] for a in out.audio)
    ends = [w["end_samples"] for frame in words for w in frame["words"]]
    assert ends == sorted(ends) and ends[-1] <= total
    first_audio = next(i for i, f in enumerate(out.frames) if isinstance(f, Audio))
    assert out.frames.index(words[0]) > first_audio  # after the audio it describes
    r = httpx.post(aligned_server.url + "/v1/audio/speech", timeout=120, json={
        "input": text, "response_format": "pcm", "stream_format": "sse", "timestamps": "word",
        "normalize_text": False, "num_step": 4, "seed": 2})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    said = [e for e in events if e["type"] == "speech.audio.words"]
    assert said and all(e["source"] == "aligned" for e in said) and events[-1]["type"] == "speech.audio.done"


def test_make_aligner_and_a_bad_aligner_path(tmp_path):
    made = subprocess.run([sys.executable, "-m", "server", "make-aligner", "--out", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0 and (tmp_path / "a" / "vocab.json").is_file(), made.stderr
    bad = subprocess.run([sys.executable, "-m", "server", "serve", "--aligner", str(tmp_path / "none"),
                          "--voices-dir", str(tmp_path / "v")], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and f"--aligner {tmp_path / 'none'}: no such folder" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_stream_segments_get_aligned_words_before_their_segment_frames(aligned_server):
    out = asyncio.run(stream_once(aligned_server.ws_url, ["The first sentence here. ", "And the second one."],
                                  timestamps="word", options={"num_step": 4, "seed": 2}))
    assert out.end["type"] == "done", out.end
    meta = [f for f in out.frames if not isinstance(f, Audio) and f["type"] in ("words", "segment")]
    assert [(f["type"], f["segment"]) for f in meta] == [("words", 0), ("segment", 0), ("words", 1), ("segment", 1)]
    for words, seg in zip(meta[::2], meta[1::2]):
        assert words["source"] == "aligned"
        start, end = seg["offset_samples"], seg["offset_samples"] + seg["samples"]
        assert all(start <= w["start_samples"] <= w["end_samples"] <= end for w in words["words"])
    assert [w["text"] for f in meta[::2] for w in f["words"]] == "The first sentence here. And the second one.".split()
