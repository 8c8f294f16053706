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
        for match in pattern.finditer(text):
            found.append((match.start(), item))
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)  # "very low pitch" is not also "low pitch"
    return [item for _, item in sorted(found)]


def map_instructions(text: str | None) -> Instructions:
    """Free text -> the OmniVoice instruct it holds, plus what was ignored."""
    if text is None or not text.strip():
        return Instructions(None)
    used: list[str] = []
    ignored: list[str] = []
    taken: set[int] = set()
    has_accent = has_dialect = False
    for clause in (c.strip() for c in _CLAUSES.split(text)):
        if not clause:
            continue
        items = _items_in(clause)
        if not items or _leftover(clause, items):
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


_FILLER = re.compile(r"\b(?:a|an|the|with|and|in|of|voice|speaker|speak|speaking|sound|sounding|like|tone|"
                     r"accent|pitch|please|use|using|very)\b|[^\w]+", re.I)


def _leftover(clause: str, items: list[str]) -> bool:
    """Does the clause say more than its items (beyond filler words)?"""
    rest = clause.lower()
    for item in items:
        rest = rest.replace(item, " ")
    return bool(_FILLER.sub("", rest).strip())


def header_value(ignored: list[str]) -> str:
    """`X-Chorus-Ignored-Instructions`: the ignored pieces joined by "; ", percent-encoded
    where not printable ASCII (headers are Latin-1 on the wire)."""
    return quote("; ".join(ignored), safe=" !\"#$&'()*+,-./:;<=>?@[]^_`{|}~")[:1000]
