"""Whether a text has anything to say: letters, digits, punctuation or symbols.

Text of only spaces, zero-width and other format characters (U+200B, U+2060, U+FEFF, bidi
controls...) or control characters is empty for speech; refusing it up front names the
field instead of running a request that can only produce noise.
"""

from __future__ import annotations

import unicodedata

_SPOKEN = frozenset("LNPS")  # Unicode major categories: letter, number, punctuation, symbol


def has_visible_text(text: str) -> bool:
    return any(unicodedata.category(ch)[0] in _SPOKEN for ch in text)
