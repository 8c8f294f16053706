"""Fast start on the demo page: long texts are sent with `options.first_chunk_seconds` (the
page's default from the boot JSON), short ones without; the server then makes a short first
chunk."""

from __future__ import annotations

import json

from browser_harness import LONG, SENTENCES, ChorusServer, generate, job_value, open_page, set_knobs
from playwright.sync_api import Page, expect


def test_long_texts_start_fast(page: Page, chorus_server: ChorusServer):
    sent: list[dict] = []
    received: list[dict] = []

    def watch(ws):
        ws.on("framesent", lambda payload: sent.append(json.loads(payload)) if isinstance(payload, str) else None)
        ws.on("framereceived", lambda payload: received.append(json.loads(payload))
              if isinstance(payload, str) else None)

    page.on("websocket", watch)
    open_page(page, chorus_server)
    boot = page.evaluate("window.chorus.boot")
    wanted = (boot.get("page_defaults") or {}).get("first_chunk_seconds", 2.0)
    set_knobs(page, num_step=8)
    expect(page.locator("#knob-first_chunk_seconds")).to_have_value(str(wanted).removesuffix(".0"))

    card, short_id = generate(page, "A short line.")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    short = next(m for m in sent if m.get("id") == short_id)
    assert "first_chunk_seconds" not in short["options"]

    card, long_id = generate(page, " ".join(SENTENCES * 4))
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    request = next(m for m in sent if m.get("id") == long_id)
    assert request["options"]["first_chunk_seconds"] == wanted
    assert job_value(page, long_id, "job.expectedChunks") >= 2
    # A short first chunk: the first sentence past the fast-start length, the rest after it.
    accepted = next(m for m in received if m.get("id") == long_id and m["type"] == "accepted")
    first, *rest = accepted["target_seconds"]
    assert first < wanted + 4 and all(first < later for later in rest), accepted
    assert job_value(page, long_id, "job.samples") > 0

    # Blank turns it off.
    page.fill("#knob-first_chunk_seconds", "")
    card, off_id = generate(page)
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    assert "first_chunk_seconds" not in next(m for m in sent if m.get("id") == off_id)["options"]
