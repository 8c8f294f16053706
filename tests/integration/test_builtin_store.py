"""Both voice stores keep built-in voices apart from the library: first writer wins (so
replicas that make one at once end up using the same), never listed, never deleted."""

from __future__ import annotations

from server.voices.sqlite import VoiceStore


def check_first_writer_wins(replica_a, replica_b) -> None:
    assert replica_a.load_builtin("m/alloy/v1") is None
    assert replica_a.save_builtin("m/alloy/v1", b"first") == b"first"
    assert replica_b.save_builtin("m/alloy/v1", b"second") == b"first"  # made at once elsewhere: lost
    assert replica_b.load_builtin("m/alloy/v1") == b"first"
    assert replica_b.load_builtin("other-model/alloy/v1") is None
    assert replica_a.list() == [] and replica_a.delete("alloy") is False


def test_sqlite_store(tmp_path):
    a, b = VoiceStore(tmp_path), VoiceStore(tmp_path)  # two processes on one folder
    try:
        check_first_writer_wins(a, b)
    finally:
        a.close()
        b.close()


def test_postgres_store(postgres_replicas):
    check_first_writer_wins(*postgres_replicas)
