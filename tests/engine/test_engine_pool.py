"""Several engines behind one API: least-outstanding-work routing, cancels follow."""

from __future__ import annotations

import pytest

from server.config import EngineSettings
from server.engine.runtime.loop import EngineLoop
from server.engine.runtime.pool import EnginePool, expand_devices
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest
from tests.support.engine_helpers import Collector


@pytest.fixture(scope="module")
def pool(tiny_checkpoint):
    from tests.support.engine_helpers import load_model

    engines = [EngineLoop(load_model(tiny_checkpoint), EngineSettings(), f"engine{i}")
               for i in range(2)]
    p = EnginePool(engines)
    p.start()
    yield p
    p.stop()


def test_expand_devices():
    assert expand_devices("cpu") == ["cpu"]
    assert expand_devices("cuda:1") == ["cuda:1"]
    assert expand_devices("cuda:0,2") == ["cuda:0", "cuda:2"]


def test_requests_spread_over_engines_and_all_finish(pool):
    c = Collector()
    ids = [f"p{i}" for i in range(6)]
    for rid in ids:
        pool.submit(SynthesisRequest(rid, "Spread me over the engines.", options=GenerationOptions(num_step=6)), c)
    c.wait(ids)
    assert all(c.outcome(rid) == "done" for rid in ids)
    steps = [e.stats().steps_total for e in pool.engines]
    assert all(n > 0 for n in steps)  # both engines worked
    assert pool._work == [0, 0] and not pool._owner  # all released


def test_cancel_follows_the_request_and_ids_stay_unique(pool):
    c = Collector()
    pool.submit(SynthesisRequest("long", "A long one to cancel.", options=GenerationOptions(num_step=64)), c)
    with pytest.raises(RequestRejected) as info:
        pool.submit(SynthesisRequest("long", "again"), c)
    assert info.value.code == "duplicate_id"
    pool.cancel("long")
    c.wait(["long"])
    assert c.outcome("long") == "cancelled"
