"""Fixed size limits of the wire's short fields, checked as a frame or body is decoded
(before anything reads the text); the configurable ones are flags (`server.config`)."""

from __future__ import annotations

# `instruct` is a list of OmniVoice's items ("female, low pitch, british accent"): a handful of
# words; the longest valid one is far shorter. Checked before it is resolved.
MAX_INSTRUCT_CHARS = 256
MAX_VOICE_CHARS = 256  # a voice id (64) or a library voice's display name (100)
MAX_LANGUAGE_CHARS = 64

# how a field over its size is named in an error (`instruct: must be at most ...`)
SIZE_RULES = {
    "instruct": f"must be at most {MAX_INSTRUCT_CHARS} characters (OmniVoice's items: \"female, low pitch\")",
    "voice": f"must be at most {MAX_VOICE_CHARS} characters (a voice id or name)",
    "language": f"must be at most {MAX_LANGUAGE_CHARS} characters",
}
