"""The PostgreSQL voice library against a real PostgreSQL server (a new database per test)."""

from __future__ import annotations

import pytest


def test_voices_roundtrip_and_shared_between_replicas(postgres_dsn):
    from server.voices.postgres import PostgresVoiceStore

    replica_a, replica_b = PostgresVoiceStore(postgres_dsn), PostgresVoiceStore(postgres_dsn)
    try:
        info = replica_a.add("Ada L.", "A transcript.", 2.5, b"\x00\x01encoded-voice\xff")
        assert info.id.startswith("ada-l-") and info.name == "Ada L." and info.seconds == 2.5
        assert replica_b.get(info.id) == info  # another replica sees it at once
        assert replica_b.load(info.id) == b"\x00\x01encoded-voice\xff"
        assert [v.id for v in replica_b.list()] == [info.id]
        assert replica_b.delete(info.id) is True
        assert replica_a.get(info.id) is None and replica_a.load(info.id) is None
        assert replica_a.delete(info.id) is False
    finally:
        replica_a.close()
        replica_b.close()


def test_hostile_ids_are_refused(postgres_dsn):
    from server.voices.postgres import PostgresVoiceStore

    store = PostgresVoiceStore(postgres_dsn)
    try:
        for bad in ["../etc/passwd", "x'; DROP TABLE chorus_voices; --", "", "A" * 100, None]:
            assert store.get(bad) is None and store.load(bad) is None and store.delete(bad) is False
        assert store.list() == [] or all(v.id for v in store.list())
    finally:
        store.close()


def test_two_replicas_share_one_library(postgres_dsn, start_inproc, tmp_path, reference_clip):
    """A voice uploaded to one server is listed and used by another at once (two apps, each
    with its own library connection; in one process, since only the database joins them)."""
    import asyncio
    import io

    import httpx
    import soundfile as sf

    from tests.support.chorus_client import Session
    a = start_inproc(tmp_path / "a", "--voices-db", postgres_dsn)
    b = start_inproc(tmp_path / "b", "--voices-db", postgres_dsn)
    try:
        clip, sr = reference_clip
        wav = io.BytesIO()
        sf.write(wav, clip, sr, format="WAV")
        created = httpx.post(f"{a.url}/v1/voices", files={"audio": ("ref.wav", wav.getvalue(), "audio/wav")},
                             data={"text": "A short reference", "name": "Shared"}, timeout=60)
        assert created.status_code == 201, created.text
        voice_id = created.json()["id"]
        listed = httpx.get(f"{b.url}/v1/voices", timeout=10).json()["voices"]
        assert voice_id in [v["id"] for v in listed]

        async def synthesize_on_b():
            session = await Session.open(b.ws_url)
            try:
                await session.synthesize("r1", "Spoken by a shared voice.", voice=voice_id,
                                         options={"num_step": 4})
                return (await session.collect(["r1"]))["r1"]
            finally:
                await session.close()

        outcome = asyncio.run(synthesize_on_b())
        assert outcome.end["type"] == "done", outcome.end
        assert not list((tmp_path / "a" / "voices").glob("**/*.npz"))  # nothing on a replica's disk
        assert httpx.delete(f"{b.url}/v1/voices/{voice_id}", timeout=10).status_code == 204
        assert httpx.get(f"{a.url}/v1/voices/{voice_id}", timeout=10).status_code == 404
    finally:
        a.stop()
        b.stop()


def test_limits_hold_across_replicas(postgres_dsn):
    """Count and storage limits, checked and enforced in one transaction: two replicas
    adding at once cannot pass the count limit together."""
    import threading

    from server.voices import LibraryFull
    from server.voices.postgres import PostgresVoiceStore

    probe = PostgresVoiceStore(postgres_dsn)
    start = len(probe.list())
    stores = [PostgresVoiceStore(postgres_dsn, max_voices=start + 1) for _ in range(4)]
    results: list = []

    def add(store) -> None:
        try:
            results.append(store.add("racer", "Hi.", 1.0, b"v" * 10))
        except LibraryFull as exc:
            results.append(exc)

    threads = [threading.Thread(target=add, args=(s,)) for s in stores]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        added = [r for r in results if not isinstance(r, Exception)]
        assert len(added) == 1 and len(probe.list()) == start + 1
        assert all(str(r).startswith("voices: the library is full") for r in results if isinstance(r, Exception))
        stored = sum(len(probe.load(v.id) or b"") for v in probe.list())
        tight = PostgresVoiceStore(postgres_dsn, max_bytes=stored + 5)
        try:
            with pytest.raises(LibraryFull, match="bytes stored"):
                tight.add("big", "Hi.", 1.0, b"x" * 6)
            extra = tight.add("fits", "Hi.", 1.0, b"x" * 5)
            assert tight.delete(extra.id)
        finally:
            tight.close()
        for voice in added:
            assert probe.delete(voice.id)
    finally:
        for s in stores:
            s.close()
        probe.close()
