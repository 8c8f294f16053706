"""Jobs outlive the servers that run them, and every item is done exactly once.

SQLite: a server killed (SIGKILL) mid-job, with items in flight, and started again on the same
folder finishes the job; the items it was making are made again and no item is made twice.
PostgreSQL: two replicas on one database share a job; one is killed while it holds claimed items,
and the other takes them over once their leases lapse and finishes the job. "Exactly once" is read
from two places that do not depend on each other: the store's rows (every item done, the ones in
flight at the kill claimed again) and the servers' own logs (no item's `job item done` line twice,
across every process that ran; only an item whose row was written as the kill came may lack one)."""

from __future__ import annotations

import io
import re
import signal
import sqlite3
import time
import zipfile
from collections import Counter

import httpx
import soundfile as sf

from tests.support.serverproc import ChorusServer
from tests.support.waiting import poll_until

ITEMS = 50
DONE_LINE = re.compile(r"job item done job=(\S+) item=(\d+)")


def _items(n: int = ITEMS) -> list[dict]:
    return [{"input": f"Item {k} of the fifty.", "num_step": 2, "normalize_text": False, "response_format": "wav"}
            for k in range(n)]


def _view(server: ChorusServer, job_id: str) -> dict:
    return httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()


def _finished(server: ChorusServer, job_id: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while (view := _view(server, job_id))["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, view
        time.sleep(0.25)
    return view


def _done_lines(*servers: ChorusServer) -> Counter:
    """(job, item) of every `job item done` line the servers logged, all their runs together."""
    lines: Counter = Counter()
    for server in servers:
        lines.update((job, int(n)) for job, n in DONE_LINE.findall(server.log_path.read_text(errors="replace")))
    return lines


def _each_logged_once(lines: Counter, job_id: str, done_at_kill: set[int], in_flight_at_most: int) -> None:
    """No item logged done twice, and every item logged, but for an item whose row was written
    just before the kill: its line follows the commit, so the kill may land between them (at
    most one such item a job slot)."""
    assert set(lines) <= {(job_id, n) for n in range(ITEMS)} and all(c == 1 for c in lines.values()), lines
    unlogged = {n for n in range(ITEMS) if (job_id, n) not in lines}
    assert unlogged <= done_at_kill and len(unlogged) <= in_flight_at_most, (unlogged, done_at_kill)


def _kill(server: ChorusServer) -> None:
    server.send_signal(signal.SIGKILL)
    server.wait(30)
    server.stop()  # the log closed; the port kept for a restart


def _frozen_holding_items(server: ChorusServer, ready, held_by_server, what: str) -> set[int]:
    """Freeze `server` (SIGSTOP) at a moment it holds items, and return them; the caller ends it.
    An item of two steps is over in moments, so between seeing the server hold one and
    signalling it, it may finish that item and be between claims. Frozen, it commits nothing
    more, so what its committed rows say it holds stays exact until it is let go."""
    for _ in range(20):
        poll_until(ready, what, 240)
        server.send_signal(signal.SIGSTOP)
        if held := held_by_server():
            return held
        server.send_signal(signal.SIGCONT)
    raise AssertionError(f"{what}: never seen holding an item while frozen")


def _kill_holding_items(server: ChorusServer, ready, held_by_server, what: str) -> set[int]:
    """SIGKILL `server` while it holds items, and return what it held."""
    held = _frozen_holding_items(server, ready, held_by_server, what)
    _kill(server)
    assert held_by_server() == held
    return held


def _archive_decodes(server: ChorusServer, job_id: str) -> None:
    archive = httpx.get(f"{server.url}/v1/jobs/{job_id}/archive", timeout=60)
    with zipfile.ZipFile(io.BytesIO(archive.content)) as z:
        assert len(z.namelist()) == ITEMS
        for name in z.namelist():
            samples, rate = sf.read(io.BytesIO(z.read(name)))
            assert rate == 24000 and len(samples) > 0


def test_a_job_survives_its_server_killed_mid_job(tiny_checkpoint, tmp_path):
    server = ChorusServer(tiny_checkpoint, tmp_path, "--job-concurrency", "4").start()
    db_path = server.voices_dir / "jobs" / "jobs.sqlite3"

    def rows(sql: str, *params) -> list:
        with sqlite3.connect(db_path) as db:
            return db.execute(sql, params).fetchall()

    try:
        job_id = httpx.post(f"{server.url}/v1/jobs", json={"items": _items()}, timeout=30).json()["id"]

        def mid_job() -> bool:
            done = rows("SELECT count(*) FROM job_items WHERE state = 'done'")[0][0]
            running = rows("SELECT count(*) FROM job_items WHERE state = 'running'")[0][0]
            return 5 <= done <= ITEMS - 10 and running > 0

        in_flight = _kill_holding_items(
            server, mid_job, lambda: {n for (n,) in rows("SELECT n FROM job_items WHERE state = 'running'")},
            "the job half-way with items in flight")
        done_at_kill = {n for (n,) in rows("SELECT n FROM job_items WHERE state = 'done'")}
        assert len(done_at_kill) < ITEMS

        server.start()
        view = _finished(server, job_id)
        assert view["status"] == "completed" and view["items_done"] == view["items_total"] == ITEMS, view
        states = rows("SELECT n, state, attempts, lapses FROM job_items WHERE job = ?", job_id)
        assert {n for n, state, _, _ in states if state == "done"} == set(range(ITEMS))
        again = {n for n, _, attempts, lapses in states if lapses}
        assert again == in_flight  # the items being made at the kill, and only those, were claimed again
        assert all(attempts == 2 for n, _, attempts, _ in states if n in again)
        assert view["attempts"] == ITEMS + len(in_flight)
        _each_logged_once(_done_lines(server), job_id, done_at_kill, 4)  # each item done once, across both runs
        _archive_decodes(server, job_id)
    finally:
        server.stop()


def test_a_replica_killed_mid_item_leaves_its_items_to_the_other(tiny_checkpoint, tmp_path, postgres_dsn):
    import psycopg

    flags = ("--voices-db", postgres_dsn, "--job-concurrency", "2", "--job-lease-seconds", "3")
    a = ChorusServer(tiny_checkpoint, tmp_path / "a", *flags).start()
    b = ChorusServer(tiny_checkpoint, tmp_path / "b", *flags).start()

    def rows(sql: str, *params) -> list:
        with psycopg.connect(postgres_dsn, autocommit=True) as db:
            return db.execute(sql, params).fetchall()

    try:
        job_id = httpx.post(f"{a.url}/v1/jobs", json={"items": _items()}, timeout=30).json()["id"]
        a_worker = f"%:{a.pid}:%"

        def both_working() -> bool:
            done = rows("SELECT count(*) FROM chorus_job_items WHERE state = 'done'")[0][0]
            workers = dict(rows("SELECT worker LIKE %s, count(*) FROM chorus_job_items WHERE state = 'running' "
                                "GROUP BY 1", a_worker))
            return 3 <= done <= ITEMS - 10 and workers.get(True, 0) > 0 and workers.get(False, 0) > 0

        held = _kill_holding_items(
            a, both_working,
            lambda: {n for (n,) in rows("SELECT n FROM chorus_job_items WHERE state = 'running' AND worker LIKE %s",
                                        a_worker)},
            "both replicas making items of the job")
        done_at_kill = {n for (n,) in rows("SELECT n FROM chorus_job_items WHERE state = 'done'")}

        view = _finished(b, job_id)
        assert view["status"] == "completed" and view["items_done"] == ITEMS, view
        states = rows("SELECT n, state, lapses, worker FROM chorus_job_items WHERE job = %s", job_id)
        assert {n for n, state, _, _ in states if state == "done"} == set(range(ITEMS))
        assert {n for n, _, lapses, _ in states if lapses} == held  # the dead replica's, taken over
        lines_a, lines_b = _done_lines(a), _done_lines(b)
        _each_logged_once(lines_a + lines_b, job_id, done_at_kill, 2)  # each once, on either
        assert all((job_id, n) in lines_b for n in held)  # finished by the replica that lived
        assert lines_a and lines_b  # both worked on it
        _archive_decodes(b, job_id)
    finally:
        a.stop()
        b.stop()


def test_a_server_stopping_gives_its_items_back_to_the_queue(tiny_checkpoint, tmp_path):
    """SIGTERM (the drain): the items in flight go back to the queue at once, not left to lapse;
    the next start finishes the job."""
    server = ChorusServer(tiny_checkpoint, tmp_path, "--job-concurrency", "2").start()
    db_path = server.voices_dir / "jobs" / "jobs.sqlite3"

    def rows(sql: str) -> list:
        with sqlite3.connect(db_path) as db:
            return db.execute(sql).fetchall()

    try:
        job_id = httpx.post(f"{server.url}/v1/jobs", json={"items": _items(16)}, timeout=30).json()["id"]
        _frozen_holding_items(
            server, lambda: rows("SELECT count(*) FROM job_items WHERE state = 'done'")[0][0] >= 2,
            lambda: {n for (n,) in rows("SELECT n FROM job_items WHERE state = 'running'")}, "items in flight")
        server.send_signal(signal.SIGTERM)  # taken as it wakes, with its items still in flight
        server.send_signal(signal.SIGCONT)
        server.wait(60)
        assert server.stop() == 0
        assert rows("SELECT count(*) FROM job_items WHERE state = 'running' OR lapses > 0") == [(0,)]
        assert "job items given back to the queue" in server.log()
        server.start()
        view = _finished(server, job_id)
        assert view["status"] == "completed" and view["items_done"] == 16, view
        assert _done_lines(server) == Counter({(job_id, n): 1 for n in range(16)})
    finally:
        server.stop()
