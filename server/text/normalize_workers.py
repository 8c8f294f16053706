"""`normalize_text`'s grammars in worker processes, never in the server's own.

WeTextProcessing runs its grammars (pynini) in C++ without letting go of the GIL: one call
costs milliseconds per character, and the first in a process loads the language's grammars.
On a thread of the server that would stall the event loop (every connection) and the
engine's step loop with it, for as long as one request's text takes. So English and Chinese
go to a small pool of processes; what holds no GIL for long (`num2words`) stays on a thread.

The pool starts at the first request that needs it (a server never asked for normalisation
pays nothing). Its workers fork from a fork server that imported only the grammars
(`grammar_preload`: loaded once a process, not once a worker) and none of the server's
threads; where there is no fork server (not Unix) they are spawned and load the grammars at
their first use. A worker that dies is replaced: the request it was serving fails, the others
go on.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from server.text import normalize as normalizer

log = logging.getLogger("chorus.text")


def _context() -> multiprocessing.context.BaseContext:
    """Never a plain fork: the server has threads (the engine's) that it would copy mid-flight."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["server.text.grammar_preload"])  # read when it starts, once
    return context


def _started_pool(workers: int) -> ProcessPoolExecutor:
    """A pool with its first worker up (blocking: the first start in a process waits for the
    fork server to load the grammars, so it runs on a thread)."""
    pool = ProcessPoolExecutor(workers, mp_context=_context())
    pool.submit(int).result()
    return pool


class NormalizerWorkers:
    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    async def _executor(self) -> ProcessPoolExecutor:
        async with self._starting:  # one start at a time; the requests behind it wait for it
            if self._pool is None:
                self._pool = await asyncio.to_thread(_started_pool, self.workers)
        return self._pool

    async def normalize(self, text: str, language: str | None) -> str:
        """`normalize.normalize(text, language)`, off this process's GIL when it runs grammars."""
        if not normalizer.uses_grammars(text, language):
            return await asyncio.to_thread(normalizer.normalize, text, language)
        pool = await self._executor()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, normalizer.normalize, text, language)
        except BrokenProcessPool:
            if self._pool is pool:  # the first to see it replaces the pool; later calls get a new one
                log.error("normalize_text: a worker process died; starting new ones")
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise RuntimeError("normalize_text: the worker process died") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
