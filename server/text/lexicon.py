"""The pronunciation lexicon: a word or phrase and what to say instead (other words, or a CMU
form in brackets such as `[K AO1 R AH0 S]`, which OmniVoice reads as phones), for every voice
or for one voice.

Entries apply to whole words, case-blind (Unicode case folding: `straße` is `STRASSE`), longest
first (a phrase wins over a word in it), never inside a bracketed span already in the text (a
tag or a CMU form), before normalisation: a CMU form put in is then held out by it, as typed ones
are. Entries for the request's voice win over entries for every voice.

The entries are compiled once per change into one character trie (`Lexicon`), shared by every
request: applying it visits each character of the text once and walks the trie only from where a
word could start, so its cost follows the text, not the number of entries. Its work is bounded
the way all request-controlled work is (`server.bounds`): the text as spoken stops at a
character cap, and the walk checks a deadline and a cancel flag as it goes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from server.bounds import WorkBounds

MAX_TEXT_CHARS = 100
MAX_SAY_CHARS = 300
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
# ARPAbet as CMUdict writes it: vowels carry a stress digit 0-2
_PHONES = frozenset("AA AE AH AO AW AY B CH D DH EH ER EY F G HH IH IY JH K L M N NG OW OY P R S SH T TH UH UW "
                    "V W Y Z ZH".split())
_VOWELS = frozenset("AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split())
# The non-verbal tags OmniVoice reads (the reference's `_NONVERBAL_PATTERN`): a bracketed span of
# `say` is one of these or a CMU form.
NONVERBAL_TAGS = frozenset((
    "laughter", "sigh", "confirmation-en", "question-en", "question-ah", "question-oh", "question-ei",
    "question-yi", "surprise-ah", "surprise-oh", "surprise-wa", "surprise-yo", "dissatisfaction-hnn"))


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
    """Why a bracketed CMU form is not one (unknown phone, a vowel without stress), or None.
    Case-blind: `[k ao1 r]` is checked as `[K AO1 R]`."""
    phones = form[1:-1].upper().split()
    if not phones:
        return "say: an empty bracketed span (a CMU form such as [K AO1 R AH0 S], or a tag such as [laughter])"
    for phone in phones:
        base, stress = (phone[:-1], phone[-1]) if phone[-1:].isdigit() else (phone, "")
        if base not in _PHONES or (stress and stress not in "012") or (base in _VOWELS) != bool(stress):
            return (f"say: {phone!r} is not a CMU phone (ARPAbet, vowels with a stress digit 0-2, "
                    "as in [K AO1 R AH0 S]); a bracketed span is a CMU form or a tag such as [laughter]")
    return None


def normal_text(text: str) -> str:
    """An entry's `text` as stored and compared: NFC (a composed and a decomposed `é` are one
    entry), whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def normal_say(say: str) -> str:
    """An entry's `say` as stored: NFC, stripped, CMU forms in upper case (as OmniVoice reads
    them); tags as written."""
    say = unicodedata.normalize("NFC", say).strip()
    return _BRACKETS.sub(lambda m: m.group(0) if m.group(0)[1:-1] in NONVERBAL_TAGS else m.group(0).upper(), say)


def entry_problem(text: str, say: str) -> tuple[str, str] | None:
    """(field, message) of what is wrong with a new entry (as `normal_text` / `normal_say`
    made it), or None."""
    for field, value, limit in (("text", text, MAX_TEXT_CHARS), ("say", say, MAX_SAY_CHARS)):
        if (problem := _printable_problem(field, value, limit)) is not None:
            return field, problem
    if not any(c.isalnum() for c in text):
        return "text", "text: must hold a word (a letter or digit)"
    if "[" in text or "]" in text:
        return "text", "text: must not hold brackets (a word or phrase as it is written)"
    if "[" in _BRACKETS.sub("", say) or "]" in _BRACKETS.sub("", say):
        return "say", ("say: unbalanced brackets (each [ closes with ] before the next [, as in "
                       "[K AO1 R AH0 S] or [laughter])")
    for form in _BRACKETS.findall(say):
        if form[1:-1] not in NONVERBAL_TAGS and (problem := cmu_problem(form)):
            return "say", problem
    return None


# A letter or digit of a script that writes spaces between words marks where a word goes on. CJK
# has no spaces; its entries match anywhere, and a CJK character next to a Latin word is an edge.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_IS_SPACED_WORD = re.compile(f"[^\\W{_CJK}]")
_END = ""  # the trie key under which a node keeps its entries: no character folds to ""


def _spaced_word(char: str) -> bool:
    return _IS_SPACED_WORD.match(char) is not None


def _key(text: str) -> str:
    """What an entry's text is matched as: NFC, case-folded, one space between words."""
    return " ".join(unicodedata.normalize("NFC", text).casefold().split())


@dataclass(frozen=True)
class Substitution:
    """Where an entry replaced written text: `spoken_start:spoken_end` of the text as spoken
    stands for `written` (word timestamps carry the word as written)."""

    spoken_start: int
    spoken_end: int
    written: str


@dataclass(frozen=True)
class Applied:
    text: str
    substitutions: tuple[Substitution, ...] = ()

    def as_written(self) -> tuple[tuple[str, str], ...]:
        """(what was said, what was written) for each substitution, in order."""
        return tuple((self.text[s.spoken_start:s.spoken_end], s.written) for s in self.substitutions)


class Lexicon:
    """Every entry, compiled into one trie of case-folded characters. A node's `_END` holds
    {voice or None: say}; a request picks its voice's entry over the every-voice one."""

    def __init__(self, entries: Iterable[Pronunciation]):
        self.root: dict = {}
        self.size = 0
        self.scoped = False  # any entry for one voice: requests then resolve their voice's ids
        for entry in entries:
            node = self.root
            for char in _key(entry.text):
                node = node.setdefault(char, {})
            node.setdefault(_END, {})[entry.voice] = entry.say
            self.size += 1
            self.scoped |= entry.voice is not None

    def __bool__(self) -> bool:
        return self.size > 0

    def apply(self, text: str, voice_ids: frozenset[str] | set[str] = frozenset(),
              bounds: WorkBounds | None = None) -> Applied:
        """`text` with every whole-word match replaced by what its entry says, and where.
        `bounds`: the spoken text's cap, the deadline and the cancel flag (checked as it goes)."""
        if not self.size:
            return Applied(text)
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        bounds = bounds or WorkBounds.unbounded()
        out: list[str] = []
        subs: list[Substitution] = []
        length = 0
        last = 0
        for bracket in _BRACKETS.finditer(text):  # tags and CMU forms already there stay as they are
            length = self._replace_in(text, last, bracket.start(), voice_ids, out, subs, length, bounds)
            out.append(bracket.group(0))
            length += len(bracket.group(0))
            last = bracket.end()
        length = self._replace_in(text, last, len(text), voice_ids, out, subs, length, bounds)
        bounds.check_size(length)
        return Applied("".join(out), tuple(subs))

    def _replace_in(self, text: str, start: int, stop: int, voice_ids, out: list[str], subs: list[Substitution],
                    length: int, bounds: WorkBounds) -> int:
        """Replace matches in text[start:stop] (no brackets inside), appending to `out`; the
        spoken length so far in and out."""
        i = plain_from = start
        root = self.root
        steps = 0
        while i < stop:
            steps += 1
            if steps & 1023 == 0:
                bounds.check(length + i - plain_from)
            char = text[i]
            folded = char.casefold()
            if folded[0] not in root or (i > 0 and _spaced_word(char) and _spaced_word(text[i - 1])):
                i += 1
                continue
            found = self._longest(text, i, stop, voice_ids)
            if found is None:
                i += 1
                continue
            end, say = found
            if i > plain_from:
                out.append(text[plain_from:i])
                length += i - plain_from
            subs.append(Substitution(length, length + len(say), text[i:end]))
            out.append(say)
            length += len(say)
            bounds.check_size(length)
            i = plain_from = end
        if stop > plain_from:
            out.append(text[plain_from:stop])
            length += stop - plain_from
        return length

    def _longest(self, text: str, i: int, stop: int, voice_ids) -> tuple[int, str] | None:
        """The longest entry that applies starting at `i`: (its end, what it says), or None. A
        run of spaces in the text matches the one space between an entry's words."""
        node = self.root
        j = i
        best = None
        while j < stop:
            char = text[j]
            if char.isspace():
                node = node.get(" ")
                if node is None:
                    break
                while j < stop and text[j].isspace():
                    j += 1
                continue  # an entry never ends on a space
            for folded in char.casefold():
                node = node.get(folded)
                if node is None:
                    return best
            j += 1
            ends = node.get(_END)
            if ends is not None and not (_spaced_word(char) and j < len(text) and _spaced_word(text[j])):
                say = next((ends[v] for v in voice_ids if v in ends), ends.get(None))
                if say is not None:
                    best = (j, say)
        return best


def apply(text: str, pairs: Iterable[tuple[str, str]]) -> str:
    """`text` with every-voice entries `(text, say)` applied (a one-off `Lexicon`)."""
    return Lexicon(Pronunciation("", t, s) for t, s in pairs).apply(text).text
