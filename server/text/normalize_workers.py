"""`normalize_text` in worker processes, never in the server's own, bounded like all request work.

WeTextProcessing runs its grammars (pynini) in C++ without letting go of the GIL, for longer
than the text's length would say (a run of digits most of all), and a call cannot be stopped
from outside its process. So:

- every text is cut into pieces (`normalize_pieces`): no call is long;
- `workers` processes take pieces from the requests waiting in turn (round robin), so a short
  text waits at most a piece a worker behind long ones;
- a request's pieces together may use its budget of CPU seconds in the workers (`budget_s`:
  CPU time, so a loaded machine does not spend it for the request); past it, or when the
  request is cancelled, its piece in flight ends with its process, which is replaced; a piece
  that has not answered in `PIECE_WALL_S` (a worker stuck) ends the same way;
- a worker whose memory has grown past `MAX_WORKER_RSS` after a piece is replaced;
- a worker that dies fails only the request whose piece it held.

The processes fork from a fork server that imported only the grammars (`grammar_preload`: loaded
once, shared copy-on-write) and none of the server's threads; where there is no fork server (not
Unix) they are spawned and load the grammars at their first use. They start at the first request
that needs one (a server never asked for normalisation pays nothing).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from server.bounds import WorkBounds, WorkCancelled, WorkRefused
from server.text import normalize as normalizer
from server.text.normalize_pieces import Piece, join, pieces

log = logging.getLogger("chorus.text")

MAX_WORKER_RSS = 1 << 30  # bytes; a worker past it after a piece is replaced
PIECE_WALL_S = 60.0  # a piece that has not answered by then: its worker is stuck
WORKER_NICENESS = 10


def _context() -> multiprocessing.context.BaseContext:
    """Never a plain fork: the server has threads (the engine's) that it would copy mid-flight."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["server.text.grammar_preload"])  # read when it starts, once
    return context


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _serve(conn: Connection) -> None:
    """A worker: normalise pieces until told to stop (None) or grown too large. It runs at a
    lower priority than the server (the event loop and the engine's step loop come first)."""
    try:
        os.nice(WORKER_NICENESS)
    except OSError:
        pass
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        text, code, choice = task
        began = time.process_time()
        try:
            out = normalizer.normalize(text, code, choice)
        except Exception as exc:  # noqa: BLE001 - the reference never raises; a bug here fails only its piece
            conn.send(("error", f"{type(exc).__name__}: {exc}", False, time.process_time() - began))
            continue
        retire = _rss_bytes() > MAX_WORKER_RSS
        conn.send(("ok", out, retire, time.process_time() - began))
        if retire:
            return


class WorkerDied(Exception):
    pass


def _over_budget(job: _Job) -> WorkRefused:
    field = job.bounds.field
    return WorkRefused("text_too_long", f"{field}: normalize_text took longer than its time budget (the text is "
                       "too long or too hard to read as words); send less text or turn normalize_text off", field)


@dataclass(eq=False)
class _Job:
    """One request's text: its pieces waiting, their results, its budget."""

    bounds: WorkBounds
    code: str
    choice: normalizer.Choice
    waiting: deque[tuple[int, Piece]]
    results: list[str | None]
    done: asyncio.Future
    used_s: float = 0.0
    running: set[_Worker] = field(default_factory=set)


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    job: _Job | None = None
    index: int = 0
    started_at: float = 0.0
    timer: asyncio.TimerHandle | None = None


class NormalizerWorkers:
    def __init__(self, workers: int, budget_s: float = 30.0):
        self.workers = workers
        self.budget_s = budget_s
        self._context: multiprocessing.context.BaseContext | None = None
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._jobs: OrderedDict[int, _Job] = OrderedDict()  # round robin: the next piece comes from the first
        self._ids = itertools.count()
        self._closed = False

    # ---- requests -----------------------------------------------------------------------

    async def normalize(self, text: str, language: str | None, bounds: WorkBounds | None = None,
                        choice: normalizer.Choice = True) -> str:
        """`normalize.normalize(text, language, choice)`, piece by piece in the workers, within
        `bounds` (its deadline is a wall-clock limit besides the CPU seconds of `budget_s`)."""
        if not text.strip():
            return text
        bounds = bounds or WorkBounds.unbounded()
        code = normalizer.language_code(language, text)  # once for the whole text, as the reference
        cut = pieces(text)
        loop = asyncio.get_running_loop()
        job = _Job(bounds, code, choice, deque(enumerate(cut)), [None] * len(cut), loop.create_future())
        key = next(self._ids)
        self._jobs[key] = job
        try:
            self._dispatch()
            left = bounds.seconds_left()
            try:
                await asyncio.wait_for(asyncio.shield(job.done), left)
            except TimeoutError:
                raise _over_budget(job) from None
            out = join(cut, job.results)  # type: ignore[arg-type]
            bounds.check_size(len(out))
            return out
        finally:
            self._drop(key, job)

    def _drop(self, key: int, job: _Job) -> None:
        """The request is over (done, failed, cancelled): its waiting pieces go, its running ones
        end with their workers."""
        self._jobs.pop(key, None)
        job.waiting.clear()
        for worker in list(job.running):
            self._kill(worker, "its request ended")
        if not job.done.done():
            job.done.cancel()

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if not job.done.done():
            job.done.set_exception(exc)

    # ---- dispatch -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand waiting pieces to idle workers, a request at a time in turn; start workers while
        pieces wait and fewer than `workers` run."""
        while self._idle and (job := self._next_job()) is not None:
            if job.used_s >= self.budget_s:
                job.waiting.clear()
                self._fail(job, _over_budget(job))
                continue
            index, piece = job.waiting.popleft()
            self._run(self._idle.pop(), job, index, piece)
        waiting = sum(len(job.waiting) for job in self._jobs.values())
        alive = len(self._idle) + len(self._busy) + self._starting
        for _ in range(min(waiting, self.workers - alive)):
            self._start_worker()

    def _next_job(self) -> _Job | None:
        """The first request in turn with a piece waiting; it goes to the back of the turn."""
        for _ in range(len(self._jobs)):
            key, job = next(iter(self._jobs.items()))
            self._jobs.move_to_end(key)
            if job.waiting and not job.done.done():
                return job
        return None

    def _run(self, worker: _Worker, job: _Job, index: int, piece: Piece) -> None:
        loop = asyncio.get_running_loop()
        worker.job, worker.index, worker.started_at = job, index, time.monotonic()
        job.running.add(worker)
        self._busy.add(worker)
        try:
            worker.conn.send((piece.text, job.code, job.choice))
        except OSError:
            self._lost(worker)
            return
        worker.timer = loop.call_later(PIECE_WALL_S, self._stuck, worker)

    def _stuck(self, worker: _Worker) -> None:
        job = worker.job
        if job is not None:
            self._fail(job, _over_budget(job))
            self._kill(worker, "its piece did not finish in time")

    def _on_readable(self, worker: _Worker) -> None:
        try:
            status, out, retire, cpu_s = worker.conn.recv()
        except (EOFError, OSError):
            self._lost(worker)
            return
        job = self._release(worker)
        if job is not None:
            job.used_s += cpu_s
            if status == "ok":
                job.results[worker.index] = out
                if not job.waiting and not job.running:
                    job.done.done() or job.done.set_result(None)
            else:
                self._fail(job, RuntimeError(f"normalize_text failed: {out}"))
        if retire:
            log.info("normalize_text: a worker grew past its memory limit; replacing it")
            self._forget(worker)
        else:
            self._idle.append(worker)
        self._dispatch()

    def _release(self, worker: _Worker) -> _Job | None:
        """The worker's piece is over: account its time, detach it from its request."""
        if worker.timer is not None:
            worker.timer.cancel()
            worker.timer = None
        self._busy.discard(worker)
        job, worker.job = worker.job, None
        if job is not None:
            job.running.discard(worker)
        return job

    def _lost(self, worker: _Worker) -> None:
        """The worker's process ended without answering: its piece's request fails."""
        job = self._release(worker)
        if job is not None:
            log.error("normalize_text: a worker process died; the request it served fails")
            self._fail(job, WorkerDied("normalize_text: the worker process died"))
        self._forget(worker)
        self._dispatch()

    def _kill(self, worker: _Worker, why: str) -> None:
        self._release(worker)
        log.info("normalize_text: ending a worker (%s)", why)
        self._forget(worker)
        try:
            worker.process.kill()
        except (OSError, ValueError):
            pass

    def _forget(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.remove_reader(worker.conn.fileno())
        except (OSError, ValueError):
            pass
        worker.conn.close()
        if worker in self._idle:
            self._idle.remove(worker)
        self._busy.discard(worker)
        loop.run_in_executor(None, worker.process.join, 5.0)  # reaped off the loop

    # ---- processes ----------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._closed:
            return
        self._starting += 1
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._spawn)  # blocking: the first waits for the fork server

        def started(done: asyncio.Future) -> None:
            self._starting -= 1
            if done.cancelled() or done.exception() is not None:
                failure = None if done.cancelled() else done.exception()
                log.error("normalize_text: a worker failed to start: %r", failure)
                for job in self._jobs.values():
                    self._fail(job, WorkerDied("normalize_text: no worker process could be started"))
                return
            worker = done.result()
            if self._closed:
                worker.process.kill()
                return
            loop.add_reader(worker.conn.fileno(), self._on_readable, worker)
            self._idle.append(worker)
            self._dispatch()

        future.add_done_callback(started)

    def _spawn(self) -> _Worker:
        if self._context is None:
            self._context = _context()
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(child,), daemon=True, name="chorus-normalizer")
        process.start()
        child.close()
        return _Worker(process, parent)

    def counts(self) -> tuple[int, int, int]:
        """Busy workers, idle workers, pieces waiting (/metrics)."""
        return len(self._busy), len(self._idle), sum(len(job.waiting) for job in self._jobs.values())

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in [*self._idle, *self._busy] if w.process.pid is not None]

    def close(self) -> None:
        self._closed = True
        for job in self._jobs.values():
            self._fail(job, WorkCancelled("normalize_text"))
        for worker in [*self._idle, *self._busy]:
            try:
                worker.process.kill()
            except (OSError, ValueError):
                pass
            worker.conn.close()
        self._idle.clear()
        self._busy.clear()
