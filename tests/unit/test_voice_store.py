"""The voice library on disk: SQLite index + token files; ids never leave the folder."""

from __future__ import annotations

import pytest
import torch

from server.engine.model.voice_codec import voice_from_bytes, voice_to_bytes
from server.engine.types import VoicePrompt
from server.voices import VoiceStore, slug


def test_voice_codec_round_trip():
    tokens = torch.randint(0, 1024, (8, 57), dtype=torch.long)
    voice = VoicePrompt(tokens=tokens, text="Hello there.", rms=0.0731234567)
    back = voice_from_bytes(voice_to_bytes(voice))
    assert back.tokens.dtype == torch.long and torch.equal(back.tokens, tokens)
    assert (back.text, back.rms) == (voice.text, voice.rms)
    with pytest.raises(ValueError):
        voice_from_bytes(b"garbage")


def test_add_list_get_load_delete_and_reopen(tmp_path):
    store = VoiceStore(tmp_path / "v")
    a = store.add("Ada Lovelace", "Hello.", 2.04, b"blob-a")
    b = store.add(None, "Hi.", 1.0, b"blob-b")
    assert a.id.startswith("ada-lovelace-") and a.name == "Ada Lovelace" and a.seconds == 2.04
    assert b.id.startswith("voice-") and b.name == b.id
    assert {v.id for v in store.list()} == {a.id, b.id}
    assert store.get(a.id) == a and store.load(a.id) == b"blob-a"
    store.close()

    store = VoiceStore(tmp_path / "v")  # a restart
    assert store.get(b.id) == b and store.load(b.id) == b"blob-b"
    assert store.delete(a.id) is True and store.delete(a.id) is False
    assert store.get(a.id) is None and store.load(a.id) is None
    assert [v.id for v in store.list()] == [b.id]
    assert not (tmp_path / "v" / "tokens" / f"{a.id}.npz").exists()


@pytest.mark.parametrize("bad", ["../index", "..", "../../etc/passwd", "/etc/passwd", "a/b", ".hidden", "",
                                 "UPPER", "x" * 65, "a\0b", "tokens/../x"])
def test_ids_cannot_escape_the_folder(tmp_path, bad):
    store = VoiceStore(tmp_path / "v")
    (tmp_path / "index.npz").write_bytes(b"outside")
    (tmp_path / "v" / "index.npz").write_bytes(b"outside")
    assert store.get(bad) is None and store.load(bad) is None and store.delete(bad) is False
    assert (tmp_path / "index.npz").exists() and (tmp_path / "v" / "index.npz").exists()


def test_slug():
    assert slug("  Ada L. (UK) ") == "ada-l-uk"
    assert slug("日本語") == "voice"
    assert len(slug("x" * 200)) == 40
