"""What the two SQL job stores do alike, whatever their database: creating a job, claiming items
under a lease, renewing, completing, failing, releasing and cancelling, the progress view and
retention.

Each store names its tables and its clock (`Dialect`: the database's own time, so replicas with
skewed clocks agree on when a lease lapsed), how a claim locks the rows it picks (PostgreSQL:
`FOR UPDATE ... SKIP LOCKED`, so replicas claiming at once take different items; SQLite has one
writer), how one statement runs, what a transaction holds, and where an item's audio goes (a
file, the row). Every write about a claimed item is conditional on the claim still being the
item's (`_HELD`): whoever lost an item's lease writes nothing about it.

Every transaction takes its row locks items first, then the job's row: so none holds a job while
it waits for an item, and replicas working on one job do not deadlock.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from server.jobs.store import (
    FINISHED,
    MAX_LAPSES,
    Claim,
    ItemAudio,
    ItemView,
    ItemWork,
    JobError,
    JobView,
    NewJob,
    TooManyJobs,
    well_formed,
)
from server.voices.store import Owner

_HELD = "job = ? AND n = ? AND worker = ? AND attempts = ? AND state = 'running'"
_OPEN = "('queued', 'running')"
_ENDED = "(" + ", ".join(f"'{s}'" for s in FINISHED) + ")"
_VIEW = ("SELECT id, owner, by_key, status, items_total, items_done, audio_seconds, planned_seconds, planned_done, "
         "attempts, created_at, started_at, error_item, error_code, error_message, {now} FROM {jobs} WHERE id = ?")
_CLAIMABLE = ("SELECT i.job, i.n, i.state, i.lapses, i.attempts FROM {items} i JOIN {jobs} j ON j.id = i.job "
              "WHERE (i.state = 'queued' OR (i.state = 'running' AND i.lease_until < {now})) "
              "AND (j.chained = 0 OR i.n = 0 OR j.voice IS NOT NULL) "
              "ORDER BY j.created_at, i.job, i.n LIMIT ?")
_BATCH = 500  # ids per `IN (...)` list


@dataclass(frozen=True)
class Dialect:
    jobs: str  # the jobs table
    items: str  # the items table
    now: str  # the database's clock, unix seconds, as an SQL expression
    skip_locked: str  # after a claim's SELECT: lock the rows picked, skipping those another claim holds
    for_update: str  # after a SELECT of one row to change in the same transaction


def _held(claim: Claim, worker: str) -> tuple:
    return claim.job, claim.n, worker, claim.attempt


def eta_seconds(status: str, planned_total: float, planned_done: float, started_at: float | None,
                now: float) -> float | None:
    """The time left: the time so far, scaled by the estimated audio left over the estimated audio
    done (0 once completed; None before any item is done, or once the job stopped)."""
    if status == "completed":
        return 0.0
    if status in FINISHED or started_at is None or planned_done <= 0:
        return None
    return round(max(0.0, now - started_at) * max(0.0, planned_total - planned_done) / planned_done, 1)


class SqlJobStore:
    """The `JobStore` methods both SQL stores share; see the module docstring."""

    dialect: ClassVar[Dialect]
    _lock: threading.Lock

    # ---- what each database does its own way -------------------------------------------

    def _execute(self, statement: str, params: tuple = ()) -> Any:
        """A cursor over what `statement` returns (`?` placeholders; the caller holds the lock)."""
        raise NotImplementedError

    def _execute_many(self, statement: str, rows: list[tuple]) -> None:
        raise NotImplementedError

    def _transaction(self) -> AbstractContextManager:
        """The lock and one transaction, committed on leaving (rolled back on an exception)."""
        raise NotImplementedError

    def _put_audio(self, job_id: str, n: int, audio: ItemAudio) -> None:
        """Store an item's audio inside the completion's transaction (an exception undoes it)."""
        raise NotImplementedError

    def _get_audio(self, job_id: str, n: int, fmt: str) -> bytes | None:
        raise NotImplementedError

    def _drop_audio(self, job_ids: list[str]) -> None:
        """After their rows are gone: what is kept of these jobs' audio outside them."""

    # ---- shared ----------------------------------------------------------------------------

    def _q(self, statement: str) -> str:
        d = self.dialect
        return statement.format(jobs=d.jobs, items=d.items, now=d.now)

    def _run(self, statement: str, params: tuple = ()) -> Any:
        return self._execute(self._q(statement), params)

    def create(self, job: NewJob, max_active: int | None = None) -> str:
        job_id = f"job-{secrets.token_hex(16)}"
        with self._transaction():
            if max_active is not None:
                active = self._run(f"SELECT count(*) FROM {{jobs}} WHERE owner = ? AND status IN {_OPEN}",
                                   (job.owner.tag,)).fetchone()[0]
                if active >= max_active:
                    raise TooManyJobs(f"you have {active} jobs not yet finished, the limit (--max-active-jobs "
                                      f"{max_active}); submit more when one has finished, or cancel one")
            planned = sum(item.seconds for item in job.items)
            self._run("INSERT INTO {jobs} (id, owner, by_key, status, chained, items_total, planned_seconds, "
                      "created_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, {now})",
                      (job_id, job.owner.tag, int(job.owner.by_key), int(job.chained), len(job.items), planned))
            self._execute_many(self._q("INSERT INTO {items} (job, n, work, state) VALUES (?, ?, ?, 'queued')"),
                               [(job_id, n, msgspec.json.encode(item).decode()) for n, item in enumerate(job.items)])
        return job_id

    def view(self, job_id: str, owner: Owner | None = None) -> JobView | None:
        if not well_formed(job_id):
            return None
        with self._lock:
            row = self._run(_VIEW, (job_id,)).fetchone()
        if row is None or (owner is not None and not owner.may_use(row[1])):
            return None
        (_, _, _, status, total, done, seconds, planned, planned_done, attempts, created_at, started_at,
         error_item, error_code, error_message, now) = row
        error = JobError(error_item, error_code, error_message) if error_code is not None else None
        return JobView(job_id, status, total, done, round(float(seconds), 3),
                       eta_seconds(status, float(planned), float(planned_done), started_at, float(now)),
                       attempts=attempts, created_at=round(float(created_at), 3), error=error)

    def cancel(self, job_id: str, owner: Owner | None = None) -> JobView | None:
        if self.view(job_id, owner) is None:
            return None
        with self._transaction():  # items, then the job: the order every transaction takes its locks in
            self._run(f"UPDATE {{items}} SET state = 'cancelled', worker = NULL, lease_until = NULL "
                      f"WHERE job = ? AND state IN {_OPEN}", (job_id,))
            self._run(f"UPDATE {{jobs}} SET status = 'cancelled', finished_at = {{now}} "
                      f"WHERE id = ? AND status IN {_OPEN}", (job_id,))
        return self.view(job_id, owner)

    def claim(self, worker: str, limit: int, lease_s: float) -> list[Claim]:
        taken: list[tuple[str, int, int]] = []
        with self._transaction():
            picked = self._run(_CLAIMABLE + self.dialect.skip_locked, (limit,)).fetchall()
            failing = []
            for job_id, n, state, lapses, attempts in picked:  # locked already: nothing waits here
                lapses += 1 if state == "running" else 0  # its runner vanished
                if lapses >= MAX_LAPSES:
                    failing.append((job_id, n, lapses))
                elif self._run("UPDATE {items} SET state = 'running', worker = ?, lease_until = {now} + ?, "
                               "attempts = attempts + 1, lapses = ? WHERE job = ? AND n = ?",
                               (worker, lease_s, lapses, job_id, n)).rowcount:
                    taken.append((job_id, n, attempts + 1))
            for job_id, n, lapses in failing:
                self._run("UPDATE {items} SET state = 'failed', worker = NULL, lease_until = NULL, lapses = ?, "
                          "finished_at = {now} WHERE job = ? AND n = ?", (lapses, job_id, n))
                self._fail_job(job_id, n, "internal", f"item {n}: the server making it stopped {lapses} times "
                               "before it was done")
            for job_id in sorted({job_id for job_id, _, _ in taken}):  # the jobs' rows last, in one order
                self._run("UPDATE {jobs} SET attempts = attempts + ?, started_at = COALESCE(started_at, {now}), "
                          "status = CASE WHEN status = 'queued' THEN 'running' ELSE status END WHERE id = ?",
                          (sum(1 for j, _, _ in taken if j == job_id), job_id))
            return [self._claimed(job_id, n, attempt) for job_id, n, attempt in taken]

    def _claimed(self, job_id: str, n: int, attempt: int) -> Claim:
        work, tag, by_key, chained, voice = self._run(
            "SELECT i.work, j.owner, j.by_key, j.chained, j.voice FROM {items} i JOIN {jobs} j ON j.id = i.job "
            "WHERE i.job = ? AND i.n = ?", (job_id, n)).fetchone()
        return Claim(job_id, n, attempt, msgspec.json.decode(work, type=ItemWork), Owner(tag, bool(by_key)),
                     bool(chained), bytes(voice) if voice is not None else None)

    def renew(self, worker: str, claims: list[Claim], lease_s: float) -> list[Claim]:
        lost = []
        for claim in claims:  # one item a transaction: none holds an item while it waits for another
            with self._transaction():
                if self._run(f"UPDATE {{items}} SET lease_until = {{now}} + ? WHERE {_HELD}",
                             (lease_s, *_held(claim, worker))).rowcount != 1:
                    lost.append(claim)
        return lost

    def keep_voice(self, worker: str, claim: Claim, blob: bytes) -> bool:
        with self._transaction():
            if self._run(f"SELECT 1 FROM {{items}} WHERE {_HELD}{self.dialect.for_update}",
                         _held(claim, worker)).fetchone() is None:
                return False
            return self._run("UPDATE {jobs} SET voice = ? WHERE id = ? AND voice IS NULL",
                             (blob, claim.job)).rowcount == 1

    def complete(self, worker: str, claim: Claim, audio: ItemAudio) -> bool:
        with self._transaction():
            if self._run(f"UPDATE {{items}} SET state = 'done', worker = NULL, lease_until = NULL, audio_seconds = ?, "
                         f"format = ?, finished_at = {{now}} WHERE {_HELD}",
                         (audio.seconds, audio.format, *_held(claim, worker))).rowcount != 1:
                return False
            self._put_audio(claim.job, claim.n, audio)
            self._run("UPDATE {jobs} SET items_done = items_done + 1, audio_seconds = audio_seconds + ?, "
                      "planned_done = planned_done + ?, "
                      "status = CASE WHEN items_done + 1 >= items_total AND status = 'running' THEN 'completed' "
                      "ELSE status END, "
                      "finished_at = CASE WHEN items_done + 1 >= items_total AND status = 'running' THEN {now} "
                      "ELSE finished_at END WHERE id = ?", (audio.seconds, claim.work.seconds, claim.job))
        return True

    def fail(self, worker: str, claim: Claim, code: str, message: str) -> bool:
        with self._transaction():
            if self._run(f"UPDATE {{items}} SET state = 'failed', worker = NULL, lease_until = NULL, "
                         f"finished_at = {{now}} WHERE {_HELD}", _held(claim, worker)).rowcount != 1:
                return False
            self._fail_job(claim.job, claim.n, code, message)
        return True

    def _fail_job(self, job_id: str, n: int, code: str, message: str) -> None:
        """The job fails with item `n`'s error; its items not done are cancelled (in the caller's
        transaction; items first, then the job)."""
        self._run(f"UPDATE {{items}} SET state = 'cancelled', worker = NULL, lease_until = NULL "
                  f"WHERE job = ? AND state IN {_OPEN}", (job_id,))
        self._run(f"UPDATE {{jobs}} SET status = 'failed', error_item = ?, error_code = ?, error_message = ?, "
                  f"finished_at = {{now}} WHERE id = ? AND status IN {_OPEN}", (n, code, message, job_id))

    def release(self, worker: str, claims: list[Claim]) -> None:
        for claim in claims:
            with self._transaction():
                self._run(f"UPDATE {{items}} SET state = 'queued', worker = NULL, lease_until = NULL WHERE {_HELD}",
                          _held(claim, worker))

    def done_items(self, job_id: str) -> list[tuple[int, str]]:
        with self._lock:
            rows = self._run("SELECT n, format FROM {items} WHERE job = ? AND state = 'done' ORDER BY n",
                             (job_id,)).fetchall()
        return [(n, fmt) for n, fmt in rows]

    def items(self, job_id: str, offset: int, limit: int) -> list[ItemView]:
        with self._lock:
            rows = self._run("SELECT n, state, format, audio_seconds FROM {items} WHERE job = ? AND n >= ? "
                             "ORDER BY n LIMIT ?", (job_id, offset, limit)).fetchall()
        return [ItemView(n, state, fmt, round(float(seconds), 3)) if state == "done" else ItemView(n, state)
                for n, state, fmt, seconds in rows]

    def item_audio(self, job_id: str, n: int) -> ItemAudio | None:
        with self._lock:
            row = self._run("SELECT state, format, audio_seconds FROM {items} WHERE job = ? AND n = ?",
                            (job_id, n)).fetchone()
            if row is None or row[0] != "done":
                return None
            data = self._get_audio(job_id, n, row[1])
        return None if data is None else ItemAudio(data, row[1], float(row[2]))

    def sweep(self, retention_s: float) -> int:
        with self._transaction():
            ids = [row[0] for row in self._run(f"SELECT id FROM {{jobs}} WHERE status IN {_ENDED} "
                                               "AND finished_at < {now} - ?", (retention_s,)).fetchall()]
            for batch in _batches(ids):
                marks = ", ".join("?" * len(batch))
                self._run(f"DELETE FROM {{items}} WHERE job IN ({marks})", tuple(batch))
                self._run(f"DELETE FROM {{jobs}} WHERE id IN ({marks})", tuple(batch))
        self._drop_audio(ids)
        return len(ids)

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._run("SELECT status, count(*) FROM {jobs} GROUP BY status").fetchall()
        return {status: int(count) for status, count in rows}


def _batches(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _BATCH):
        yield ids[start:start + _BATCH]
