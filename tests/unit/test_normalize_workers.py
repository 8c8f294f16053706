"""`normalize_text` in worker processes: the same text as in-process, and a worker that dies
fails only the request it was serving."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from server.text import normalize
from server.text.normalize_workers import NormalizerWorkers

pytestmark = pytest.mark.skipif(not normalize.available(), reason="WeTextProcessing is not installed")


def test_workers_give_what_the_process_gives_and_survive_a_dead_worker():
    workers = NormalizerWorkers(1)

    async def go() -> None:
        text = "It costs $3.50 on 12/05, Dr. Smith said."
        assert await workers.normalize(text, None) == normalize.normalize(text, None)
        assert await workers.normalize("Ich habe 3 Äpfel.", "de") == normalize.normalize("Ich habe 3 Äpfel.", "de")
        pids = [process.pid for process in workers._pool._processes.values()]
        slow = asyncio.ensure_future(workers.normalize("I paid $12.50 at 10:30am. " * 40, "en"))
        await asyncio.sleep(0.2)  # inside the grammars
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="worker process died"):
            await slow
        assert await workers.normalize("3 apples.", "en") == normalize.normalize("3 apples.", "en")

    try:
        asyncio.run(go())
    finally:
        workers.close()
