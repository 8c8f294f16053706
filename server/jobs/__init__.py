"""Long-form jobs: many items (or one long text cut into items) spoken in the background, their
state and audio kept where the voice library is.

`store` (the records and the `JobStore` protocol), `sql_store` (what both SQL stores share),
`sqlite` (one server: an index and audio files under `--jobs-dir`), `postgres` (replicas: the
`--voices-db` database, audio in the rows), `body` (`POST /v1/jobs`'s forms), `split` (a long
text into items; lengths by the duration estimator), `results` (encoding, the zip, the chained
voice) and `runner` (each server's claimer). `open_job_store` picks the store from the settings.
"""

from __future__ import annotations

from pathlib import Path

from server.jobs.postgres import PostgresJobStore
from server.jobs.sqlite import JobFolder
from server.jobs.store import JobStore


def open_job_store(jobs_dir: Path, voices_db: str | None = None) -> JobStore:
    """PostgreSQL beside the shared voice library when there is one, else the folder."""
    if voices_db:
        return PostgresJobStore(voices_db)
    return JobFolder(jobs_dir)
