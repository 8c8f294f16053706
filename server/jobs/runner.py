"""Each server's job runner: claims items from the store and speaks each as a `Turn`, behind
interactive work.

An item is one turn, the same pipeline as every request (voice resolution, lexicon,
`normalize_text`, caps, the engine's plan), asked for as a whole file (`stream: "whole"`): the
deadline scheduler holds such work due its whole audio's length after it arrives and lets it
fill only what urgent chunks leave of a step, never blocking them (docs/architecture.md,
"Scheduling by deadline"), so a voice agent's next sentence goes first. At most
`--job-concurrency` items are in flight here, enough to keep the steps full, few enough that the
queue and the audio budget stay the interactive requests'.

Claims are leased (`--job-lease-seconds`) and renewed every few seconds while the items run; a
renewal that finds an item no longer this runner's (its job cancelled or failed, its lease taken
over) stops its turn. A chained job's first item keeps its first chunk's tokens as the job's
voice as soon as they are done, so the later items (claimable from then on, by any replica) take
that speaker. When the server drains or stops, the items in flight go back to the queue at once,
for another replica or the next start; a runner that dies leaves them to lapse.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field

import numpy as np

from server.engine.types import ChunkTokens, GenerationOptions
from server.jobs.results import chained_blob, chained_prompt, encode_whole
from server.jobs.store import STATUSES, Claim, ItemAudio, JobStore
from server.turns.events import TurnAudio, TurnEnd
from server.turns.request import TurnRequest
from server.turns.service import SynthesisService
from server.turns.turn import Turn

log = logging.getLogger("chorus.jobs")
ENDPOINT = "job"  # /metrics' endpoint label of job items
SWEEP_EVERY_S = 60.0
GAUGE_EVERY_S = 2.0
HOLD_BACK_S = 1.0  # after the server refused an item as busy: no claims this long


@dataclass(frozen=True)
class RunnerSettings:
    concurrency: int = 8  # --job-concurrency
    lease_seconds: float = 30.0  # --job-lease-seconds
    retention_seconds: float = 86_400.0  # --job-retention-hours
    poll_seconds: float = 1.0  # how often an idle runner looks for work (another replica's jobs)

    @property
    def heartbeat_seconds(self) -> float:
        """Leases are renewed this often: well inside a lease, and often enough that a job
        cancelled on another replica stops here soon."""
        return min(2.0, self.lease_seconds / 3)


@dataclass
class _Item:
    """One claimed item in flight here; `stopped` says why this runner ended it early."""

    claim: Claim
    turn: Turn | None = None
    stopped: str | None = None  # "lost" (cancelled, failed or taken over) | "released"
    task: asyncio.Task | None = field(default=None, repr=False)
    first_of_chain: bool = False  # its first tokens become its job's voice
    voice: asyncio.Task[bool] | None = field(default=None, repr=False)  # keeping that voice

    def stop(self, why: str) -> None:
        if self.stopped is None:
            self.stopped = why
            if self.turn is not None:
                self.turn.cancel()


class JobRunner:
    def __init__(self, service: SynthesisService, store: JobStore, settings: RunnerSettings):
        self.service = service
        self.store = store
        self.settings = settings
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._items: dict[tuple[str, int], _Item] = {}
        self._tasks: list[asyncio.Task] = []
        self._wake: asyncio.Event | None = None
        self._held_back_until = 0.0
        self._given_back = False

    # ---- the server's side -------------------------------------------------------------

    def start(self) -> JobRunner:
        self._wake = asyncio.Event()
        self._tasks = [asyncio.create_task(loop()) for loop in (self._claiming, self._renewing, self._housekeeping)]
        return self

    def wake(self) -> None:
        """Look for work now (a job was just submitted here, or an item ended)."""
        if self._wake is not None:
            self._wake.set()

    def cancel_job(self, job_id: str) -> None:
        """Stop this runner's items of a job just cancelled (other replicas find out as they renew)."""
        for item in list(self._items.values()):
            if item.claim.job == job_id:
                item.stop("lost")

    @property
    def in_flight(self) -> int:
        return len(self._items)

    async def stop(self, wait_s: float = 5.0) -> None:
        """Stop claiming, give the items in flight back to the queue, end their turns."""
        for task in self._tasks:
            task.cancel()
        await self.give_back()
        tasks = [item.task for item in self._items.values() if item.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=wait_s)
            for task in pending:
                task.cancel()

    async def give_back(self) -> None:
        """The items in flight back to the queue, their turns ended: on a drain, at once (another
        server, or this one's next start, makes them again); any claimed after are given back by
        the claiming loop, which stops once it sees the drain."""
        items = [item for item in self._items.values() if item.stopped is None]
        for item in items:
            item.stopped = "released"  # before the store hears of it: a turn that ends now writes nothing
        if items:
            try:
                await asyncio.to_thread(self.store.release, self.worker, [item.claim for item in items])
                log.info("job items given back to the queue", extra={"items": len(items)})
            except Exception:  # their leases lapse instead
                log.exception("giving job items back failed; their leases will lapse")
        for item in items:
            if item.turn is not None:
                item.turn.cancel()

    # ---- the loops ---------------------------------------------------------------------

    async def _claiming(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            if self.service.draining:  # no new work; what is in flight goes back to the queue
                await self.give_back()
                return
            free = self.settings.concurrency - len(self._items)
            if free > 0 and loop.time() >= self._held_back_until:
                try:
                    claims = await asyncio.to_thread(self.store.claim, self.worker, free, self.settings.lease_seconds)
                except Exception:  # the database is away: try again at the next poll
                    log.exception("claiming job items failed")
                    claims = []
                for claim in claims:
                    item = _Item(claim)
                    self._items[(claim.job, claim.n)] = item
                    item.task = asyncio.create_task(self._run(item))
            wait = self.settings.poll_seconds
            if self._held_back_until > loop.time():
                wait = min(wait, self._held_back_until - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.01, wait))
            except TimeoutError:
                pass

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            held = [item for item in self._items.values() if item.stopped is None]
            if not held:
                continue
            try:
                lost = await asyncio.to_thread(self.store.renew, self.worker, [item.claim for item in held],
                                               self.settings.lease_seconds)
            except Exception:  # the next renewal tries again, within the lease
                log.exception("renewing job leases failed")
                continue
            for claim in lost:
                if (item := self._items.get((claim.job, claim.n))) is not None:
                    log.info("job item no longer ours (cancelled, failed or taken over): stopped",
                             extra={"job": claim.job, "item": claim.n})
                    item.stop("lost")

    async def _housekeeping(self) -> None:
        metrics = self.service.metrics
        next_sweep = 0.0
        while True:
            try:
                if time.monotonic() >= next_sweep:  # at least four times a retention period
                    next_sweep = time.monotonic() + min(SWEEP_EVERY_S, self.settings.retention_seconds / 4)
                    if removed := await asyncio.to_thread(self.store.sweep, self.settings.retention_seconds):
                        log.info("finished jobs past their retention removed", extra={"jobs": removed})
                counts = await asyncio.to_thread(self.store.counts)
                for status in STATUSES:
                    metrics.jobs.labels(status).set(counts.get(status, 0))
            except Exception:  # the next round tries again
                log.exception("job housekeeping failed")
            await asyncio.sleep(GAUGE_EVERY_S)

    # ---- one item ----------------------------------------------------------------------

    async def _run(self, item: _Item) -> None:
        claim, work = item.claim, item.claim.work
        try:
            prompt = chained_prompt(claim.voice) if claim.voice is not None else None
            item.first_of_chain = claim.chained and prompt is None
            request = TurnRequest(
                request_id=f"{claim.job}/{claim.n}/{claim.attempt}", client_id=f"{claim.job}/{claim.n}",
                endpoint=ENDPOINT, text=work.text, owner=claim.owner, voice=None if prompt is not None else work.voice,
                prompt=prompt, instruct=work.instruct, language=work.language,
                options=GenerationOptions(**work.options), normalize=work.normalize, stream="whole", progress=False,
                received_at=time.perf_counter(), text_field="input",
                segment=0)  # its first audio is no listener's wait: /metrics' first-audio kinds leave it out
            item.turn = Turn(self.service, request,
                             on_first_tokens=(lambda event: self._keep_voice(item, event)) if item.first_of_chain
                             else None)
            if item.stopped is not None:
                return
            item.turn.start()
            audio: list[np.ndarray] = []
            rate, end = self.service.sample_rate, None
            async for event in item.turn.events():
                if isinstance(event, TurnAudio):
                    audio.append(event.audio)
                    rate = event.sample_rate
                elif isinstance(event, TurnEnd):
                    end = event
            assert end is not None
            await self._finish(item, end, np.concatenate(audio) if audio else np.zeros(0, np.float32), rate)
        except Exception as exc:  # a bug fails this item's job, not the runner
            log.exception("a job item failed", extra={"job": claim.job, "item": claim.n})
            await self._fail(claim, "internal", f"the server failed on this item ({type(exc).__name__})")
        finally:
            self._items.pop((claim.job, claim.n), None)
            self.wake()

    async def _finish(self, item: _Item, end: TurnEnd, audio: np.ndarray, rate: int) -> None:
        claim, metrics = item.claim, self.service.metrics
        extra = {"job": claim.job, "item": claim.n, "attempt": claim.attempt}
        if item.stopped is not None:  # ended here: the store already knows (or another runner has it)
            return
        if end.outcome == "done" and item.first_of_chain and not (item.voice is not None and await item.voice):
            if item.stopped is None:  # done, yet its voice never kept: the later items could never start
                await self._fail(claim, "internal", "the job's voice could not be kept from its first item")
            return
        if end.outcome == "done":
            data = await asyncio.to_thread(encode_whole, claim.work.format, audio, rate)
            seconds = round(audio.shape[-1] / rate, 3)
            try:
                done = await asyncio.to_thread(self.store.complete, self.worker, claim,
                                               ItemAudio(data, claim.work.format, seconds))
            except Exception:  # the database refused (gone, or a deadlock it broke): made again later
                log.exception("storing a job item failed; it goes back to the queue", extra=extra)
                await self._release(claim)
                return
            if done:
                metrics.job_items.labels("done").inc()
                metrics.job_audio_seconds.inc(seconds)
                log.info("job item done", extra={**extra, "audio_s": seconds})
            else:
                metrics.job_items.labels("dropped").inc()
                log.info("job item made but no longer ours: dropped", extra=extra)
        elif end.outcome == "cancelled" or end.code == "busy":  # the server stopping, or full for now
            await self._release(claim)
            if end.code == "busy":
                self._held_back_until = asyncio.get_running_loop().time() + HOLD_BACK_S
        else:
            await self._fail(claim, end.code or "internal", end.message or "the item failed")

    async def _release(self, claim: Claim) -> None:
        try:
            await asyncio.to_thread(self.store.release, self.worker, [claim])
            self.service.metrics.job_items.labels("released").inc()
        except Exception:  # its lease lapses instead
            log.exception("giving a job item back failed", extra={"job": claim.job, "item": claim.n})

    async def _fail(self, claim: Claim, code: str, message: str) -> None:
        try:
            if await asyncio.to_thread(self.store.fail, self.worker, claim, code, f"item {claim.n}: {message}"):
                self.service.metrics.job_items.labels("failed").inc()
                log.warning("job failed", extra={"job": claim.job, "item": claim.n, "code": code, "error": message})
        except Exception:  # the lease lapses, another run tries again
            log.exception("recording a job item's failure failed", extra={"job": claim.job, "item": claim.n})

    def _keep_voice(self, item: _Item, event: ChunkTokens) -> None:
        """A chained job's first item's first tokens: the job's voice, kept for its later items."""
        if event.chunk == 0 and item.stopped is None and item.voice is None:
            item.voice = asyncio.get_running_loop().create_task(self._store_voice(item, event))

    async def _store_voice(self, item: _Item, event: ChunkTokens) -> bool:
        """Keep the voice (the item completes only after this); else give the item back."""
        def keep() -> bool:
            blob = chained_blob(event.tokens, event.text, self.service.frame_rate)
            return self.store.keep_voice(self.worker, item.claim, blob)

        try:
            kept = await asyncio.to_thread(keep)
        except Exception:  # give the item back: its next run keeps the voice
            log.exception("keeping a job's voice failed", extra={"job": item.claim.job})
            kept = False
        if kept:
            self.wake()  # the later items may be claimed now
            return True
        # the job kept another run's voice (or the claim is gone): this run's speaker is not the
        # job's, so it is given back and made again in the job's voice
        item.stop("released")
        await self._release(item.claim)
        return False
