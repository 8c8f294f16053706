"""One request's (or stream's) timestamps: each chunk's words placed on its audio clock.

The clock is the audio sent, in samples at the request's `sample_rate` (the same clock as a
stream's `offset_samples`): a chunk of N samples at the engine's rate that starts after M of
them spans round(M * out / in) .. round((M + N) * out / in) there, whatever the encoder holds
back between frames.
"""

from __future__ import annotations

from server.engine.types import ChunkTokens
from server.timestamps.frames import TimestampKind, WordsMsg
from server.timestamps.model_words import place


class WordClock:
    def __init__(self, request_id: str, kind: TimestampKind):
        self.request_id = request_id
        self.kind = kind
        self.texts: dict[int, str] = {}  # chunk -> the text it spoke (from its finished tokens)
        self.engine_samples = 0  # audio so far, at the engine's rate

    def on_tokens(self, event: ChunkTokens) -> None:
        self.texts[event.chunk] = event.text

    def whole_text(self) -> str:
        """Every chunk's text, in order: the words of a request sent whole."""
        return " ".join(self.texts[k].strip() for k in sorted(self.texts))

    def frame(self, text: str, samples: int, engine_rate: int, out_rate: int,
              segment: int | None = None) -> WordsMsg:
        """The `words` frame of the next `samples` of audio (at `engine_rate`), speaking `text`."""
        start = round(self.engine_samples * out_rate / engine_rate)
        self.engine_samples += samples
        end = round(self.engine_samples * out_rate / engine_rate)
        words, chars = place(text.strip(), start, end, chars=self.kind == "char")
        return WordsMsg(self.request_id, "model", words, segment=segment, chars=chars)
