"""`bench/timeline.py` on a CPU engine: every segment of a first chunk is measured, they add up
to the request's submit-to-audio time, and the engine runs as before once it is detached."""

from __future__ import annotations

import pytest

from bench import timeline
from bench.observers import Switchboard
from tests.support.engine_helpers import Collector, start_engine


@pytest.fixture(scope="module")
def engine(model):
    """A CPU engine made as the bench makes its own: watched through a `Switchboard`."""
    eng = start_engine(model, observer=Switchboard())
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def result(engine):
    return timeline.run(engine, runs=2, warmup=1, seconds=2.0, long_seconds=12.0, first_chunk_seconds=1.0)


def test_each_case_measures_every_segment(result):
    assert set(result) == {"lone_line", "long_default", "long_fast_start"}
    for case in result.values():
        assert len(case["runs"]) == 2
        for row in case["runs"]:
            for name in timeline.SEGMENTS:
                assert row[name] >= 0.0, (name, row)
            assert row["launches"] == 32  # the first chunk's steps alone, the reference's default
            assert sum(row[name] for name in timeline.SEGMENTS) == pytest.approx(row["total"], abs=0.05)
            assert row["steps"] > 0 and row["decode"] > 0 and row["post"] > 0
            # a thread's CPU time within a segment never exceeds the segment's wall time
            for name in ("plan", "post"):
                assert 0.0 < row[f"{name}_cpu"] <= row[name] + 0.05, (name, row)


def test_engine_is_restored(engine, result):
    from server.engine.types import SynthesisRequest

    assert engine.observer.attached == ()  # the timeline detached itself
    for obj in (engine, engine.runner, engine.codec, engine.finisher):  # and never patched a thing
        assert not {"_admit", "_complete_chunk", "run", "decode", "replay", "_post"} & set(vars(obj)), obj
    sink = Collector()
    engine.submit(SynthesisRequest("after-timeline", "Still speaking after the timeline."), sink)
    sink.wait(["after-timeline"])
    assert sink.outcome("after-timeline") == "done"
