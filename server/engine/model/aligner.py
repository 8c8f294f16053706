"""`"source": "aligned"` timestamps: a CTC forced aligner over the audio a chunk became.

`--aligner PATH` names a local wav2vec2 / MMS-style CTC checkpoint (a `Wav2Vec2ForCTC` with its
processor, as `save_pretrained` writes them; a character vocabulary with `|` between words, as
MMS's and wav2vec2's English ones). For each chunk the audio (resampled to the checkpoint's rate)
goes through the model once; `torchaudio.functional.forced_align` finds the most likely path
of the chunk's characters through its per-frame log-probabilities, and each word spans from its
first character's first frame to its last character's last frame.

It runs on its own thread (`align` returns a Future), never on the engine's step loop, so it
never delays audio; requests wait for it only to send their `words` frames. Characters the
vocabulary lacks are skipped; a word with none of its characters in it (digits, CJK on an
English model) is placed between its neighbours. `make_aligner_checkpoint` (`chorus
make-aligner`) writes a small random-weight one of the real format, which runs `--aligner`'s
every path without a download, as `make-checkpoint` does for the model: its alignments follow
the text, not the sound.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as audio_functional

log = logging.getLogger("chorus.aligner")

Spans = list[tuple[float, float]]  # per word: (start, end) in seconds from the chunk's start


class CtcAligner:
    def __init__(self, path: str | Path, device: str = "cpu"):
        from transformers import AutoProcessor, Wav2Vec2ForCTC  # lazy: only a server started with --aligner

        self.path = str(path)
        self.processor = AutoProcessor.from_pretrained(self.path)
        self.model = Wav2Vec2ForCTC.from_pretrained(self.path).to(device).eval()
        self.device = device
        self.rate = int(self.processor.feature_extractor.sampling_rate)
        vocab = self.processor.tokenizer.get_vocab()
        self.blank = int(self.processor.tokenizer.pad_token_id)
        self.separator = vocab.get(self.processor.tokenizer.word_delimiter_token)
        self.lower = not any(token.isupper() for token in vocab if len(token) == 1)
        self.ids = {token: index for token, index in vocab.items() if len(token) == 1}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chorus-aligner")
        self._lock = threading.Lock()
        log.info("aligner loaded", extra={"aligner": self.path, "rate": self.rate})

    def align(self, audio: np.ndarray, rate: int, words: Sequence[str]) -> Future[Spans]:
        """Each word's span in `audio` (mono float32 at `rate`), on the aligner's thread."""
        return self._pool.submit(self._align, np.ascontiguousarray(audio, dtype=np.float32).reshape(-1), rate,
                                 list(words))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _targets(self, words: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of the transcript and, per word, its range in them (empty when none of its
        characters are in the vocabulary)."""
        ids: list[int] = []
        ranges = []
        for word in words:
            if ids and self.separator is not None and ranges and ranges[-1][1] > ranges[-1][0]:
                ids.append(self.separator)
            start = len(ids)
            ids += [self.ids[c] for c in (word.lower() if self.lower else word) if c in self.ids]
            ranges.append((start, len(ids)))
        return ids, ranges

    @torch.inference_mode()
    def _align(self, audio: np.ndarray, rate: int, words: list[str]) -> Spans:
        seconds = len(audio) / rate
        ids, ranges = self._targets(words)
        waveform = torch.from_numpy(audio)
        if rate != self.rate:
            waveform = audio_functional.resample(waveform, rate, self.rate)
        inputs = self.processor.feature_extractor(waveform.numpy(), sampling_rate=self.rate, return_tensors="pt")
        logits = self.model(inputs.input_values.to(self.device)).logits.float()
        emissions = torch.log_softmax(logits, dim=-1).cpu()
        frames = emissions.shape[1]
        if not ids or frames < len(ids):  # nothing to align, or too short to hold every token
            return _spread(len(words), seconds)
        path, _ = audio_functional.forced_align(emissions, torch.tensor([ids], dtype=torch.int32), blank=self.blank)
        path = path[0].tolist()
        first: list[int | None] = [None] * len(ids)
        last: list[int | None] = [None] * len(ids)
        token, previous = -1, self.blank
        for frame, label in enumerate(path):  # the k-th emitted token run is target k
            if label != self.blank and (label != previous or token < 0):
                token += 1
            if label != self.blank and 0 <= token < len(ids):
                first[token] = frame if first[token] is None else first[token]
                last[token] = frame
            previous = label
        per_frame = seconds / frames
        spans: list[tuple[float, float] | None] = []
        for start, end in ranges:
            known = [(first[k], last[k]) for k in range(start, end) if first[k] is not None]
            spans.append((known[0][0] * per_frame, (known[-1][1] + 1) * per_frame) if known else None)
        return _fill(spans, seconds)


def _spread(n: int, seconds: float) -> Spans:
    return [(seconds * i / n, seconds * (i + 1) / n) for i in range(n)]


def _fill(spans: list[tuple[float, float] | None], seconds: float) -> Spans:
    """Words the aligner could not place go between their neighbours; spans never go back."""
    out: Spans = []
    i = 0
    while i < len(spans):
        if spans[i] is not None:
            start, end = spans[i]
            floor = out[-1][1] if out else 0.0
            out.append((max(start, floor), max(end, start, floor)))
            i += 1
            continue
        j = i
        while j < len(spans) and spans[j] is None:
            j += 1
        left = out[-1][1] if out else 0.0
        right = spans[j][0] if j < len(spans) else seconds
        right = max(right, left)
        for k in range(i, j):
            out.append((left + (right - left) * (k - i) / (j - i), left + (right - left) * (k - i + 1) / (j - i)))
        i = j
    return out


VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|", *"abcdefghijklmnopqrstuvwxyz'"]


def make_aligner_checkpoint(out: str | Path, seed: int = 0) -> Path:
    """A random-weight wav2vec2 CTC checkpoint of the real format (a small one: 2 layers of
    32), with a character vocabulary as wav2vec2's English models have (`chorus make-aligner`)."""
    from transformers import (  # lazy: only `chorus make-aligner` needs them
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(VOCAB)}))
    tokenizer = Wav2Vec2CTCTokenizer(str(out / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                                     word_delimiter_token="|")
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                         do_normalize=True, return_attention_mask=False)
    Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out)
    torch.manual_seed(seed)
    config = Wav2Vec2Config(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, conv_dim=(16,) * 7, num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=4, pad_token_id=0, do_stable_layer_norm=True,
                            feat_extract_norm="layer")
    Wav2Vec2ForCTC(config).eval().save_pretrained(out)
    return out
