"""`normalize_text`: numbers, dates, currency and symbols read as words, exactly as the
reference's `generate(normalize_text=True)` does it.

The reference's own module (`omnivoice/utils/text.py`) is used, loaded by path as the
instruction mapper loads the voice-design table (importing the `omnivoice` package would load
torch into the web layer); only the language is resolved here, with the reference's table
(`omnivoice/utils/lang_map.py`, also by path), as its `_resolve_language` does. So:

- English and Chinese go through WeTextProcessing (the `tn` extra: `pip install
  'chorus-tts[tn]'`, which brings pynini; its grammars ship prebuilt);
- other languages: `num2words` for bare integers, where it knows the language;
- inline control syntax is held out and put back verbatim: `[...]` spans (non-verbal tags
  such as `[laughter]`, CMU pronunciations such as `[B EY1 S]`) and, for Chinese, pinyin with
  a tone digit (`ZHONG1`).

Where WeTextProcessing is not installed the reference raises; here English and Chinese fall
back to what the reference does for other languages (`num2words` on bare integers), and the
server says so once at start (`available()`).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType

from server.text.reference_modules import reference_module

log = logging.getLogger("chorus.text")

_CJK = re.compile(r"[\u4e00-\u9fff]")


@lru_cache(maxsize=1)
def _text() -> ModuleType:
    return reference_module("text")


@lru_cache(maxsize=1)
def _languages() -> ModuleType:
    return reference_module("lang_map")


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether WeTextProcessing (English and Chinese) is installed."""
    return importlib.util.find_spec("tn") is not None


def language_code(language: str | None, text: str) -> str:
    """`zh`, `en` or another of the reference's ids: the request's language as the reference
    resolves it, else (none, or not one it knows) Chinese when the text has CJK, English
    otherwise."""
    if language is not None:
        table = _languages()
        if language in table.LANG_IDS:
            return language
        if (code := table.LANG_NAME_TO_ID.get(language.lower())) is not None:
            return code
    return "zh" if _CJK.search(text) else "en"


def uses_grammars(text: str, language: str | None) -> bool:
    """Whether `normalize(text, language)` runs WeTextProcessing's grammars (English or
    Chinese, installed): slow C++ that keeps the GIL (`server.text.normalize_workers`)."""
    return bool(text.strip()) and available() and language_code(language, text) in ("zh", "en")


def _normalizer(code: str) -> tuple[Callable[[str], str], bool]:
    """The function for one language and whether pinyin is protected (Chinese)."""
    module = _text()
    if code in ("zh", "en") and available():
        normalizer = module._get_zh_normalizer() if code == "zh" else module._get_en_normalizer()
        return normalizer.normalize, code == "zh"
    # num2words leaves what it cannot read (a language it lacks) as it was
    return (lambda piece: module._num2words_segment(piece, code)), code == "zh"


def normalize(text: str, language: str | None) -> str:
    """The text with numbers, dates, currency and symbols as words; inline pronunciations
    and tags untouched. Never raises on odd input (a piece that fails stays as it was)."""
    if not text or not text.strip():
        return text
    function, protect_pinyin = _normalizer(language_code(language, text))
    return _text()._apply_with_protection(text, function, protect_pinyin=protect_pinyin)


def report_availability() -> None:
    """Say at start what `normalize_text` can do here. The grammars themselves load at their
    language's first use, in a worker process: loading both at every start would cost every
    replica, and every test server, a few CPU-seconds it may never need."""
    if not available():
        log.warning("normalize_text: WeTextProcessing is not installed (pip install 'chorus-tts[tn]'); "
                    "English text gets only bare integers read as words (num2words), Chinese none")
