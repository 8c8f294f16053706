"""The reference's private helpers Chorus reuses, imported in one place.

`server.engine.upstream.check_upstream()` verifies at boot that each exists; import them
from here, never from `omnivoice` directly, so that list stays complete.
"""

from omnivoice.models.omnivoice import (  # noqa: F401
    _ZH_RE as ZH_RE,
)
from omnivoice.utils.audio import cross_fade_chunks, fade_and_pad_audio, remove_silence  # noqa: F401
from omnivoice.utils.text import add_punctuation, chunk_text_punctuation  # noqa: F401
