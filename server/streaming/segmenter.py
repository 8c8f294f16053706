"""Cut text that arrives piece by piece (an LLM's tokens) into segments worth speaking.

A segment is a sentence, or a clause of a long one. It is released as soon as it is known
to be complete, so speech of the first sentence starts while the rest is still being written:
- `.` `!` `?` `…` end a sentence when whitespace follows them (and their closing quotes or
  brackets): the next character decides, so "3.5", "example.com" and '"Stop."' come whole;
  not after an abbreviation, a title or an initial ("Dr. Smith", "e.g. this", "J. K."), and
  after "p.m." or "etc." only when a capital letter follows;
- `。` `！` `？` (and full-width `!` `?` `;`) end a sentence with no space after them;
- a newline ends a segment;
- closing quotes and brackets after the end stay with their sentence;
- a sentence over `clause_chars` is cut at its last clause mark (`,` `;` `:` `—`, `，` `、`
  `；` `：`), and one over `max_chars` with no mark at its last space (or anywhere, for
  text without spaces). CJK characters weigh `CJK_WEIGHT` Latin ones (they take that much
  longer to say).
Pieces without a letter or digit (a stray quote, "...") join the next segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SENTENCE_ENDS = ".!?…"
CJK_SENTENCE_ENDS = "。！？；!?;．"
CLAUSE_MARKS = ",;:—–"
CJK_CLAUSE_MARKS = "，、；："
CLOSERS = "\"'”’)]}»」』）】》"
CJK_WEIGHT = 3
# Never end a sentence: a name or a number follows them.
TITLES = frozenset("""
mr mrs ms mx dr prof sr jr st mt ft vs cf eg ie e.g i.e no nos vol vols pp p fig figs approx dept
gen gov sen rep rev capt col lt sgt cmdr adm jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# End a sentence only when a capital letter follows ("at 3 p.m. Shall I book it?").
ABBREVIATIONS = frozenset("etc al est inc ltd co corp u.s u.k a.m p.m ph.d".split())
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_SPEAKABLE = re.compile(r"[^\W_]")  # a letter or a digit, any script


def weight(text: str) -> int:
    """Rough speaking length: characters, CJK ones counted `CJK_WEIGHT` times."""
    return len(text) + (CJK_WEIGHT - 1) * len(_CJK.findall(text))


@dataclass
class Segmenter:
    """Incremental: `feed` text, get the segments it completed; `flush` the rest."""

    clause_chars: int = 150
    max_chars: int = 300
    _buffer: str = ""
    _carry: str = ""  # a finished piece with nothing to say, joined to the next segment

    @property
    def buffered(self) -> int:
        """Characters received and not yet released in a segment."""
        return len(self._carry) + len(self._buffer)

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        segments: list[str] = []
        while (cut := self._next_cut()) is not None:
            self._release(self._buffer[:cut], segments)
            self._buffer = self._buffer[cut:].lstrip()
        return segments

    def flush(self) -> list[str]:
        """Everything buffered, complete or not (`stream_flush`, `stream_close`)."""
        segments: list[str] = []
        self._release(self._buffer, segments)
        self._buffer = ""
        if self._carry.strip() and segments == [] and _SPEAKABLE.search(self._carry):
            segments.append(self._carry.strip())
        self._carry = ""
        return segments

    # ---- where to cut ---------------------------------------------------------------------

    def _release(self, piece: str, out: list[str]) -> None:
        text = self._carry + piece
        if _SPEAKABLE.search(text):
            out.append(" ".join(text.split()) if not _CJK.search(text) else text.strip())
            self._carry = ""
        else:
            self._carry = text

    def _next_cut(self) -> int | None:
        end = self._first_end()
        region = self._buffer[:end] if end is not None else self._buffer
        if weight(region) > self.clause_chars and (clause := self._clause_cut(region)) is not None:
            return clause
        return end

    def _first_end(self) -> int | None:
        buf = self._buffer
        for i, ch in enumerate(buf):
            if ch == "\n":
                return i + 1
            if ch in CJK_SENTENCE_ENDS and (j := self._run_end(i)) < len(buf):
                return j  # the next character shows whether a closing quote or bracket follows
            if ch in SENTENCE_ENDS and (cut := self._sentence_end(i)) is not None:
                return cut
        return None

    def _run_end(self, i: int) -> int:
        """Index after the run of end marks and closing quotes/brackets that starts at i."""
        buf = self._buffer
        j = i + 1
        while j < len(buf) and (buf[j] in SENTENCE_ENDS or buf[j] in CJK_SENTENCE_ENDS or buf[j] in CLOSERS):
            j += 1
        return j

    def _sentence_end(self, i: int) -> int | None:
        """Where the sentence ends if the mark at i ends one (None: not, or not yet known)."""
        buf = self._buffer
        j = self._run_end(i)
        if j < len(buf):  # something follows: an end only before whitespace, never after "Dr."
            if not buf[j].isspace():
                return None  # "3.5", "e.g", "example.com"
            kind = self._abbreviation(i) if buf[i] == "." and j == i + 1 else None
            if kind is None:
                return j
            nxt = buf[j:].lstrip()[:1]
            return j if kind == "abbreviation" and nxt.isupper() else None
        return None  # the mark is the last thing that arrived: a closing quote, "5" or "com" may follow

    def _abbreviation(self, i: int) -> str | None:
        """"title" when the word before the "." at i never ends a sentence (an initial,
        "Dr", "e.g"), "abbreviation" when it may ("p.m", "etc"), else None."""
        tail = self._buffer[:i].split()
        word = tail[-1].lstrip("(\"'“‘[").lower() if tail else ""
        if (len(word) == 1 and word.isalpha()) or word in TITLES:
            return "title"  # an initial ("J. K. Rowling"), a title, a letter of "e.g."
        if word in ABBREVIATIONS:
            return "abbreviation"
        return None

    def _clause_cut(self, region: str) -> int | None:
        """Where to cut a long sentence: the last clause mark within `clause_chars`, else the
        first one within `max_chars`; past `max_chars` with none, the last space."""
        within, beyond = None, None
        for i, ch in enumerate(region):
            w = weight(region[: i + 1])
            if w > self.max_chars:
                break
            if ch in CJK_CLAUSE_MARKS or (ch in CLAUSE_MARKS and region[i + 1 : i + 2].isspace()):
                if w <= self.clause_chars:
                    within = i + 1 if w >= self.clause_chars // 3 else within
                elif beyond is None:
                    beyond = i + 1
        if within is not None or beyond is not None:
            return within if within is not None else beyond
        if weight(region) <= self.max_chars:
            return None
        limit = 0
        while limit < len(region) and weight(region[: limit + 1]) <= self.max_chars:
            limit += 1
        space = region.rfind(" ", 0, limit)
        return space + 1 if space > 0 else max(limit, 1)
