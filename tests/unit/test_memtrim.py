"""Freed heap memory goes back to the system once the server is idle after work: glibc's
per-thread arenas otherwise keep a large request's buffers for the life of the process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from server import memtrim

# Many threads each allocate and free 40 MB in small blocks (as frames are built and
# dropped); the arenas keep the pages until trimmed.
_CHILD = """
import threading, sys
from server.memtrim import malloc_trim
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024
def churn():
    blocks = [bytearray(4096) for _ in range(10000)]
    keep = blocks[::500]
    del blocks
    return keep
kept = []
threads = [threading.Thread(target=lambda: kept.append(churn())) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
before = rss(); malloc_trim(); after = rss()
print(before, after)
"""


def test_malloc_trim_gives_freed_arena_memory_back():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True).stdout
    before, after = map(int, out.split())
    assert before - after >= 100, (before, after)  # most of the ~320 MB freed in the threads


def test_trims_once_per_busy_period(monkeypatch):
    calls = []
    monkeypatch.setattr(memtrim, "malloc_trim", lambda: calls.append(1) or True)
    load = iter([0, 2, 1, 0, 0, 0, 3, 0, 0])

    async def run():
        task = asyncio.create_task(memtrim.trim_when_idle(lambda: next(load, 0), poll=0.001))
        while len(calls) < 2:
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 30))
    assert len(calls) == 2  # after [2, 1] and after [3]; never while idle without work
