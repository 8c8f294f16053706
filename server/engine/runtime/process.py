"""One engine in its own process, behind the engine API (`--engine-processes`).

Each GPU's `EngineLoop` runs in a spawned child, so step threads do not share one interpreter
lock. The wire is a pipe of the Structs in `process_wire.py`: parent -> child `SubmitCall`,
`CancelRequest`, `EncodeCall`, `StatsCall`, `Stop`; child -> parent `Ready` or `StartFailed`
once, then `Reply` or `Refused` per call and `Event` per engine event. A child that dies fails
its own requests, fails waiting calls with `busy`, and is restarted.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from server.config import EngineSettings
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.process_wire import (
    CancelRequest,
    EncodeCall,
    Event,
    FromChild,
    Ready,
    Refused,
    Reply,
    Snapshot,
    StartFailed,
    StatsCall,
    Stop,
    SubmitCall,
    ToChild,
)
from server.engine.scheduling.output import StepRecord
from server.engine.types import (
    Accepted,
    EngineEvent,
    EngineStats,
    EventSink,
    Finished,
    RequestRejected,
    SynthesisRequest,
    VoicePrompt,
)

log = logging.getLogger("chorus.engine")
CALL_TIMEOUT_S = 60.0
DIED = "the engine process died; this request was lost with it"


def _child_main(conn, model_path: str, settings: EngineSettings, name: str, asr_model: str | None) -> None:
    """The child: load the engine, then serve the parent's commands until `stop` or EOF."""
    logging.basicConfig(level="WARNING", format=f"%(asctime)s %(levelname)s {name}: %(message)s")
    send_lock = threading.Lock()

    def send(message: FromChild) -> None:
        with send_lock:
            conn.send(message)

    try:
        engine = EngineLoop.load(model_path, settings, name)
        if asr_model:
            engine.model.load_asr_model(asr_model)
        engine.start()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        send(StartFailed(f"{type(exc).__name__}: {exc}"))
        return
    send(Ready(engine.sample_rate, engine.frame_rate, engine.model_name, engine.is_random_checkpoint))
    sink = lambda event: send(Event(event))  # called on the engine thread

    def reply_when_done(call: int, future: Future) -> None:
        def done(f: Future) -> None:
            try:
                send(Reply(call, f.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                send(Refused(call, exc))
        future.add_done_callback(done)

    try:
        while True:
            try:
                message: ToChild = conn.recv()
            except EOFError:
                return
            if isinstance(message, Stop):
                return
            if isinstance(message, CancelRequest):
                engine.cancel(message.request_id)
            elif isinstance(message, SubmitCall):
                try:
                    send(Reply(message.call, engine.submit(message.request, sink)))
                except Exception as exc:  # noqa: BLE001 - RequestRejected, or a bug: the caller's
                    send(Refused(message.call, exc))
            elif isinstance(message, EncodeCall):
                reply_when_done(message.call, engine.encode_voice(message.audio, message.sample_rate, message.text))
            elif isinstance(message, StatsCall):
                send(Reply(message.call, Snapshot(engine.stats(), list(engine.step_log)[-256:])))
    finally:
        engine.stop()


class EngineProcess:
    """The parent's handle on one engine process; same API as `EngineLoop`."""

    def __init__(self, model_path: str, settings: EngineSettings, name: str = "engine0",
                 asr_model: str | None = None):
        self.model_path, self.settings, self.name, self.asr_model = model_path, settings, name, asr_model
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA state
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._calls: dict[int, Future] = {}
        self._sinks: dict[str, EventSink] = {}
        self._ids = itertools.count()
        self._stopping = False
        self.restarts = 0
        self.ready = False
        self.step_log: list[StepRecord] = []
        self._last_stats: EngineStats | None = None
        self._spawn()

    # ---- the child's life -------------------------------------------------------------

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=_child_main, name=f"chorus-{self.name}", daemon=True,
                                      args=(child, self.model_path, self.settings, self.name, self.asr_model))
        self.proc.start()
        child.close()
        try:
            started: FromChild = parent.recv()
        except EOFError:
            started = StartFailed(f"exit code {self.proc.join(5) or self.proc.exitcode}")
        if not isinstance(started, Ready):
            reason = started.reason if isinstance(started, StartFailed) else repr(started)
            raise RuntimeError(f"{self.name}: the engine process did not start ({reason})")
        self.sample_rate, self.frame_rate = started.sample_rate, started.frame_rate
        self.model_name, self.is_random_checkpoint = started.model_name, started.random_checkpoint
        self._conn = parent
        self._reader = threading.Thread(target=self._read, args=(parent,), name=f"chorus-{self.name}-reader",
                                        daemon=True)
        self._reader.start()
        self.ready = True

    def _read(self, conn) -> None:
        while True:
            try:
                message: FromChild = conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Event):
                self._deliver(message.event)
            elif isinstance(message, (Reply, Refused)):
                with self._lock:
                    future = self._calls.pop(message.call, None)
                if future is None:
                    continue
                if isinstance(message, Reply):
                    future.set_result(message.value)
                else:
                    future.set_exception(message.error)
        if not self._stopping:
            self._child_died()

    def _deliver(self, event: EngineEvent) -> None:
        with self._lock:
            sink = self._sinks.get(event.request_id)
            if isinstance(event, Finished):
                self._sinks.pop(event.request_id, None)
        if sink is not None:
            try:
                sink(event)
            except Exception:  # a consumer's bug must not stop the reader
                log.exception("%s: event sink failed", self.name)

    def _child_died(self) -> None:
        """Fail what the dead child held, then start a new one (the other engines go on)."""
        self.ready = False
        self.proc.join(1)
        log.error("%s: the engine process died (exit code %s); restarting it", self.name, self.proc.exitcode)
        with self._lock:
            calls, self._calls = self._calls, {}
            sinks, self._sinks = self._sinks, {}
        for future in calls.values():
            future.set_exception(RequestRejected("the engine restarted; try again", code="busy"))
        for request_id, sink in sinks.items():
            try:
                sink(Finished(request_id, "error", DIED))
            except Exception:
                log.exception("%s: event sink failed", self.name)
        while not self._stopping:
            try:
                self._spawn()
                self.restarts += 1
                return
            except Exception:  # keep trying, but not in a tight loop
                log.exception("%s: restarting the engine process failed", self.name)
                time.sleep(5.0)

    def _call(self, make: Callable[[int], ToChild]) -> Future:
        """Send `make(call)` (a call numbered here) and return the future of its reply."""
        future: Future = Future()
        call = next(self._ids)
        with self._lock:
            self._calls[call] = future
        try:
            self._send(make(call))
        except OSError:
            with self._lock:
                self._calls.pop(call, None)
            future.set_exception(RequestRejected("the engine is restarting; try again", code="busy"))
        return future

    def _send(self, message: ToChild) -> None:
        with self._send_lock:
            self._conn.send(message)

    # ---- the engine API ---------------------------------------------------------------

    def start(self) -> None:
        """The child starts its engine as soon as it has loaded it."""

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.ready = False
        try:
            self._send(Stop())
        except OSError:
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)

    def submit(self, request: SynthesisRequest, sink: EventSink,
               admit: Callable[[float], None] | None = None) -> Accepted:
        """As `EngineLoop.submit`; `admit` runs here once the child has planned and queued
        the request (it cannot cross the pipe): a refusal cancels it there, unseen."""
        with self._lock:  # events may come before the reply: the sink is in place first
            if request.request_id in self._sinks:
                raise RequestRejected(f"id: {request.request_id!r} is already in flight", field="id",
                                      code="duplicate_id")
            self._sinks[request.request_id] = sink
        try:
            accepted = self._call(lambda call: SubmitCall(call, request)).result(CALL_TIMEOUT_S)
            if admit is not None:
                try:
                    admit(sum(accepted.target_seconds))
                except BaseException:
                    self.cancel(request.request_id)
                    raise
            return accepted
        except BaseException:
            with self._lock:
                self._sinks.pop(request.request_id, None)
            raise

    def cancel(self, request_id: str) -> None:
        try:
            self._send(CancelRequest(request_id))
        except OSError:
            pass  # the child is gone: its requests end with error

    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> Future[VoicePrompt]:
        return self._call(lambda call: EncodeCall(call, audio, sample_rate, text))

    def stats(self) -> EngineStats:
        """The child's stats (and its recent steps, for the metrics); while it restarts, the
        last ones it sent."""
        try:
            snapshot: Snapshot = self._call(StatsCall).result(CALL_TIMEOUT_S)
            self._last_stats, self.step_log = snapshot.stats, snapshot.steps
        except RequestRejected:
            if self._last_stats is None:
                raise
        return self._last_stats
