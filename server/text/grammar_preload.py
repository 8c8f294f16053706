"""Imported by the normaliser's fork server (`normalize_workers`) and nowhere else: loads the
English and Chinese grammars once there, so every worker forked from it starts with them
loaded (shared copy-on-write) instead of loading them itself at its first request."""

from __future__ import annotations

from server.text import normalize

if normalize.available():
    normalize.normalize("1", "en")
    normalize.normalize("1", "zh")
