"""A chunk's style and text ids through the backend and the style cache equal the reference's
own tokenizer calls; a backend that differs is caught at start and not used."""

from __future__ import annotations

import random
import sys

import torch

from server.engine.planning import prefix_tokens
from server.engine.planning.prefix_tokens import PROBES, PrefixTokenizer, prefix_tokenizer
from server.engine.planning.utterances import _prefix_strings
from server.engine.upstream_names import tokenize_with_nonverbal_tags
from tests.engine.test_packed_len_bound import TEXTS


def _texts(seed: int, count: int = 150) -> list[str]:
    rng = random.Random(seed)
    pools = [range(0x20, 0x7F), range(0x4E00, 0x9FFF), range(0x3000, 0x303F), range(0xFF00, 0xFFEF),
             range(0x0600, 0x06FF), range(0x0900, 0x097F), range(0x1F300, 0x1F6FF), range(0x0300, 0x036F),
             range(0, sys.maxunicode)]
    tags = ["[laughter]", "[sigh]", "[question-en]", "[surprise-wa]", "<|text_end|>", "<|lang_start|>", "[unknown]"]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 60)):
            if rng.random() < 0.08:
                parts.append(rng.choice(tags))
            else:
                c = rng.choice(rng.choice(pools))
                parts.append(chr(c) if not 0xD800 <= c <= 0xDFFF else " ")
        texts.append("".join(parts))
    return texts


def _wrapped(text: str, ref: str | None = None) -> str:
    return _prefix_strings(text, ref, ref is not None, None, None, True)[1]


def test_text_ids_equal_the_reference_helper_with_the_tokenizer(model):
    tokenizer = model.text_tokenizer
    fast = PrefixTokenizer(tokenizer)
    assert fast.check()
    cases = [*PROBES, *TEXTS, *_texts(0), "", " ", "[sigh]", "[sigh][laughter]"]
    for text in cases:
        for ref in (None, "A short reference."):
            wrapped = _wrapped(text, ref)
            expected = tokenize_with_nonverbal_tags(wrapped, tokenizer)[0]
            got = fast.text_ids(wrapped)
            assert got.dtype == expected.dtype and torch.equal(got, expected), text
        raw = tokenize_with_nonverbal_tags(text, tokenizer)[0]  # no wrapper: may be empty pieces
        assert torch.equal(fast.text_ids(text), raw), text


def test_style_ids_are_the_tokenizer_s_and_kept_per_string(model, monkeypatch):
    tokenizer = model.text_tokenizer
    fast = PrefixTokenizer(tokenizer)
    styles = [_prefix_strings("x", None, has_ref, lang, instruct, denoise)[0]
              for has_ref in (False, True) for denoise in (False, True)
              for lang in (None, "English", "Chinese") for instruct in (None, "female, low pitch", "男，低音调")]
    for style in styles:
        expected = tokenizer(style, return_tensors="pt").input_ids[0]
        assert torch.equal(fast.style_ids(style), expected)
        assert fast.style_ids(style) is fast.style_ids(style)  # kept
    monkeypatch.setattr(prefix_tokens, "STYLE_ENTRIES", 4)
    small = PrefixTokenizer(tokenizer)
    for style in styles * 2:
        assert torch.equal(small.style_ids(style), tokenizer(style, return_tensors="pt").input_ids[0])
        assert 1 <= len(small._styles) <= 4


class _WrongBackend:
    """A backend that drops each piece's last id."""

    def __init__(self, backend):
        self.backend = backend

    def encode(self, text, add_special_tokens=True):
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return type("Encoding", (), {"ids": ids[:-1]})()


class _Tokenizer:
    """The tokenizer, with its backend swapped."""

    def __init__(self, tokenizer, backend):
        self._tokenizer = tokenizer
        self.backend_tokenizer = backend

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


def test_a_backend_that_differs_is_not_used(model):
    tokenizer = model.text_tokenizer
    odd = _Tokenizer(tokenizer, _WrongBackend(tokenizer.backend_tokenizer))
    fast = PrefixTokenizer(odd)
    assert fast.check() is False
    wrapped = _wrapped(PROBES[0])
    assert torch.equal(fast.text_ids(wrapped), tokenize_with_nonverbal_tags(wrapped, tokenizer)[0])


def test_a_tokenizer_without_a_backend_uses_its_own_calls(model):
    class Plain:
        def __call__(self, *args, **kwargs):
            return model.text_tokenizer(*args, **kwargs)

    fast = PrefixTokenizer(Plain())
    assert fast.check() is False
    wrapped = _wrapped(PROBES[2])
    assert torch.equal(fast.text_ids(wrapped), tokenize_with_nonverbal_tags(wrapped, model.text_tokenizer)[0])


def test_one_checked_instance_per_tokenizer(model):
    assert prefix_tokenizer(model.text_tokenizer) is prefix_tokenizer(model.text_tokenizer)
