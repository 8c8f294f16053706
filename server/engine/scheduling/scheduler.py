"""Admission and progress: which utterances run in the next step, and what a step changed.

Utterances join at step boundaries within `max_batch_size` items and `max_packed_tokens`
tokens, first come first served (`fifo`) or least slack first (`deadline`: urgent chunks block,
the rest fill, steps capped while urgent work runs, pausing and a hold while a due chunk
decodes; docs/architecture.md, "Scheduling by deadline"). `schedule()` says what runs,
`advance(step)` moves every stepped utterance on. It never touches a model.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic

from server.engine.scheduling import deadlines
from server.engine.scheduling.first_audio import FirstAudioAdmission
from server.engine.scheduling.headroom import Headroom, need
from server.engine.scheduling.hold_budget import HOLD_SHARE, HoldBudget
from server.engine.scheduling.output import ScheduledBatch
from server.engine.scheduling.schedulable import S
from server.engine.types import RequestRejected, SynthesisRequest


@dataclass(order=True)
class _Waiting(Generic[S]):
    key: tuple[int, int]
    utt: S = field(compare=False)


POLICIES = ("deadline", "fifo")
# With no urgent chunk, streams' later chunks still run in steps of at most this many times
# `urgent_step_tokens`: a new turn's first sentence waits for the step in flight.
AHEAD_STEP_FACTOR = 4
DECODE_HOLD_SLACK_S = 0.25  # while a due chunk decodes, chunks with more slack than this wait
DECODE_HOLD_MAX_S = 0.05  # a hold lasts at most this long, even if the decode's report is late


class Scheduler(Generic[S]):
    """Holds `Schedulable` chunks (the engine's `Utterance`s) and hands back the ones to step."""

    def __init__(self, max_batch_size: int, max_packed_tokens: int, policy: str = "fifo", frame_rate: int = 25,
                 horizon_s: float = deadlines.HORIZON_S, urgent_step_tokens: int | None = None,
                 hold_share: float = HOLD_SHARE, admission: bool = False, promise_s: float | None = None):
        if policy not in POLICIES:
            raise ValueError(f"scheduling must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.max_batch_size = max_batch_size
        self.max_packed_tokens = max_packed_tokens
        self.policy = policy
        self.frame_rate = frame_rate
        self.horizon_s = horizon_s
        self.urgent_step_tokens = urgent_step_tokens  # deadline: a step's size while urgent chunks run
        self.step_seconds = deadlines.DEFAULT_STEP_S  # a running average of measured steps
        self.paused_total = 0  # running chunks paused for urgent ones, ever
        self.waiting: list[_Waiting[S]] = []  # sorted by (request arrival, chunk index)
        self.running: list[S] = []
        self.awaited: dict[tuple[str, int], float] = {}  # due chunks being decoded: since when
        self.hold_budget = HoldBudget(DECODE_HOLD_MAX_S, hold_share)  # the share of time holds may idle
        self.headroom = Headroom(admission)  # what realtime promises leave free; refuses when clearly over
        # with the admission on, a new turn whose first audio would miss `promise_s` is refused
        self.first_audio = FirstAudioAdmission(promise_s if admission else None,
                                               urgent_step_tokens or max_packed_tokens)

    def fits_alone(self, packed_len: int) -> bool:
        return packed_len <= self.max_packed_tokens

    def refuse_if_too_big(self, chunk: int, packed_len: int) -> int:
        """A chunk over the whole budget could never run: refused at submission (`text`);
        else its packed length back."""
        if not self.fits_alone(packed_len):
            raise RequestRejected(
                f"text: chunk {chunk} needs {packed_len} packed tokens, over this server's budget of "
                f"{self.max_packed_tokens} (shorten the text or lower duration)", field="text")
        return packed_len

    def add(self, utt: S) -> None:
        bisect.insort(self.waiting, _Waiting(utt.key, utt))

    def observe_step(self, seconds: float, tokens: int = 0) -> None:
        """A step's measured time (and packed tokens): the seconds-per-step that slack is
        reckoned in, and the engine's speed that the headroom is reckoned against."""
        if seconds > 0:
            self.step_seconds += 0.2 * (seconds - self.step_seconds)
        self.headroom.observe_step(tokens, seconds)
        self.first_audio.cost.observe(tokens, seconds)

    def admit_realtime(self, request: SynthesisRequest, first_packed_len: int, now: float) -> None:
        """A new line or stream turn (a streamed request with no `due_at`: not a stream's later
        segment, not a whole file): refused (`busy`) when the engine could not serve its first
        chunk without breaking the deadlines it holds (`Headroom.admit`), or when its first audio
        would come after the promise (`FirstAudioAdmission.admit`, which then holds its place)."""
        if self.policy == "deadline" and request.stream != "whole" and request.due_at is None:
            self.headroom.admit(need(first_packed_len, request.options.num_step, 0.0))
            self.first_audio.admit(request.request_id, first_packed_len, request.options.num_step, now)

    @property
    def running_tokens(self) -> int:
        return sum(u.packed_len for u in self.running)

    @property
    def waiting_utts(self) -> list[S]:
        return [w.utt for w in self.waiting]

    def await_decode(self, utt: S, now: float) -> bool:
        """`utt` has taken its last step: when its audio is due already (deadline policy,
        streamed) and the hold budget has credit, hold chunks with slack to spare until it is
        `decoded`. True if held."""
        if self.policy != "deadline" or deadlines.is_whole(utt):
            return False
        if deadlines.due_at(utt, self.step_seconds, self.frame_rate) > now:
            return False
        if not self.hold_budget.start(now):
            return False
        self.awaited[(utt.request_id, utt.chunk_index)] = now
        return True

    def decoded(self, request_id: str, chunk_index: int, now: float | None = None) -> None:
        """The chunk's audio is out (or it failed): its hold ends."""
        self.awaited.pop((request_id, chunk_index), None)
        self._end_hold_if_idle(time.perf_counter() if now is None else now)

    def _end_hold_if_idle(self, now: float) -> None:
        if not self.awaited:
            self.hold_budget.end(now)

    def _holding(self, now: float) -> bool:
        """Whether chunks with slack wait this step: each awaited chunk for at most
        `DECODE_HOLD_MAX_S`, all of them only while the hold budget lasts."""
        out_of_credit = self.hold_budget.holding and self.hold_budget.left(now) <= 0
        for key, since in list(self.awaited.items()):
            if out_of_credit or now - since > DECODE_HOLD_MAX_S:
                del self.awaited[key]
        self._end_hold_if_idle(now)
        return bool(self.awaited)

    def schedule(self, now: float | None = None) -> ScheduledBatch[S]:
        """Admit by the policy; return the step's utterances and how many joined.

        `now` (perf_counter seconds) is the deadline policy's clock, read here when not given.
        """
        if self.policy == "fifo":
            return self._schedule_fifo()
        return self._schedule_deadline(time.perf_counter() if now is None else now)

    def _schedule_fifo(self) -> ScheduledBatch[S]:
        budget = self.max_packed_tokens - self.running_tokens
        admitted = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            head = self.waiting[0].utt
            if head.packed_len > budget:
                break
            self.waiting.pop(0)
            self.running.append(head)
            budget -= head.packed_len
            admitted += 1
        return ScheduledBatch(list(self.running), admitted)

    def _schedule_deadline(self, now: float) -> ScheduledBatch[S]:
        everyone = self.running + self.waiting_utts
        slack = {id(u): deadlines.slack(u, now, self.step_seconds, self.frame_rate) for u in everyone}
        tier = {id(u): deadlines.tier(u, slack[id(u)], self.horizon_s) for u in everyone}
        by_need = lambda u: (tier[id(u)], slack[id(u)])
        self.headroom.demand = sum(  # due - now = slack + the steps left
            need(u.packed_len, u.steps_left, slack[id(u)] + u.steps_left * self.step_seconds)
            for u in everyone if tier[id(u)] != deadlines.BATCH)
        reserved_ids = self.first_audio.reserved_ids()
        reserved = lambda u: u.chunk_index == 0 and u.request_id in reserved_ids
        self.first_audio.due_tokens = sum(  # streams' chunks due now (new turns' first chunks are reserved)
            u.packed_len for u in everyone if tier[id(u)] == deadlines.URGENT and not reserved(u))
        holding = self._holding(now)  # a due chunk decodes: only what cannot wait runs
        runs = lambda u: tier[id(u)] == deadlines.URGENT and not (holding and slack[id(u)] > DECODE_HOLD_SLACK_S)
        urgent = [u for u in self.running if runs(u)]  # not paused
        tokens = sum(u.packed_len for u in urgent)
        joined: list[_Waiting[S]] = []
        blocked = False
        waiting = sorted(self.waiting, key=lambda w: (*by_need(w.utt), w.key))  # urgent first, least slack
        # 1. urgent waiting chunks, least slack first, into the whole budget (the running
        #    non-urgent ones give way below); one that does not fit blocks the rest
        for entry in waiting:
            utt = entry.utt
            if not runs(utt):
                break
            if tokens + utt.packed_len > self.max_packed_tokens or len(urgent) >= self.max_batch_size:
                blocked = True
                break
            urgent.append(utt)
            tokens += utt.packed_len
            joined.append(entry)
        # 2. the rest fill up to the cap (a small step is a fast one), running chunks first
        ahead = any(t == deadlines.AHEAD for t in tier.values())
        cap = self._cap(tokens if urgent else 0, ahead)
        keep = urgent[:]
        paused: list[S] = []
        for utt in sorted((u for u in self.running if not runs(u)), key=by_need):
            if not holding and tokens + utt.packed_len <= cap and len(keep) < self.max_batch_size:
                keep.append(utt)
                tokens += utt.packed_len
            else:
                paused.append(utt)
        if not blocked and not holding:  # nothing overtakes an urgent chunk that cannot get in yet
            for entry in waiting:
                utt = entry.utt
                if tier[id(utt)] == deadlines.URGENT:
                    continue  # admitted above
                if tokens + utt.packed_len <= cap and len(keep) < self.max_batch_size:
                    keep.append(utt)
                    tokens += utt.packed_len
                    joined.append(entry)
        gone = {id(e) for e in joined}
        stays = {id(u) for u in keep}
        self.running = [u for u in self.running if id(u) in stays] + [e.utt for e in joined]
        self.waiting = [w for w in self.waiting if id(w) not in gone]
        for utt in paused:
            self.add(utt)
        self.paused_total += len(paused)
        return ScheduledBatch(list(self.running), len(joined))

    def _cap(self, urgent_tokens: int, ahead: bool) -> int:
        """Packed tokens this step may hold: while urgent chunks run, `urgent_step_tokens`
        (or the urgent chunks' own tokens, when more); while streams' later chunks are about,
        `AHEAD_STEP_FACTOR` times that (a first chunk arriving now waits for the step in
        flight); with only whole-file work, the whole budget."""
        if not self.urgent_step_tokens:
            return self.max_packed_tokens
        if urgent_tokens:
            return min(self.max_packed_tokens, max(self.urgent_step_tokens, urgent_tokens))
        if ahead:
            return min(self.max_packed_tokens, AHEAD_STEP_FACTOR * self.urgent_step_tokens)
        return self.max_packed_tokens

    def advance(self, stepped: Iterable[S]) -> list[S]:
        """Each utterance a step launched (`LaunchedStep.stepped`) moved one step on; retire and
        return those done."""
        done = []
        for utt in stepped:
            utt.advance()
            if utt.steps_left <= 0:
                done.append(utt)
                if utt.chunk_index == 0:
                    self.first_audio.release(utt.request_id)
        self.retire(done)
        return done

    def retire(self, utts: list[S]) -> None:
        gone = {id(u) for u in utts}
        self.running = [u for u in self.running if id(u) not in gone]
        self._forget_demand_if_idle()

    def _forget_demand_if_idle(self) -> None:
        if not self.running and not self.waiting:
            self.headroom.demand = 0.0  # nothing held: nothing promised (no schedule runs to say so)
            self.first_audio.due_tokens = 0

    def drop_request(self, request_id: str, now: float | None = None) -> None:
        """Remove every utterance of a request (cancel / failure)."""
        self.running = [u for u in self.running if u.request_id != request_id]
        self.waiting = [w for w in self.waiting if w.utt.request_id != request_id]
        self.awaited = {key: t for key, t in self.awaited.items() if key[0] != request_id}
        self.first_audio.release(request_id)
        self._forget_demand_if_idle()
        self._end_hold_if_idle(time.perf_counter() if now is None else now)

    def __len__(self) -> int:
        return len(self.running) + len(self.waiting)


class StepLog(deque):
    """The last N step records."""

    def __init__(self, maxlen: int = 4096):
        super().__init__(maxlen=maxlen)
