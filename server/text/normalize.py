"""`normalize_text`: numbers, dates, currency and symbols read as words before synthesis.

`normalize_text` picks the normaliser (`Choice`):

- `true`: the best one measured for the language (`docs/normalization.md`): NeMo's
  (`server.text.normalize_nemo`) for English, the reference's for every other language (no
  other was measured better for them);
- `"reference"`: exactly the reference's `generate(normalize_text=True)`, for parity;
- `false`: none (the caller does not come here).

The reference's own module (`omnivoice/utils/text.py`) is used, loaded by path as the
instruction mapper loads the voice-design table (importing the `omnivoice` package would load
torch into the web layer); only the language is resolved here, with the reference's table
(`omnivoice/utils/lang_map.py`, also by path), as its `_resolve_language` does. So, under
`"reference"`:

- English and Chinese go through WeTextProcessing (the `tn` extra: `pip install
  'chorus-tts[tn]'`, which brings pynini; its grammars ship prebuilt);
- other languages: `num2words` for bare integers, where it knows the language.

Whichever normaliser runs, inline control syntax is held out and put back verbatim, by the
reference's own function: `[...]` spans (non-verbal tags such as `[laughter]`, CMU
pronunciations such as `[B EY1 S]`) and, for Chinese, pinyin with a tone digit (`ZHONG1`).

Where WeTextProcessing is not installed the reference raises; here English and Chinese fall
back to what the reference does for other languages (`num2words` on bare integers), and the
server says so once at start (`report_availability()`). Where NeMo's normaliser is not
installed or fails to load, English under `true` gets the reference's.
"""
from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType
from typing import Literal

from server.text import normalize_nemo
from server.text.phone_numbers import spell_phone_numbers
from server.text.reference_modules import reference_module

log = logging.getLogger("chorus.text")

_CJK = re.compile(r"[\u4e00-\u9fff]")

REFERENCE = "reference"
Choice = bool | Literal["reference"]  # the wire's `normalize_text`


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


def which(choice: Choice, code: str) -> str:
    """The normaliser `choice` runs for the language `code`: `nemo` (English under `true`, where
    installed) or `reference`."""
    if choice != REFERENCE and code == "en" and normalize_nemo.available():
        return "nemo"
    return REFERENCE


def _normalizer(code: str, choice: Choice) -> tuple[Callable[[str], str], bool]:
    """The function for one language and choice, and whether pinyin is protected (Chinese)."""
    if which(choice, code) == "nemo" and (nemo := normalize_nemo.normalizer()) is not None:
        return (lambda piece: nemo(spell_phone_numbers(piece))), False
    module = _text()
    if code in ("zh", "en") and available():
        normalizer = module._get_zh_normalizer() if code == "zh" else module._get_en_normalizer()
        return normalizer.normalize, code == "zh"
    # num2words leaves what it cannot read (a language it lacks) as it was
    return (lambda piece: module._num2words_segment(piece, code)), code == "zh"


def normalize(text: str, language: str | None, choice: Choice = True) -> str:
    """The text with numbers, dates, currency and symbols as words, by the normaliser `choice`
    picks (`"reference"`: exactly the reference's `normalize_text(text, language)`); inline
    pronunciations and tags untouched. Never raises on odd input (a piece that fails stays as
    it was)."""
    if not text or not text.strip():
        return text
    function, protect_pinyin = _normalizer(language_code(language, text), choice)
    return _text()._apply_with_protection(text, function, protect_pinyin=protect_pinyin)


def report_availability() -> None:
    """Say at start what `normalize_text` can do here, and start compiling NeMo's English
    grammars where they are not cached yet (`normalize_nemo.start_background_build`). The
    grammars themselves load at their first use, in a worker process: loading them at every
    start would cost every replica, and every test server, CPU-seconds it may never need."""
    if not available():
        log.warning("normalize_text: WeTextProcessing is not installed (pip install 'chorus-tts[tn]'); "
                    "English text gets only bare integers read as words (num2words), Chinese none")
    if not normalize_nemo.available():
        log.warning("normalize_text: nemo-text-processing is not installed (pip install 'chorus-tts[tn]'); "
                    "English text gets the reference's normaliser under normalize_text: true")
        return
    normalize_nemo.start_background_build()
