"""The one place Chorus touches `omnivoice`'s private surface.

Chorus reuses the reference's own helpers instead of re-deriving them, so its canvases,
schedules, scoring and post-processing stay numerically the reference's. Those names are
private to `omnivoice`; `check_upstream()` runs at boot and names any that moved, so an
upgrade fails loudly at start-up instead of at the first request.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import version

# (module, attribute) pairs Chorus relies on.
REQUIRED_NAMES: tuple[tuple[str, str], ...] = (
    ("omnivoice.models.omnivoice", "OmniVoice"),
    ("omnivoice.models.omnivoice", "OmniVoiceConfig"),
    ("omnivoice.models.omnivoice", "OmniVoiceGenerationConfig"),
    ("omnivoice.models.omnivoice", "VoiceClonePrompt"),
    ("omnivoice.models.omnivoice", "_combine_text"),
    ("omnivoice.models.omnivoice", "_tokenize_with_nonverbal_tags"),
    ("omnivoice.models.omnivoice", "_get_time_steps"),
    ("omnivoice.models.omnivoice", "_resolve_language"),
    ("omnivoice.models.omnivoice", "_resolve_instruct"),
    ("omnivoice.models.omnivoice", "_filter_top_k"),
    ("omnivoice.models.omnivoice", "_ZH_RE"),
    ("omnivoice.utils.duration", "RuleDurationEstimator"),
    ("omnivoice.utils.text", "chunk_text_punctuation"),
    ("omnivoice.utils.text", "add_punctuation"),
    ("omnivoice.utils.text", "SPLIT_PUNCTUATION"),
    ("omnivoice.utils.text", "CLOSING_MARKS"),
    ("omnivoice.utils.text", "ABBREVIATIONS"),
    ("omnivoice.utils.audio", "remove_silence"),
    ("omnivoice.utils.audio", "fade_and_pad_audio"),
    ("omnivoice.utils.audio", "cross_fade_chunks"),
    ("omnivoice.utils.audio", "trim_long_audio"),
)

# Methods of the OmniVoice instance Chorus calls.
REQUIRED_METHODS: tuple[str, ...] = (
    "_prepare_embed_inputs",
    "_prepare_inference_inputs",
    "_estimate_target_tokens",
    "_post_process_audio",
    "create_voice_clone_prompt",
    "generate",
)


class UpstreamMismatch(RuntimeError):
    """The installed omnivoice lacks a name Chorus relies on."""


@dataclass(frozen=True)
class UpstreamReport:
    version: str
    checked: int


def missing_names(pairs) -> list[str]:
    """The (module, attribute) pairs that do not resolve, as `module.attr` (or why the
    module does not import)."""
    missing: list[str] = []
    for module_name, attr in pairs:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - ImportError, or an error raised while importing
            missing.append(f"{module_name} (import failed: {exc})")
            continue
        if not hasattr(module, attr):
            missing.append(f"{module_name}.{attr}")
    return missing


def check_upstream() -> UpstreamReport:
    """Verify every private omnivoice name Chorus uses exists; raise naming the missing."""
    missing = missing_names(REQUIRED_NAMES)
    if not missing:
        from omnivoice.models.omnivoice import OmniVoice  # lazy: only once the check found it

        missing += [f"OmniVoice.{m}" for m in REQUIRED_METHODS if not hasattr(OmniVoice, m)]
    if missing:
        raise UpstreamMismatch(
            "the installed omnivoice package lacks names Chorus relies on: "
            + ", ".join(missing)
            + " (Chorus is built against omnivoice==0.2.1)"
        )
    return UpstreamReport(version=version("omnivoice"), checked=len(REQUIRED_NAMES) + len(REQUIRED_METHODS))
