"""What every job store shares: a job's and an item's states, the records that cross the store's
edge, and the `JobStore` protocol the runner and the routes see.

A job is a row and its items are rows beside it, in the database the voice library uses
(SQLite for one server, PostgreSQL for replicas): no queue lives outside it. An item is claimed
by one runner (`worker`) for a lease (`lease_until`, the database's clock) that the runner renews
while it works; a claim is named by (job, item, attempt), and every write a runner makes about an
item (renew, keep the job's voice, complete, fail, release) holds only while that claim is still
the item's, so a runner whose lease lapsed and was taken over cannot overwrite what the new
claimer does. Completion (the audio and the item's `done`) is one transaction: an item is done
once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec

from server.voices.store import Owner

JobStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
ItemStatus = Literal["queued", "running", "done", "failed", "cancelled"]
FINISHED: tuple[JobStatus, ...] = ("completed", "failed", "cancelled")
STATUSES: tuple[JobStatus, ...] = ("queued", "running", *FINISHED)
JOB_ID = re.compile(r"job-[0-9a-f]{32}\Z")  # 128 random bits: without API keys the id is what grants access
# An item whose runner vanished this many times (a lease that lapsed, a server killed mid-item) fails
# its job instead of being claimed again: an item that kills its server must not kill every replica.
MAX_LAPSES = 3


def well_formed(job_id: object) -> bool:
    return isinstance(job_id, str) and JOB_ID.match(job_id) is not None


class ItemWork(msgspec.Struct, frozen=True, omit_defaults=True):
    """One item as the runner needs it, stored as JSON in the item's row: the text as sent, the
    voice as named, the knobs (`GenerationOptions`' fields) and the audio format."""

    text: str
    format: str
    seconds: float  # the duration estimator's length of it, for caps and the time left
    voice: str | None = None
    instruct: str | None = None
    language: str | None = None
    normalize: bool | str = True
    options: dict[str, Any] = {}


@dataclass(frozen=True)
class NewJob:
    """A job as submitted. `chained`: a long text with no voice named, whose later items speak in
    the voice the first one made (kept in the job's row as soon as its first tokens are done)."""

    owner: Owner
    items: tuple[ItemWork, ...]
    chained: bool = False


class JobError(msgspec.Struct, frozen=True):
    """Why a job failed: the item at fault and its error as the speech endpoint would say it."""

    item: int
    code: str
    message: str


class JobView(msgspec.Struct, frozen=True, omit_defaults=True):
    """`GET /v1/jobs/{id}`: progress, audio made, the time left (null until an item is done, then
    the elapsed time scaled by the estimated audio left over the estimated audio done); `attempts`
    counts claims of its items (each item is claimed once unless a server stopped while making it);
    `error` when it failed."""

    id: str
    status: JobStatus
    items_total: int
    items_done: int
    audio_seconds: float
    eta_seconds: float | None
    attempts: int = 0
    created_at: float = 0.0
    error: JobError | None = None


class ItemView(msgspec.Struct, frozen=True, omit_defaults=True):
    """One item of `GET /v1/jobs/{id}/items`: its status and, once done, its format and how long
    it plays."""

    n: int
    status: ItemStatus
    format: str | None = None
    audio_seconds: float | None = None


class JobItems(msgspec.Struct, frozen=True):
    """`GET /v1/jobs/{id}/items`: the job's items from `offset`, in order (at most the `limit`
    asked for), so a client fetches the ones done instead of asking each in turn."""

    id: str
    items_total: int
    offset: int
    items: list[ItemView]


@dataclass(frozen=True)
class Claim:
    """An item claimed by this runner: `attempt` is its claim count when claimed (the claim's name
    with `job` and `n`); `voice` the job's kept voice (a chained job's, once its first item made it)."""

    job: str
    n: int
    attempt: int
    work: ItemWork
    owner: Owner
    chained: bool
    voice: bytes | None


@dataclass(frozen=True)
class ItemAudio:
    """An item's result: its encoded audio and how long it plays."""

    data: bytes
    format: str
    seconds: float


class JobStore(Protocol):
    """The contract both stores keep (`sqlite.JobFolder`, `postgres.PostgresJobStore`)."""

    def create(self, job: NewJob, max_active: int | None = None) -> str:
        """Store a new job and its items (queued); its id. `TooManyJobs` when its owner has
        `max_active` jobs not yet finished."""
        ...

    def view(self, job_id: str, owner: Owner | None = None) -> JobView | None:
        """A job `owner` may see (None: any), else None."""
        ...

    def cancel(self, job_id: str, owner: Owner | None = None) -> JobView | None:
        """Cancel a job not finished: queued items never run, running ones are told at their
        runner's next renewal. The job as it is then, or None when there is no such job."""
        ...

    def claim(self, worker: str, limit: int, lease_s: float) -> list[Claim]:
        """Up to `limit` items, oldest job first: queued ones, and running ones whose lease lapsed."""
        ...

    def renew(self, worker: str, claims: list[Claim], lease_s: float) -> list[Claim]:
        """Extend the leases; the claims no longer held (cancelled, failed, taken over)."""
        ...

    def keep_voice(self, worker: str, claim: Claim, blob: bytes) -> bool:
        """The chained job's voice, from its first item's first tokens: True when kept (the job
        had none and the claim is still held)."""
        ...

    def complete(self, worker: str, claim: Claim, audio: ItemAudio) -> bool:
        """The audio and the item's `done`, together, while the claim holds; False (nothing
        written) when it no longer does."""
        ...

    def fail(self, worker: str, claim: Claim, code: str, message: str) -> bool:
        """The item failed: so does its job (its other items are cancelled)."""
        ...

    def release(self, worker: str, claims: list[Claim]) -> None:
        """Give items back to the queue (a server stopping, or refused for now)."""
        ...

    def done_items(self, job_id: str) -> list[tuple[int, str]]:
        """(item, format) of every item done, in order."""
        ...

    def item_audio(self, job_id: str, n: int) -> ItemAudio | None:
        """A done item's audio, else None."""
        ...

    def items(self, job_id: str, offset: int, limit: int) -> list[ItemView]:
        """Items `offset` to `offset + limit - 1` (those there are), in order."""
        ...

    def sweep(self, retention_s: float) -> int:
        """Remove jobs finished over `retention_s` ago, with their audio; how many."""
        ...

    def counts(self) -> dict[str, int]:
        """Jobs by status."""
        ...

    def close(self) -> None: ...


class TooManyJobs(Exception):
    """The owner has `--max-active-jobs` jobs not yet finished (the message is for the client)."""
