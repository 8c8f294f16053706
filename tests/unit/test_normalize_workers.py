"""`normalize_text` in worker processes: the same text as in-process (whole when it fits one
piece, piece by piece when longer), by the normaliser each request chose, and a worker that dies
fails only the request whose piece it held; a cancelled request's piece ends with its worker."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from server.text import normalize, normalize_nemo
from server.text.normalize_pieces import MAX_PIECE_WEIGHT, join, pieces
from server.text.normalize_workers import NormalizerWorkers, WorkerDied

pytestmark = pytest.mark.skipif(not normalize.available(), reason="WeTextProcessing is not installed")


def test_pieces_join_back_to_the_text_and_keep_brackets_whole():
    for text in ["1" * 500, "It costs $3.50 on 12/05, Dr. Smith said. " * 9, "我有3个苹果，价格是12.5元。" * 12,
                 "Say [" + "A" * 400 + "] twice " * 3]:
        cut = pieces(text)
        assert "".join(piece.text for piece in cut) == text
        assert all("[" not in p.text or p.text.count("[") == p.text.count("]") for p in cut)
        assert len(cut) > 1
    assert pieces("Short and sweet 12.") == pieces("Short and sweet 12.")[:1]  # one piece: the reference's call
    glued = pieces("1" * (MAX_PIECE_WEIGHT // 2))
    joined = join(glued, ["one"] * len(glued))
    assert joined.count("one") == len(glued) and "oneone" not in joined


def test_workers_give_what_the_process_gives_and_survive_a_dead_worker():
    workers = NormalizerWorkers(1)

    async def go() -> None:
        text = "It costs $3.50 on 12/05, Dr. Smith said."
        assert await workers.normalize(text, None) == normalize.normalize(text, None)
        assert await workers.normalize("Ich habe 3 Äpfel.", "de") == normalize.normalize("Ich habe 3 Äpfel.", "de")
        slow = asyncio.ensure_future(workers.normalize("I paid $12.50 at 10:30am. " * 40, "en"))
        await asyncio.sleep(0.3)  # inside the grammars
        for pid in workers.pids():
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="worker process died"):
            await slow
        assert await workers.normalize("3 apples.", "en") == normalize.normalize("3 apples.", "en")
        busy = asyncio.ensure_future(workers.normalize("1" * 400, "en"))
        await asyncio.sleep(0.3)
        before = set(workers.pids())
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert workers.counts()[0] == 0 and not before & set(workers.pids())  # its worker ended with it

    try:
        asyncio.run(go())
    finally:
        workers.close()


@pytest.mark.skipif(not normalize_nemo.available(), reason="nemo-text-processing is not installed")
def test_workers_follow_each_requests_choice():
    workers = NormalizerWorkers(1)
    text = "1,000 people came."

    async def go() -> tuple[str, str]:
        return await asyncio.gather(workers.normalize(text, "en"), workers.normalize(text, "en", choice="reference"))

    try:
        best, reference = asyncio.run(go())
    finally:
        workers.close()
    assert best == normalize.normalize(text, "en") == "one thousand people came."
    assert reference == normalize.normalize(text, "en", "reference") == "thousand people came."
