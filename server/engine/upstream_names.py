"""The reference's private helpers Chorus reuses, imported in one place.

`server.engine.upstream.check_upstream()` verifies at boot that each exists; import them
from here, never from `omnivoice` directly, so that list stays complete.
"""

from omnivoice.models.omnivoice import (
    _ZH_RE as ZH_RE,
    _combine_text as combine_text,
    _filter_top_k as filter_top_k,
    _get_time_steps as get_time_steps,
    _resolve_instruct as resolve_instruct,
    _resolve_language as resolve_language,
    _tokenize_with_nonverbal_tags as tokenize_with_nonverbal_tags,
)
from omnivoice.utils.audio import cross_fade_chunks, fade_and_pad_audio, remove_silence
from omnivoice.utils.text import (
    ABBREVIATIONS,
    CLOSING_MARKS,
    SPLIT_PUNCTUATION,
    add_punctuation,
    chunk_text_punctuation,
)
