"""A throwaway PostgreSQL server for tests: initdb into a temp folder, run on loopback."""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psycopg


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root; run it as the `postgres` user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def available() -> bool:
    return _bin("initdb") is not None and _bin("pg_ctl") is not None


class PostgresServer:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.data = self.root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._databases = itertools.count(1)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o700)
        subprocess.run(_as_postgres([_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                                     "-E", "UTF8"]), check=True, capture_output=True)
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                                     "-o", f"-h 127.0.0.1 -p {self.port} -k {self.root}", "start"]),
                       check=True, capture_output=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not start")

    def new_database(self) -> str:
        """The DSN of a new, empty database on this server: tests that share the server share
        nothing else."""
        name = f"test_{next(self._databases)}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"]),
                       capture_output=True)
