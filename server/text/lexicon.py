"""The pronunciation lexicon: a word or phrase and what to say instead (other words, or a CMU
form in brackets such as `[K AO1 R AH0 S]`, which OmniVoice reads as phones), for every voice
or for one voice.

Entries apply to whole words, case-blind, longest first (a phrase wins over a word in it),
never inside a bracketed span already in the text (a tag or a CMU form), before
normalisation: a CMU form put in is then held out by it, as typed ones are. Entries for the
request's voice win over entries for every voice.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import msgspec

MAX_TEXT_CHARS = 100
MAX_SAY_CHARS = 300
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
# ARPAbet as CMUdict writes it: vowels carry a stress digit 0-2
_PHONES = frozenset("AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH UH UW "
                    "V W Y Z ZH".split())
_VOWELS = frozenset("AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split())


class Pronunciation(msgspec.Struct, frozen=True):
    """One entry of `/v1/pronunciations`."""

    id: str
    text: str
    say: str
    voice: str | None = None  # null: every voice


def _printable_problem(field: str, value: str, limit: int) -> str | None:
    if not value.strip() or len(value) > limit:
        return f"{field}: must be 1..{limit} characters"
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in value):
        return f"{field}: must not contain control or formatting characters"
    return None


def cmu_problem(form: str) -> str | None:
    """Why a bracketed CMU form is not one (unknown phone, a vowel without stress), or None."""
    phones = form[1:-1].split()
    if not phones:
        return "say: an empty CMU form"
    for phone in phones:
        base, stress = (phone[:-1], phone[-1]) if phone[-1:].isdigit() else (phone, "")
        if base not in _PHONES or (stress and stress not in "012") or (base in _VOWELS) != bool(stress):
            return (f"say: {phone!r} is not a CMU phone (ARPAbet, vowels with a stress digit 0-2, "
                    "as in [K AO1 R AH0 S])")
    return None


def entry_problem(text: str, say: str) -> tuple[str, str] | None:
    """(field, message) of what is wrong with a new entry, or None."""
    for field, value, limit in (("text", text, MAX_TEXT_CHARS), ("say", say, MAX_SAY_CHARS)):
        if (problem := _printable_problem(field, value, limit)) is not None:
            return field, problem
    if not any(c.isalnum() for c in text):
        return "text", "text: must hold a word (a letter or digit)"
    if "[" in text or "]" in text:
        return "text", "text: must not hold brackets (a word or phrase as it is written)"
    for form in _BRACKETS.findall(say):
        if form[1:-1].strip() and form[1:-1].upper() == form[1:-1] and (problem := cmu_problem(form)):
            return "say", problem
    return None


def for_voice(entries: list[Pronunciation], voice_ids: set[str]) -> tuple[tuple[str, str], ...]:
    """(text, say) pairs that apply to a request with one of `voice_ids` (empty: no voice):
    its voice's entries over every voice's, for the same text."""
    chosen: dict[str, tuple[str, str]] = {}
    for entry in sorted(entries, key=lambda e: e.voice is not None):  # voice entries last: they win
        if entry.voice is None or entry.voice in voice_ids:
            chosen[entry.text.casefold()] = (entry.text, entry.say)
    return tuple(sorted(chosen.values()))


# A letter or digit of a script that writes spaces between words marks where a word goes on. CJK
# has no spaces; its entries match anywhere, and a CJK character next to a Latin word is an edge.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_SPACED_WORD = f"[^\\W{_CJK}]"
_IS_SPACED_WORD = re.compile(_SPACED_WORD)


@lru_cache(maxsize=64)
def _matcher(pairs: tuple[tuple[str, str], ...]) -> tuple[re.Pattern[str], dict[str, str]]:
    ordered = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)
    parts = []
    for text, _ in ordered:
        words = r"\s+".join(re.escape(word) for word in text.split())
        left = f"(?<!{_SPACED_WORD})" if _IS_SPACED_WORD.match(text[0]) else ""
        right = f"(?!{_SPACED_WORD})" if _IS_SPACED_WORD.match(text[-1]) else ""
        parts.append(f"{left}{words}{right}")
    say = {" ".join(text.casefold().split()): replacement for text, replacement in ordered}
    return re.compile("|".join(parts), re.IGNORECASE), say


def apply(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """`text` with every whole-word match of an entry replaced by what it says."""
    if not pairs:
        return text
    pattern, say = _matcher(pairs)

    def replace_in(piece: str) -> str:
        return pattern.sub(lambda m: say[" ".join(m.group(0).casefold().split())], piece)

    out, last = [], 0
    for bracket in _BRACKETS.finditer(text):  # tags and CMU forms already there stay as they are
        out.append(replace_in(text[last:bracket.start()]))
        out.append(bracket.group(0))
        last = bracket.end()
    out.append(replace_in(text[last:]))
    return "".join(out)
