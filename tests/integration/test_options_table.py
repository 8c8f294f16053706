"""Each knob's bounds: the value just inside is accepted, just outside refused with
`invalid_request` and the field, at every entry point (WebSocket frame, HTTP body, engine);
the extremes inside the ranges run to the end with finite audio; docs agree with the table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from server import options as table
from server.engine.planning.request import validate_options
from server.engine.types import GenerationOptions, RequestRejected
from server.wire import messages as p
from server.wire.speech_body import parse_speech_request
from tests.support.chorus_client import Session

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _edges(knob: table.Knob) -> tuple[list, list]:
    """(just inside, just outside) values of a knob's range."""
    if knob.kind == "seed":
        return [table.SEED_MIN, table.SEED_MAX], [table.SEED_MIN - 1, table.SEED_MAX + 1]
    if knob.kind == "int":
        return [int(knob.low), int(knob.high)], [int(knob.low) - 1, int(knob.high) + 1]
    eps = 1e-6 * max(1.0, abs(knob.high))
    inside = [float(knob.low), float(knob.high)] + ([0.0] if knob.zero_off else [])
    outside = [knob.high + eps, knob.low - min(eps, knob.low / 10 if knob.low > 0 else eps)]
    if knob.zero_off:
        outside.append(-knob.low)
    return inside, outside


# The values the adversarial run found accepted (and then poisoning a step, overflowing the
# plan or asking for hours of audio), all refused now.
REPORTED = [("layer_penalty_factor", 1e38), ("position_temperature", 1e-40), ("class_temperature", 1e-40),
            ("t_shift", 1e-300), ("duration", 7.2e306), ("duration", 5561.0 * 10), ("chunk_threshold", 1e308),
            ("chunk_seconds", 1e308), ("chunk_seconds", 1e-300)]
NUMERIC = [k for k in table.KNOBS if k.kind != "bool"]
CASES = [(k.name, v, True) for k in NUMERIC for v in _edges(k)[0]] + \
        [(k.name, v, False) for k in NUMERIC for v in _edges(k)[1]] + [(n, v, False) for n, v in REPORTED]


@pytest.mark.parametrize("name,value,ok", CASES, ids=[f"{n}={v!r}" for n, v, _ in CASES])
def test_bounds_at_every_entry_point(name, value, ok):
    frame = json.dumps({"type": "synthesize", "id": "b", "text": "Hi.", "options": {name: value}})
    body = json.dumps({"input": "Hi.", name: value}).encode()
    if ok:
        assert getattr(p.parse_client_message(frame).options, name) == value
        assert getattr(parse_speech_request(body), name) == value
        validate_options(GenerationOptions(**{name: value}))
        return
    with pytest.raises(p.ProtocolError) as ws:
        p.parse_client_message(frame)
    assert (ws.value.code, ws.value.field, ws.value.request_id) == ("invalid_request", f"options.{name}", "b")
    with pytest.raises(p.ProtocolError) as http:
        parse_speech_request(body)
    assert (http.value.code, http.value.field) == ("invalid_request", name)
    with pytest.raises(RequestRejected) as engine:
        validate_options(GenerationOptions(**{name: value}))
    assert (engine.value.code, engine.value.field) == ("invalid_request", f"options.{name}")


def test_reported_values_are_refused_by_a_real_server(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        try:
            for i, (name, value) in enumerate(REPORTED):
                await s.send({"type": "synthesize", "id": f"r{i}", "text": "Hi.", "options": {name: value}})
                frame = await s.expect_error("invalid_request", f"r{i}")
                assert frame["field"] == f"options.{name}", frame
        finally:
            await s.close()

    asyncio.run(main())


def test_the_extremes_inside_the_ranges_run_to_the_end(chorus_server):
    """The corners of the ranges a step's arithmetic must survive, each in one request,
    all sharing steps: every one ends `done` with finite audio."""
    corners = [
        {"layer_penalty_factor": 10_000.0, "position_temperature": 0.001},
        {"class_temperature": 0.001, "position_temperature": 10_000.0, "guidance_scale": 10.0},
        {"t_shift": 0.001, "class_temperature": 10_000.0},
        {"t_shift": 1.0, "guidance_scale": 0.0, "layer_penalty_factor": 0.0},
        {"duration": 0.1}, {"speed": 4.0}, {"speed": 0.25, "chunk_threshold": 0, "chunk_seconds": 1.0},
    ]

    async def main():
        s = await Session.open(chorus_server.ws_url)
        try:
            for i, opts in enumerate(corners):
                await s.synthesize(f"c{i}", "Hello there, one two.", encoding="f32le", progress=False,
                                   options={"num_step": 4, **opts})
            return await s.collect()
        finally:
            await s.close()

    for rid, outcome in asyncio.run(main()).items():
        assert outcome.end["type"] == "done", (rid, outcome.end)
        assert outcome.samples.size > 0 and np.isfinite(outcome.samples).all(), rid


def test_docs_list_every_option_with_its_range():
    text = DOCS.read_text()
    for knob in table.KNOBS:
        default = "null" if knob.default is None else json.dumps(knob.default)
        row = f"| `{knob.name}` | {default} | "
        assert row in text, row
        line = text[text.index(row):].splitlines()[0]
        assert knob.range_text in line, line
