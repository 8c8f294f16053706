"""The voice library keeps a voice's index row and its file together (a failed index write
leaves no file that fills the library; a crash's leftovers are swept at start), and a voice
name is printable text on one line."""

from __future__ import annotations

import io
import sqlite3

import pytest
import soundfile as sf
from litestar.testing import TestClient

from server.app import create_app
from server.config import ServerConfig
from server.voices import LibraryFull, VoiceStore
from tests.conftest import make_reference_clip
from tests.support.fake_engine import FakeEngine

BLOB = b"x" * 1000


def _files(store_dir) -> list[str]:
    return sorted(p.name for p in (store_dir / "tokens").iterdir())


def test_a_failed_index_write_leaves_no_file(tmp_path):
    store = VoiceStore(tmp_path, max_bytes=len(BLOB))  # room for exactly one voice
    blocker = sqlite3.connect(tmp_path / "index.sqlite3", timeout=0, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the index: the row cannot be written
    store._db.execute("PRAGMA busy_timeout = 0")
    with pytest.raises(sqlite3.OperationalError):
        store.add("Ada", "Hello.", 1.0, BLOB)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert _files(tmp_path) == [] and store.list() == []
    info = store.add("Ada", "Hello.", 1.0, BLOB)  # the failed one took no room
    assert _files(tmp_path) == [f"{info.id}.npz"] and store.load(info.id) == BLOB
    with pytest.raises(LibraryFull):
        store.add("Bea", "Hello.", 1.0, BLOB)
    store.close()


def test_leftovers_of_a_crash_are_swept_at_start(tmp_path):
    store = VoiceStore(tmp_path, max_bytes=2 * len(BLOB))
    kept = store.add("Kept", "Hello.", 1.0, BLOB)
    lost = store.add("Lost", "Hello.", 1.0, BLOB)
    store.close()
    tokens = tmp_path / "tokens"
    (tokens / "orphan-0badc0de.npz").write_bytes(BLOB)  # file written, row never committed
    (tokens / "half-12345678.tmp").write_bytes(BLOB[:10])  # write cut short
    (tokens / f"{lost.id}.npz").unlink()  # row without its file
    store = VoiceStore(tmp_path, max_bytes=2 * len(BLOB))
    assert _files(tmp_path) == [f"{kept.id}.npz"]
    assert [v.id for v in store.list()] == [kept.id]
    store.add("New", "Hello.", 1.0, BLOB)  # the orphans' room is back
    store.close()


def _wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, make_reference_clip(1.0), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.mark.parametrize("name", ["a\x00b", "two\nlines", "tab\tname", "evil\u202egnp.exe", "zero\u200bwidth",
                                  "line\u2028break", "bell\x07"])
def test_voice_names_refuse_control_and_format_characters(tmp_path, name):
    cfg = ServerConfig(voices_dir=tmp_path / "voices")
    with TestClient(create_app(cfg, engine=FakeEngine()), base_url="http://test.localhost") as client:
        r = client.post("/v1/voices", files={"audio": ("a.wav", _wav(), "audio/wav")},
                        data={"text": "Hello.", "name": name})
        error = r.json()["error"]
        assert r.status_code == 422 and error["code"] == "invalid_request" and error["field"] == "name", r.text
        assert error["message"].startswith("name: must not contain control or formatting characters (U+")
        assert client.get("/v1/voices").json()["voices"] == [] or all(
            v.get("builtin") for v in client.get("/v1/voices").json()["voices"])
