"""Keeping a result's voice on the page, against a real server: the result names the kept
voice, *Use this voice* picks it, and the next request speaks with it."""

from __future__ import annotations

import json

from browser_harness import LONG, ChorusServer, generate, open_page, set_knobs, shot
from playwright.sync_api import Page, expect


def test_a_kept_voice_is_named_on_the_result_and_used_next(page: Page, chorus_server: ChorusServer):
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))
                                          if isinstance(payload, str) else None))
    open_page(page, chorus_server)
    set_knobs(page, num_step=8)
    expect(page.locator("#keep-voice-row")).to_be_visible()
    page.check("#keep-voice")
    card, job_id = generate(page, "Keep the voice of this one.")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    kept = card.locator(".job-kept")
    expect(kept).to_be_visible()
    voice_id = card.locator(".job-kept-id").text_content()
    assert voice_id.startswith("kept-")
    assert next(m for m in sent if m.get("id") == job_id)["keep_voice"] is True
    shot(page, "22-kept-voice")

    kept.get_by_role("button", name="Use this voice").click()
    expect(page.locator(f"#voice-opt-{voice_id}")).to_be_checked()
    expect(page.locator(f'.voice-item[data-voice-id="{voice_id}"]')).to_contain_text("kept until")
    expect(page.locator("#keep-voice-row")).to_be_hidden()  # a picked voice is already one voice
    second, second_id = generate(page, "And this one speaks with it.")
    expect(second).to_have_attribute("data-state", "done", timeout=LONG)
    frame = next(m for m in sent if m.get("id") == second_id)
    assert frame["voice"] == voice_id and "keep_voice" not in frame
