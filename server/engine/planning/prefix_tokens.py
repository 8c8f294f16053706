"""A chunk's style and text token ids, as the reference makes them, at less cost.

Style ids are kept per style string; the text still goes through the reference's
`_tokenize_with_nonverbal_tags`, with each piece encoded by the fast tokenizer's backend.
`PrefixTokenizer.check` compares both with the tokenizer's own calls when an engine starts; a
tokenizer they differ on keeps the plain calls.
"""

from __future__ import annotations

import logging
import weakref
from types import SimpleNamespace

import torch

from server.engine.upstream_names import tokenize_with_nonverbal_tags

log = logging.getLogger("chorus.engine")

STYLE_ENTRIES = 256  # distinct style strings remembered (instructs are free text)
PROBES = (
    "Hello there, Dr. Smith! It's 3.5 degrees at 10:45 p.m.; naïve café.",
    "你好，世界。今天天气很好（真的），我们去公园散步吧。",
    "[laughter] Well, that was unexpected [sigh] but fine.[question-en]",
    "Emoji 🎉🎶, marks e\u0301 and \u212b, tabs\tand  spaces, <|text_end|> typed in.",
    "Привет, мир. مرحبا بالعالم. नमस्ते दुनिया. こんにちは世界。안녕하세요.",
)


class _BackendCall:
    """Stands in for the tokenizer inside the reference's helper: the pieces it encodes
    without tensors go to the backend; anything else to the tokenizer itself."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer

    def __call__(self, text, add_special_tokens: bool = True, **kwargs):
        if kwargs or not isinstance(text, str):
            return self.tokenizer(text, add_special_tokens=add_special_tokens, **kwargs)
        return SimpleNamespace(input_ids=self.backend.encode(text, add_special_tokens=add_special_tokens).ids)


class PrefixTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text_tokenizer = _BackendCall(tokenizer) if hasattr(tokenizer, "backend_tokenizer") else tokenizer
        self._styles: dict[str, torch.Tensor] = {}  # engine and event-loop threads both use it

    def style_ids(self, style: str) -> torch.Tensor:
        """`tokenizer(style, return_tensors="pt").input_ids[0]`, kept per string (callers
        copy it: `torch.cat`)."""
        ids = self._styles.get(style)
        if ids is None:
            if len(self._styles) >= STYLE_ENTRIES:  # many free-text instructs: start over
                self._styles.clear()
            ids = self._styles[style] = self.tokenizer(style, return_tensors="pt").input_ids[0]
        return ids

    def text_ids(self, wrapped: str) -> torch.Tensor:
        """`_tokenize_with_nonverbal_tags(wrapped, tokenizer)[0]`."""
        return tokenize_with_nonverbal_tags(wrapped, self._text_tokenizer)[0]

    def check(self) -> bool:
        """Compare the backend's pieces with the tokenizer's own calls on the probes; on any
        difference (or failure) use the plain calls from now on. True when the fast path stays."""
        if self._text_tokenizer is self.tokenizer:
            return False
        try:
            same = all(torch.equal(self.text_ids(f"<|text_start|>{text}<|text_end|>"),
                                   tokenize_with_nonverbal_tags(f"<|text_start|>{text}<|text_end|>",
                                                                self.tokenizer)[0])
                       for text in PROBES)
        except Exception:  # a backend that fails keeps the plain calls
            log.warning("the tokenizer's backend failed its check; tokenizing through the tokenizer",
                        exc_info=True)
            same = False
        if not same:
            log.warning("the tokenizer's backend differs from the tokenizer on probe texts; using the tokenizer")
            self._text_tokenizer = self.tokenizer
        return same


_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prefix_tokenizer(tokenizer) -> PrefixTokenizer:
    """The checked `PrefixTokenizer` of this tokenizer (made, and checked, on first use)."""
    found = _BY_TOKENIZER.get(tokenizer)
    if found is None:
        found = _BY_TOKENIZER[tokenizer] = PrefixTokenizer(tokenizer)
        found.check()
    return found
