"""Imported by the normaliser's fork server (`normalize_workers`) and nowhere else: loads the
grammars once there (the reference's English and Chinese, NeMo's English: compiled into its
disk cache first where they are not yet), so every worker forked from it starts with them
loaded (shared copy-on-write) instead of loading them itself at its first request."""

from __future__ import annotations

from server.text import normalize, normalize_nemo

if normalize.available():
    normalize.normalize("1", "en", normalize.REFERENCE)
    normalize.normalize("1", "zh", normalize.REFERENCE)
if normalize_nemo.available():
    normalize_nemo.normalizer()
