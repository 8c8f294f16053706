"""OpenAI's free-text `instructions` -> the voice-design items OmniVoice understands.

OpenAI clients send prose ("Speak in a cheerful and positive tone."); OmniVoice takes a list
of fixed items ("female, low pitch, british accent"). The items come from the reference's own
table (`omnivoice/utils/voice_design.py`, loaded by path: it needs only `re`, while importing
the `omnivoice` package would load torch into the web layer). Each clause of the text that is
an item, or contains items or the words people use for them ("woman", "old", "British",
"whispering": `_SAID_AS`), gives those items; the first item of a category wins (one gender,
one age, ...). Whatever was not used (a clause without items, or the words of a clause beyond
its items and filler) is reported back, never refused.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

_CLAUSES = re.compile(r"[,，.。;；!！?？\n]+")
_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclass(frozen=True)
class Instructions:
    """`instruct`: the items used, as OmniVoice spells them (None: none); `ignored`: the
    clauses (or items) left out, in the client's words."""

    instruct: str | None
    ignored: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def _table() -> ModuleType:
    spec = importlib.util.find_spec("omnivoice")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the omnivoice package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / "voice_design.py"
    module_spec = importlib.util.spec_from_file_location("chorus_voice_design_table", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[str, str, re.Pattern[str]]]:
    """Every item, longest first (so "very low pitch" wins over "low pitch"), as a
    whole-word pattern (CJK items match as substrings: they have no word breaks)."""
    said = [(item, item) for item in _table()._INSTRUCT_ALL_VALID]
    said += [(item, word) for item, words in _SAID_AS.items() for word in words]
    said.sort(key=lambda pair: len(pair[1]), reverse=True)
    return [(item, word, re.compile(re.escape(word) if _CJK.search(word) else rf"(?<![\w-]){re.escape(word)}(?![\w-])"))
            for item, word in said]


# How people say the items in prose: each word (or phrase) gives the item OmniVoice's voice
# design spells; an adjective of nationality is that accent ("a British woman" -> british
# accent, female), as the reference's accent items are the only accents it knows.
_SAID_AS: dict[str, tuple[str, ...]] = {
    "female": ("woman", "women", "lady", "girl", "feminine", "she"),
    "male": ("man", "men", "guy", "gentleman", "boy", "masculine", "he"),
    "elderly": ("old", "older", "aged", "senior", "elder", "grandmother", "grandfather", "grandma", "grandpa"),
    "child": ("kid", "children", "little child", "young child"),
    "teenager": ("teen", "teenage", "teens", "adolescent"),
    "young adult": ("young",),
    "middle-aged": ("middle aged", "middle age"),
    "whisper": ("whispering", "whispered", "whispers", "whispery"),
    "low pitch": ("deep", "low-pitched", "low pitched"),
    "high pitch": ("high-pitched", "high pitched", "squeaky"),
    **{f"{nation} accent": (nation,) for nation in ("american", "british", "australian", "chinese", "canadian",
                                                   "indian", "korean", "portuguese", "russian", "japanese")},
}


def _category(item: str) -> int:
    for index, members in enumerate(_table()._INSTRUCT_MUTUALLY_EXCLUSIVE):
        if item in members:
            return index
    return -1


@lru_cache(maxsize=1024)
def _found(clause: str) -> tuple[list[tuple[int, str]], str]:
    """The items said in `clause` (by position) and the clause with them blanked out
    (remembered: prose repeats its clauses)."""
    found: list[tuple[int, str]] = []
    text = clause.lower()
    for item, word, pattern in _patterns():
        if word not in text:  # (cheap) no match can follow; blanking only removes
            continue
        for match in pattern.finditer(text):
            found.append((match.start(), item))
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)  # "very low pitch" is not also "low pitch"
    return sorted(found), text


def map_instructions(text: str | None) -> Instructions:
    """Free text -> the OmniVoice instruct it holds, plus what was ignored. Linear in the
    text: one pass of each word's pattern per distinct clause, only where the word occurs
    (callers bound the text's length first: `--max-instructions-chars`)."""
    if text is None or not text.strip():
        return Instructions(None)
    used: list[str] = []
    ignored: list[str] = []
    taken: set[int] = set()
    has_accent = has_dialect = False
    for clause in (c.strip() for c in _CLAUSES.split(text)):
        if not clause:
            continue
        found, rest = _found(clause)
        items = list(dict.fromkeys(item for _, item in found))  # "old ... elderly" is one item
        if not items:
            ignored.append(clause)
        elif leftover := _leftover(clause, rest):
            ignored.append(leftover)
        for item in items:
            category = _category(item)
            accent, dialect = item.endswith(" accent"), item.endswith("话")
            if category in taken or (accent and has_dialect) or (dialect and has_accent):
                ignored.append(item)
                continue
            taken.add(category)
            has_accent, has_dialect = has_accent or accent, has_dialect or dialect
            used.append(item)
    zh = any(_CJK.search(item) for item in used)
    return Instructions(("，" if zh else ", ").join(used) or None, ignored)


_FILLER = frozenset("a an the with and in of voice speaker speak speaking sound sounding like tone accent "
                    "pitch please use using very who is as".split())


def _leftover(clause: str, rest: str) -> str:
    """The words of a clause that are neither its items nor filler, in order and as the
    client wrote them ("" when none): the part of the instruction that was not used."""
    source = clause if len(clause) == len(rest) else rest  # lower() kept the positions
    words = (source[m.start():m.end()] for m in re.finditer(r"[\w'-]+", rest) if m.group(0) not in _FILLER)
    return " ".join(words)


HEADER_MAX_CHARS = 1000
_HEADER_SAFE = " !\"#$&'()*+,-./:;<=>?@[]^_`{|}~"


def header_value(ignored: list[str], max_chars: int = HEADER_MAX_CHARS) -> str:
    """`X-Chorus-Ignored-Instructions`: the ignored pieces joined by "; ", percent-encoded
    where not printable ASCII (headers are Latin-1 on the wire, control characters never
    allowed), whole pieces only up to `max_chars`, with no space at either end (HTTP
    refuses a value that ends in one)."""
    out: list[str] = []
    used = 0
    for piece in ignored:
        encoded = quote(" ".join(piece.split()), safe=_HEADER_SAFE)
        if not encoded:
            continue
        cost = len(encoded) + (2 if out else 0)
        if used + cost > max_chars:
            if not out:  # one piece alone too long: its start, cut between escapes
                cut = encoded[:max_chars]
                out.append(cut[: cut.rfind("%")] if "%" in cut[-2:] else cut)
            break
        out.append(encoded)
        used += cost
    return "; ".join(out).strip()
