"""Voice names are unique (case-blind): a second upload under a taken name is refused with
409 naming the voice that has it, in both libraries, so a name always finds one voice."""

from __future__ import annotations

import httpx
import pytest

from server.voices import NameTaken
from server.voices.sqlite import VoiceStore
from tests.integration.test_voices_api import TEXT, audio_file, upload


def test_sqlite_library_refuses_a_taken_name(tmp_path):
    store = VoiceStore(tmp_path)
    try:
        first = store.add("Me", "text", 1.0, b"one")
        with pytest.raises(NameTaken) as taken:
            store.add(" me ", "text", 1.0, b"two")
        assert taken.value.existing == first and first.id in str(taken.value)
        assert [v.id for v in store.list()] == [first.id]  # nothing half-added
        assert store.add(None, "text", 1.0, b"three").name.startswith("voice-")  # unnamed: no clash
        store.delete(first.id)
        assert store.add("Me", "text", 1.0, b"four").name == "Me"  # free again once deleted
    finally:
        store.close()


def test_postgres_library_refuses_a_taken_name_across_replicas(postgres_replicas):
    a, b = postgres_replicas
    first = a.add("Narrator", "text", 1.0, b"one")
    with pytest.raises(NameTaken) as taken:
        b.add("NARRATOR", "text", 1.0, b"two")
    assert taken.value.existing == first
    assert [v.id for v in b.list()] == [first.id]


def test_http_upload_under_a_taken_name_is_409(chorus_server):
    url = chorus_server.url
    first = upload(url, audio_file("WAV", "PCM_16"), text=TEXT, name="Twice Named")
    assert first.status_code == 201, first.text
    voice = first.json()
    again = upload(url, audio_file("WAV", "PCM_16"), text=TEXT, name="twice named")
    assert again.status_code == 409, again.text
    error = again.json()["error"]
    assert error["code"] == "name_taken" and error["field"] == "name"
    assert voice["id"] in error["message"] and "Twice Named" in error["message"]
    builtin = upload(url, audio_file("WAV", "PCM_16"), text=TEXT, name="Alloy")
    assert builtin.status_code == 409 and "built-in" in builtin.json()["error"]["message"]
    names = [v["name"] for v in httpx.get(url + "/v1/voices").json()["voices"] if not v.get("builtin")]
    assert names.count("Twice Named") == 1
    assert httpx.delete(f"{url}/v1/voices/{voice['id']}").status_code == 204
