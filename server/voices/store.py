"""What every voice library shares: the `VoiceLibrary` protocol, the voice record, id
rules and the limit check.

Voices are stored already encoded (the codec runs once, at upload), as the opaque bytes
the engine's `voice_codec` makes, so no voice module touches torch. Ids are made by
`slug` + random hex and checked with `VOICE_ID` on every lookup. A library holds at most
`max_voices` voices and `max_bytes` of stored voice data (`--max-voices`,
`--max-voices-bytes`); an upload beyond either is refused with `LibraryFull`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Protocol

import msgspec

from server.text.lexicon import Pronunciation

VOICE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")


KEPT_PREFIX = "kept"  # kept voices' ids: kept-<hex>
PRONUNCIATION_PREFIX = "say"  # lexicon entries' ids: say-<hex>


def live(info: VoiceInfo, now: float) -> bool:
    """Not a kept voice past its expiry (expired ones are swept at the next keep)."""
    return info.expires_at is None or info.expires_at > now


class LibraryFull(Exception):
    """The library is at its voice count or storage limit; the message is for the client."""


def check_room(count: int, stored_bytes: int, new_bytes: int, max_voices: int | None,
               max_bytes: int | None) -> None:
    """Raise `LibraryFull` when one more voice of `new_bytes` would pass a limit."""
    if max_voices is not None and count >= max_voices:
        raise LibraryFull(f"voices: the library is full ({count} voices, the limit is {max_voices}); "
                          "delete one first")
    if max_bytes is not None and stored_bytes + new_bytes > max_bytes:
        raise LibraryFull(f"voices: the library is full ({stored_bytes} bytes stored, the limit is "
                          f"{max_bytes}); delete a voice first")


class NameTaken(Exception):
    """A voice already has this name (names are unique, compared case-blind, so a name
    always finds one voice); `existing` is that voice."""

    def __init__(self, existing: VoiceInfo):
        super().__init__(f"name: {existing.name!r} is already the name of voice {existing.id!r}; "
                         "choose another name, or delete that voice first")
        self.existing = existing


def same_name(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


class PronunciationTaken(Exception):
    """The lexicon already says how to pronounce this text (for this voice); `existing` is
    that entry."""

    def __init__(self, existing: Pronunciation):
        scope = f"voice {existing.voice!r}" if existing.voice else "every voice"
        super().__init__(f"text: {existing.text!r} already has a pronunciation for {scope} (entry "
                         f"{existing.id!r}); delete it first")
        self.existing = existing


def pronunciation_clash(entries: list[Pronunciation], text: str, voice: str | None) -> Pronunciation | None:
    return next((e for e in entries if e.voice == voice and same_name(e.text, text)), None)


class VoiceInfo(msgspec.Struct, frozen=True):
    """What clients see of a voice (`POST/GET /v1/voices`)."""

    id: str
    name: str
    text: str
    seconds: float
    created_at: int  # unix seconds
    builtin: bool = False  # OpenAI's names (alloy...): made by the server, not deletable
    kept: bool = False  # made by a request's `keep_voice`: its own cap, gone at `expires_at`
    expires_at: int | None = None  # unix seconds (kept voices only)


# control (NUL, newlines...), format (bidi overrides, zero-width...), surrogates, line and
# paragraph separators: a name is shown to people, in lists and logs, on one line
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def name_problem(name: str, max_chars: int) -> str | None:
    """Why `name` cannot name a voice (a message starting with `name:`), or None."""
    if not name.strip() or len(name) > max_chars:
        return f"name: must be 1..{max_chars} characters"
    for index, char in enumerate(name):
        if unicodedata.category(char) in _UNPRINTABLE:
            return (f"name: must not contain control or formatting characters (U+{ord(char):04X} "
                    f"{unicodedata.name(char, '')} at {index})".replace(" )", ")"))
    return None


def slug(name: str) -> str:
    """A readable id prefix from a voice name (`"Ada L."` -> `ada-l`)."""
    text = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return text[:40].rstrip("-") or "voice"


class VoiceLibrary(Protocol):
    """The contract both stores keep; the service sees only this."""

    max_voices: int | None
    max_bytes: int | None

    def add(self, name: str | None, text: str, seconds: float, blob: bytes) -> VoiceInfo:
        """Store an encoded voice under a new id; `LibraryFull` past a limit, `NameTaken`
        when another voice has the name."""
        ...

    def add_kept(self, text: str, seconds: float, blob: bytes, expires_at: int, max_kept: int) -> VoiceInfo:
        """Store a voice a request produced (`keep_voice`), removing expired kept voices and,
        past `max_kept`, the ones closest to expiry (uploads are never touched)."""
        ...

    def get(self, voice_id: str) -> VoiceInfo | None: ...

    def list(self) -> list[VoiceInfo]: ...

    def load(self, voice_id: str) -> bytes | None:
        """The stored encoded voice, or None when there is no such voice (or a bad id)."""
        ...

    def delete(self, voice_id: str) -> bool: ...

    def add_pronunciation(self, text: str, say: str, voice: str | None) -> Pronunciation:
        """A lexicon entry under a new id; `PronunciationTaken` when the text has one for
        the same voice (or for every voice)."""
        ...

    def list_pronunciations(self) -> list[Pronunciation]: ...

    def delete_pronunciation(self, entry_id: str) -> bool: ...

    def load_builtin(self, key: str) -> bytes | None:
        """A built-in voice made before (by this replica or another), or None."""
        ...

    def save_builtin(self, key: str, blob: bytes) -> bytes:
        """Keep a built-in voice unless one is already kept; returns the one kept (the first
        writer wins, so replicas that make one at once all end up using the same)."""
        ...

    def close(self) -> None: ...
