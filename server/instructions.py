"""OpenAI's free-text `instructions` -> the voice-design items OmniVoice understands.

OpenAI clients send prose ("Speak in a cheerful and positive tone."); OmniVoice takes a list
of fixed items ("female, low pitch, british accent"). The items come from the reference's own
table (`omnivoice/utils/voice_design.py`, loaded by path: it needs only `re`, while importing
the `omnivoice` package would load torch into the web layer). Each clause of the text that is
an item, or contains items, gives those items; the first item of a category wins (one gender,
one age, ...). Everything else is reported back, never refused.
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
def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    """Every item, longest first (so "very low pitch" wins over "low pitch"), as a
    whole-word pattern (CJK items match as substrings: they have no word breaks)."""
    items = sorted(_table()._INSTRUCT_ALL_VALID, key=len, reverse=True)
    return [(item, re.compile(re.escape(item) if _CJK.search(item) else rf"(?<![\w-]){re.escape(item)}(?![\w-])"))
            for item in items]


def _category(item: str) -> int:
    for index, members in enumerate(_table()._INSTRUCT_MUTUALLY_EXCLUSIVE):
        if item in members:
            return index
    return -1


def _items_in(clause: str) -> list[str]:
    found: list[tuple[int, str]] = []
    text = clause.lower()
    for item, pattern in _patterns():
        if item not in text:  # (cheap) no match can follow; blanking only removes
            continue
        for match in pattern.finditer(text):
            found.append((match.start(), item))
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)  # "very low pitch" is not also "low pitch"
    return [item for _, item in sorted(found)]


def map_instructions(text: str | None) -> Instructions:
    """Free text -> the OmniVoice instruct it holds, plus what was ignored. Linear in the
    text: one pass of each item's pattern per distinct clause, only where the item occurs
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
        items, leftover = _clause(clause)
        if leftover:
            ignored.append(clause)
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


@lru_cache(maxsize=1024)
def _clause(clause: str) -> tuple[list[str], bool]:
    """A clause's items, and whether it says more than them (remembered: prose repeats)."""
    items = _items_in(clause)
    return items, not items or _leftover(clause, items)


_FILLER = re.compile(r"\b(?:a|an|the|with|and|in|of|voice|speaker|speak|speaking|sound|sounding|like|tone|"
                     r"accent|pitch|please|use|using|very)\b|[^\w]+", re.I)


def _leftover(clause: str, items: list[str]) -> bool:
    """Does the clause say more than its items (beyond filler words)?"""
    rest = clause.lower()
    for item in items:
        rest = rest.replace(item, " ")
    return bool(_FILLER.sub("", rest).strip())


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
