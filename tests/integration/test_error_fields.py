"""Every error with one field at fault names it in `field`, on the WebSocket and over HTTP, so
clients never parse messages; and the page's boot JSON carries the options table."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from server import options as table
from server.config import ServerConfig
from tests.support.chorus_client import Session

WS_CASES = [  # (fields of a synthesize frame, code, field): protocol, service and engine refusals
    ({"options": {"num_step": 0}}, "invalid_request", "options.num_step"),
    ({"options": {"num_steps": 8}}, "invalid_request", "options.num_steps"),
    ({"options": {"denoise": "yes"}}, "invalid_request", "options.denoise"),
    ({"options": {"seed": 2**70}}, "invalid_request", "options.seed"),
    ({"options": {"layer_penalty_factor": 1e38}}, "invalid_request", "options.layer_penalty_factor"),
    ({"text": "  "}, "invalid_request", "text"),
    ({"text": 5}, "invalid_request", "text"),
    ({"encoding": "mp3"}, "invalid_request", "encoding"),
    ({"speaker": "x"}, "invalid_request", "speaker"),
    ({"voice": "someone", "reference": {"audio": "AAAA", "text": "hi"}}, "invalid_request", "reference"),
    ({"reference": {"audio": "%%% not base64 %%%", "text": "hi"}}, "invalid_request", "reference.audio"),
    ({"instruct": "purple dragon voice"}, "invalid_request", "instruct"),
    ({"voice": "no-such-voice"}, "voice_not_found", "voice"),
]


def test_websocket_errors_carry_the_field(chorus_server):
    async def main():
        s = await Session.open(chorus_server.ws_url)
        try:
            for i, (fields, code, field) in enumerate(WS_CASES):
                rid = f"e{i}"
                await s.send({"type": "synthesize", "id": rid, "text": "Hello.", **fields})
                frame = await s.expect_error(code, rid)
                assert frame.get("field") == field, (fields, frame)
                assert frame["message"].startswith(field + ":"), frame
            # a protocol parse error without an id still names its field
            await s.send('{"type": "launch"}')
            frame = await s.expect_error("bad_message")
            assert frame["field"] == "type"
            # a duplicate id names `id`; the first request goes on (here: until cancelled)
            await s.synthesize("dup", "A longer line to keep in flight.", options={"num_step": 64, "duration": 20.0},
                               progress=False)
            await s.wait_for("dup", "accepted")
            await s.send({"type": "synthesize", "id": "dup", "text": "Again."})
            frame = await s.expect_error("duplicate_id", "dup")
            assert frame["field"] == "id"
            await s.send({"type": "cancel", "id": "dup"})
            assert (await s.collect(["dup"]))["dup"].end["type"] == "cancelled"
            # an error with no single field at fault has none
            await s.send("not json")
            frame = await s.expect_error("bad_message")
            assert "field" not in frame
        finally:
            await s.close()

    asyncio.run(main())


HTTP_CASES = [  # (body, status, code, field as the body spells it)
    ({"input": "hi", "num_step": 0}, 422, "invalid_request", "num_step"),
    ({"input": "hi", "position_temperature": 1e-40}, 422, "invalid_request", "position_temperature"),
    ({"input": "hi", "response_format": "ogg"}, 422, "invalid_request", "response_format"),
    ({"input": " "}, 422, "invalid_request", "input"),
    ({"input": "hi", "unknown_knob": 1}, 422, "invalid_request", "unknown_knob"),
    ({"input": "hi", "speed": 9}, 422, "invalid_request", "speed"),
    ({"input": "hi", "voice": "no-such-voice"}, 404, "voice_not_found", "voice"),
    ({"input": "x" * 6000}, 413, "text_too_long", "input"),
]


@pytest.mark.parametrize("body,status,code,field", HTTP_CASES)
def test_http_errors_carry_the_field(chorus_server, body, status, code, field):
    res = httpx.post(chorus_server.url + "/v1/audio/speech", json=body, timeout=60)
    assert res.status_code == status, res.text
    error = res.json()["error"]
    assert (error["code"], error.get("field")) == (code, field), error
    assert error["message"].startswith(field + ":"), error


def test_http_error_without_a_field_has_none(chorus_server):
    res = httpx.post(chorus_server.url + "/v1/audio/speech", content=b"not json", timeout=60)
    assert res.status_code == 400 and "field" not in res.json()["error"]


def _boot(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="chorus-boot">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


def test_the_page_boot_json_carries_the_options_table(chorus_server):
    boot = _boot(httpx.get(chorus_server.url + "/", timeout=60).text)
    assert boot["options"] == json.loads(json.dumps(table.table_json()))
    assert list(boot["options"]) == list(table.NAMES)
    assert boot["options"]["num_step"] == {"kind": "int", "default": 32, "min": 1, "max": 64, "nullable": False,
                                           "range": "1..64"}
    assert boot["limits"]["max_num_step"] == table.MAX_NUM_STEP
    assert boot["sample_rate"] == 24000  # the served model's, from its engine
    assert boot["page_defaults"] == {"first_chunk_seconds": 2.0}  # fast start on the demo page
    assert table.BY_NAME["first_chunk_seconds"].problem(2.0) is None


def test_every_derived_definition_agrees_with_the_table():
    from server.engine.types import GenerationOptions
    from server.wire import messages as p

    assert tuple(p.Options.__struct_fields__) == table.NAMES
    assert {n: getattr(p.Options(), n) for n in table.NAMES} == table.DEFAULTS
    assert {n: getattr(GenerationOptions(), n) for n in table.NAMES} == table.DEFAULTS
    assert p.generation_options(p.Options(num_step=7, seed=3)) == GenerationOptions(num_step=7, seed=3)
    assert ServerConfig().max_text_chars > 0  # page_context reads only what the config has
