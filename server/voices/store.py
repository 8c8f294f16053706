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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from server.text.lexicon import Pronunciation

VOICE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")


KEPT_PREFIX = "kept"  # kept voices' ids: kept-<32 hex digits>, 128 random bits (the id is a capability)
KEPT_ID_BYTES = 16
PRONUNCIATION_PREFIX = "say"  # lexicon entries' ids: say-<hex>


@dataclass(frozen=True)
class Owner:
    """Who keeps a voice (`keep_voice`): an API key (`key:` and a digest of it, never the key)
    or, on a server without keys, a client address (`addr:`). A key's kept voices are its own:
    listed, used and deleted by it alone. Without keys nobody is told apart, so a kept voice is
    listed to nobody and its id (128 random bits) is what grants its use; the address only
    counts against the per-owner cap."""

    tag: str
    by_key: bool

    def may_use(self, voice_owner: str | None) -> bool:
        """Whether this caller may see, use or delete a kept voice owned by `voice_owner`."""
        return not self.by_key or voice_owner == self.tag


def may_use(owner: Owner | None, kept: bool, voice_owner: str | None) -> bool:
    """None: the server itself (no filter). Uploaded voices are everyone's."""
    return owner is None or not kept or owner.may_use(voice_owner)


def kept_to_remove(rows: Iterable[tuple[str, str | None, int]], owner: str, now: float, max_kept: int,
                   max_per_owner: int) -> list[str]:
    """Which kept voices go to make room for one more of `owner`'s: (id, owner, expires_at) rows
    in order of arrival. The expired ones; past the owner's cap, its closest to expiry; past the
    global cap, the closest to expiry of whoever keeps the most (so one owner filling the
    library evicts its own voices, not everyone else's)."""
    doomed = [voice_id for voice_id, _, expires_at in rows if expires_at <= now]
    live_rows = [(voice_id, who, expires_at) for voice_id, who, expires_at in rows if expires_at > now]
    by_owner: dict[str | None, list[tuple[int, int, str]]] = {}
    for order, (voice_id, who, expires_at) in enumerate(live_rows):
        by_owner.setdefault(who, []).append((expires_at, order, voice_id))
    for voices in by_owner.values():
        voices.sort()
    mine = by_owner.setdefault(owner, [])
    while len(mine) >= max_per_owner:
        doomed.append(mine.pop(0)[2])
    total = sum(len(voices) for voices in by_owner.values())
    while total >= max_kept:
        biggest = max(by_owner.values(), key=len)
        doomed.append(biggest.pop(0)[2])
        total -= 1
    return doomed


Removed = Callable[[list[str]], None]  # ids of voices just deleted or evicted (any replica)


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

    def add_kept(self, text: str, seconds: float, blob: bytes, expires_at: int, owner: Owner, max_kept: int,
                 max_per_owner: int) -> VoiceInfo:
        """Store a voice a request produced (`keep_voice`) for `owner`, removing what
        `kept_to_remove` says (uploads are never touched)."""
        ...

    def get(self, voice_id: str, owner: Owner | None = None) -> VoiceInfo | None:
        """A live voice by id that `owner` may use (None: any), else None."""
        ...

    def list(self, owner: Owner | None = None) -> list[VoiceInfo]:
        """Uploaded voices, and the kept voices `owner` keeps by its key (None: every one)."""
        ...

    def load(self, voice_id: str, owner: Owner | None = None) -> bytes | None:
        """The stored encoded voice, or None when there is no such voice `owner` may use."""
        ...

    def delete(self, voice_id: str, owner: Owner | None = None) -> bool: ...

    def watch(self, removed: Removed) -> None:
        """Call `removed` (from any thread) with the ids of voices deleted or evicted, by this
        server or, where the library is shared, by another replica."""
        ...

    def add_pronunciation(self, text: str, say: str, voice: str | None, max_entries: int | None = None
                          ) -> Pronunciation:
        """A lexicon entry under a new id; `PronunciationTaken` when the text has one for
        the same voice (or for every voice), `LibraryFull` past `max_entries`."""
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
