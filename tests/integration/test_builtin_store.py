"""Both voice stores keep built-in voices apart from the library: first writer wins (so
replicas that make one at once end up using the same), never listed, never deleted."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from server.voices.sqlite import VoiceStore
from tests.support import pg_server


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


@pytest.mark.skipif(not pg_server.available() and os.environ.get("CHORUS_REQUIRE_POSTGRES") != "1",
                    reason="PostgreSQL is not installed")
def test_postgres_store():
    from server.voices.postgres import PostgresVoiceStore

    root = tempfile.mkdtemp(prefix="chorus-pg-")  # the postgres user must reach it
    server = pg_server.PostgresServer(root).start()
    try:
        a, b = PostgresVoiceStore(server.dsn), PostgresVoiceStore(server.dsn)
        try:
            check_first_writer_wins(a, b)
        finally:
            a.close()
            b.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
