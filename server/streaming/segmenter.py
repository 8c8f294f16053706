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

The work is linear in the text received: each character is looked at a bounded number of
times, never again on later pieces (a position found not to end a sentence stays so; only
the last mark, whose end depends on what comes next, is looked at again), and a long
sentence's clause cut looks no further than `max_chars`.
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
_MARK = re.compile("[\n" + re.escape(SENTENCE_ENDS + CJK_SENTENCE_ENDS) + "]")
_RUN = re.compile("[" + re.escape(SENTENCE_ENDS + CJK_SENTENCE_ENDS + CLOSERS) + "]*")
_SPACES = re.compile(r"\s*")
_FIRST_TOKEN = re.compile(r"\S*(\s*)")
_LAST_WORD = re.compile(r"(\S+)\s*\Z")
_OPENERS = "(\"'“‘["
WORD_WINDOW = 64  # characters looked back for the word before a "." (longer words are no title)
_WAIT = -1  # a mark whose meaning depends on text not yet received


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
    _scan: int = 0  # marks before this index of `_buffer` are known not to end a sentence
    _recheck: tuple[int, ...] = ()  # ...except these, whose word before changed with a cut
    _run: tuple[int, int] = (0, 0)  # [start, end) of the last run of end marks and closers measured

    @property
    def buffered(self) -> int:
        """Characters received and not yet released in a segment."""
        return len(self._carry) + len(self._buffer)

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        segments: list[str] = []
        while (cut := self._next_cut()) is not None:
            self._release(self._buffer[:cut], segments)
            self._drop(cut)
        return segments

    def flush(self) -> list[str]:
        """Everything buffered, complete or not (`stream_flush`, `stream_close`)."""
        segments: list[str] = []
        self._release(self._buffer, segments)
        self._buffer = ""
        self._scan, self._recheck, self._run = 0, (), (0, 0)
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

    def _drop(self, cut: int) -> None:
        """Forget the released text (and the spaces after it), keeping what is known of the rest."""
        rest = self._buffer[cut:]
        self._buffer = rest.lstrip()
        shift = cut + len(rest) - len(self._buffer)
        self._scan = max(0, self._scan - shift)
        start, end = self._run
        self._run = (max(0, start - shift), end - shift) if end > shift else (0, 0)
        # the first word may have lost its start: the marks whose word before it is looked again at
        token = _FIRST_TOKEN.match(self._buffer)
        assert token is not None
        self._recheck = tuple(i for i in (token.start(1) - 1, token.end()) if 0 <= i < self._scan)

    def _next_cut(self) -> int | None:
        end = self._first_end()
        stop = end if end is not None else len(self._buffer)
        if self._heavier(stop, self.clause_chars) and (clause := self._clause_cut(stop)) is not None:
            return clause
        return end

    def _heavier(self, stop: int, limit: int) -> bool:
        """weight(buffer[:stop]) > limit, looking at no more than `limit` + 1 characters."""
        return stop > limit or weight(self._buffer[:stop]) > limit

    def _first_end(self) -> int | None:
        buf = self._buffer
        for i in self._recheck:
            if (cut := self._end_at(i)) is not None and cut != _WAIT:
                return cut
        self._recheck = ()
        while (mark := _MARK.search(buf, self._scan)) is not None:
            i = mark.start()
            cut = self._end_at(i)
            if cut is not None:
                self._scan = i  # looked at again: after a clause cut, or once more text came
                return None if cut == _WAIT else cut
            self._scan = i + 1
        self._scan = len(buf)
        return None

    def _end_at(self, i: int) -> int | None:
        """Where the segment ends if the mark at i ends one; None: it does not, whatever
        follows; `_WAIT`: not known until more text comes."""
        buf = self._buffer
        ch = buf[i]
        if ch == "\n":
            return i + 1
        j = self._run_end(i)
        if ch in CJK_SENTENCE_ENDS and j < len(buf):
            return j  # the next character shows whether a closing quote or bracket follows
        if ch not in SENTENCE_ENDS or j == len(buf):
            return _WAIT if j == len(buf) else None  # a closing quote, "5" or "com" may follow
        if not buf[j].isspace():
            return None  # "3.5", "e.g", "example.com"
        kind = self._abbreviation(i) if ch == "." and j == i + 1 else None
        if kind is None:
            return j
        if kind == "title":
            return None
        nxt = _SPACES.match(buf, j).end()  # type: ignore[union-attr]
        if nxt == len(buf):  # "etc." ends a sentence only before a capital letter...
            return None if "\n" in buf[j:nxt] else _WAIT  # ...or where a newline ends it anyway
        return j if buf[nxt].isupper() else None

    def _run_end(self, i: int) -> int:
        """Index after the run of end marks and closing quotes/brackets that starts at i
        (a run already measured is only extended)."""
        start, end = self._run
        if not start <= i < end:
            start, end = i, i + 1
        end = _RUN.match(self._buffer, end).end()  # type: ignore[union-attr]
        self._run = (start, end)
        return end

    def _abbreviation(self, i: int) -> str | None:
        """"title" when the word before the "." at i never ends a sentence (an initial,
        "Dr", "e.g"), "abbreviation" when it may ("p.m", "etc"), else None."""
        word = self._word_before(i)
        if word is None:
            return None
        word = word.lstrip(_OPENERS).lower()
        if (len(word) == 1 and word.isalpha()) or word in TITLES:
            return "title"  # an initial ("J. K. Rowling"), a title, a letter of "e.g."
        if word in ABBREVIATIONS:
            return "abbreviation"
        return None

    def _word_before(self, i: int) -> str | None:
        """The last whitespace-separated word of buffer[:i], looking back a bounded window;
        None for a word longer than the window (no title is), unless only opening quotes and
        brackets precede its part in the window (they are stripped anyway)."""
        buf = self._buffer
        low = max(0, i - WORD_WINDOW)
        found = _LAST_WORD.search(buf, low, i)
        if found is None:
            return ""
        word = found.group(1)
        k = found.start(1)
        if k == low and low > 0 and not buf[low - 1].isspace():
            while k > 0 and buf[k - 1] in _OPENERS:  # "((((( ... dr." : the word is "dr"
                k -= 1
            if k > 0 and not buf[k - 1].isspace():
                return None
        return word

    def _clause_cut(self, stop: int) -> int | None:
        """Where to cut a long sentence (buffer[:stop]): the last clause mark within
        `clause_chars`, else the first one within `max_chars`; past `max_chars` with none,
        the last space."""
        buf = self._buffer
        within, beyond, limit = None, None, None
        w = 0
        for i in range(stop):
            ch = buf[i]
            w += CJK_WEIGHT if _CJK.match(ch) else 1
            if w > self.max_chars:
                limit = i
                break
            if ch in CJK_CLAUSE_MARKS or (ch in CLAUSE_MARKS and i + 1 < stop and buf[i + 1].isspace()):
                if w <= self.clause_chars:
                    within = i + 1 if w >= self.clause_chars // 3 else within
                elif beyond is None:
                    beyond = i + 1
        if within is not None or beyond is not None:
            return within if within is not None else beyond
        if limit is None:
            return None
        space = buf.rfind(" ", 0, limit)
        return space + 1 if space > 0 else max(limit, 1)
