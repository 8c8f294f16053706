"""OpenAI's free-text `instructions` -> OmniVoice's voice-design items, and what is ignored."""

from __future__ import annotations

import pytest

from server.engine.upstream_names import resolve_instruct
from server.voices.instructions import header_value, map_instructions


@pytest.mark.parametrize("text,used,ignored", [
    ("Speak in a cheerful and positive tone.", None, ["Speak in a cheerful and positive tone"]),
    ("female, low pitch, british accent", "female, low pitch, british accent", []),
    ("A very low pitch male voice with a British accent. Sound calm.",
     "very low pitch, male, british accent", ["Sound calm"]),
    ("male, female, child", "male, child", ["female"]),  # one item of each kind: the first
    ("Whisper, please.", "whisper", ["please"]),
    ("女，四川话", "女，四川话", []),
    ("elderly, british accent, 四川话", "elderly, british accent", ["四川话"]),  # accent and dialect never mix
    ("", None, []),
    (None, None, []),
])
def test_items_found_and_the_rest_named(text, used, ignored):
    result = map_instructions(text)
    assert (result.instruct, result.ignored) == (used, ignored)
    if result.instruct is not None:
        assert resolve_instruct(result.instruct) is not None  # what is used, the reference accepts


def test_header_is_latin1_safe():
    value = header_value(["Sound calm", "像播音员"])
    value.encode("latin-1")
    assert value.startswith("Sound calm; %E5%83%8F")


@pytest.mark.parametrize("text,used,ignored", [
    ("Speak like an elderly British woman, in a whisper.", "elderly, british accent, female, whisper", []),
    ("A deep male voice, whispering.", "low pitch, male, whisper", []),
    ("An old Japanese man with a cheerful smile.", "elderly, japanese accent, male", ["cheerful smile"]),
    ("A young Indian girl who sounds excited.", "young adult, indian accent, female", ["sounds excited"]),
    ("A teenage boy. Calm and slow.", "teenager, male", ["Calm and slow"]),
])
def test_prose_names_the_items_and_reports_only_what_was_not_used(text, used, ignored):
    result = map_instructions(text)
    assert (result.instruct, result.ignored) == (used, ignored)
    assert resolve_instruct(result.instruct) is not None
