"""Helpers for engine tests: a model of the tiny checkpoint, an event collector and the
reference's tokens."""

from __future__ import annotations

import copy
import threading
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from server.engine.types import ChunkAudio, ChunkTokens, Finished, Progress

GREEDY = dict(position_temperature=0.0, class_temperature=0.0)


_LOADED: dict[tuple[str, str, str], object] = {}
_LOADED_LOCK = threading.Lock()


def load_model(checkpoint, device: str = "cpu", dtype: str = "float32"):
    """A model of `checkpoint` of its own, as `server.checkpoint.load_omnivoice` loads it.

    Loaded once per process and copied for each caller: its modules, weights and settings are
    the caller's to change; the text tokenizer, which nothing changes, is shared (loading it,
    or copying it, parses its large JSON file again)."""
    from server.checkpoint import load_omnivoice

    key = (str(checkpoint), device, dtype)
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_omnivoice(*key)
        loaded = _LOADED[key]
    tokenizer = loaded.text_tokenizer
    return copy.deepcopy(loaded, {id(tokenizer): tokenizer})


def start_engine(model, *, around=None, observer=None, **settings):
    """A started `EngineLoop` on `model` with these `EngineSettings`. `around(backbone)`, when
    given, is the forward its steps run, made around the one the settings give (a fault to
    inject); `observer` watches it (`server.engine.runtime.observer`)."""
    from server.config import EngineSettings
    from server.engine.model.runner import backbone_for
    from server.engine.runtime.loop import EngineLoop

    settings = EngineSettings(**settings)
    backbone = None
    if around is not None:
        backbone = around(backbone_for(model, settings.attention, settings.quantize, settings.graph_max_tokens))
    engine = EngineLoop(model, settings, backbone=backbone, observer=observer)
    engine.start()
    return engine


@contextmanager
def running_engine(model, *, around=None, observer=None, **settings):
    """`start_engine(model, ...)` for the `with` block, stopped after it whatever happens."""
    engine = start_engine(model, around=around, observer=observer, **settings)
    try:
        yield engine
    finally:
        engine.stop()


def packed_len(engine, request) -> int:
    """The packed length of `request`'s first chunk on `engine`, as its budget check sees it."""
    from server.engine.planning.request import plan_request
    from server.engine.planning.utterances import packed_len_of
    from server.engine.work import RequestState

    plan = plan_request(engine.model, request, engine.frame_rate)
    state = RequestState(request=request, plan=plan, sink=None, seq=0, seed=0)
    return packed_len_of(engine.model, state, 0)


class Collector:
    """A thread-safe sink recording every event per request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: dict[str, list] = defaultdict(list)
        self.timeline: list = []  # every event, in arrival order
        self.finished: dict[str, Finished] = {}
        self._done = threading.Condition(self.lock)
        self.on_progress = None  # optional hook (event) -> None, called on the engine thread

    def __call__(self, event) -> None:
        with self.lock:
            self.events[event.request_id].append(event)
            self.timeline.append(event)
            if isinstance(event, Finished):
                self.finished[event.request_id] = event
                self._done.notify_all()
        if self.on_progress is not None and isinstance(event, Progress):
            self.on_progress(event)

    def wait(self, ids, timeout: float = 120.0) -> None:
        ids = set(ids)
        with self._done:
            ok = self._done.wait_for(lambda: ids <= self.finished.keys(), timeout=timeout)
        assert ok, f"not finished: {ids - self.finished.keys()}"

    def tokens(self, rid: str) -> list[np.ndarray]:
        chunks = {e.chunk: e.tokens for e in self.events[rid] if isinstance(e, ChunkTokens)}
        return [chunks[i] for i in sorted(chunks)]

    def audio(self, rid: str) -> list[np.ndarray]:
        return [e.audio for e in self.events[rid] if isinstance(e, ChunkAudio)]

    def outcome(self, rid: str) -> str:
        return self.finished[rid].outcome

    def start_order(self) -> list[str]:
        """Request ids in the order of their first progress event."""
        seen: list[str] = []
        for event in self.timeline:
            if isinstance(event, Progress) and event.request_id not in seen:
                seen.append(event.request_id)
        return seen

    def progress(self, rid: str) -> list[Progress]:
        return [e for e in self.events[rid] if isinstance(e, Progress)]


def reference_generate(model, text: str, **kwargs) -> tuple[list[np.ndarray], np.ndarray]:
    """Run the reference `generate()` alone; return its token chunks and its audio."""
    from bench.parity import captured_tokens

    with captured_tokens(model) as captured:
        audio = model.generate(text, **kwargs)[0]
    tokens = captured[0]
    chunks = tokens if isinstance(tokens, list) else [tokens]
    return [t.cpu().numpy() for t in chunks], audio
