"""Live mode in a real Chromium against a real `chorus serve`: text typed (or pasted) is
streamed to the server as it comes, heard sentence by sentence, the sentence being heard
highlighted. Waits are on conditions, never on elapsed time."""

from __future__ import annotations

import json

from browser_harness import LONG, ChorusServer, open_page, set_knobs, shot
from playwright.sync_api import Page, expect

TYPED = "The first sentence is here. And a second one follows it. "


def watch_live(page: Page, sent: list[dict]) -> None:
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))
                                          if isinstance(payload, str) else None))
    page.add_init_script(
        """window.__highlighted = [];
        new MutationObserver((records) => {
          for (const r of records) {
            const span = r.target;
            if (span.classList && span.classList.contains("live-segment") && span.classList.contains("speaking"))
              window.__highlighted.push([Number(span.dataset.segment), span.textContent.trim()]);
          }
        }).observe(document, { subtree: true, attributes: true, attributeFilter: ["class"] });"""
    )


def open_live_mode(page: Page, server: ChorusServer) -> list[dict]:
    """The page in live mode (8 steps); returns the list that collects every frame it sends."""
    sent: list[dict] = []
    watch_live(page, sent)
    open_page(page, server)
    set_knobs(page, num_step=8)
    page.click("label[for=mode-live]")
    return sent


def test_typing_in_live_mode_is_heard_sentence_by_sentence(page: Page, chorus_server: ChorusServer):
    sent = open_live_mode(page, chorus_server)
    expect(page.locator("#live-field")).to_be_visible()
    expect(page.locator("#generate")).to_be_hidden()
    page.click("#live-start")
    field = page.locator("#live-field")
    expect(field).to_have_attribute("data-live", "open", timeout=LONG)
    page.locator("#live-text").press_sequentially(TYPED, delay=15)

    # Both sentences are spoken (a `segment` frame each) and one is highlighted while heard.
    segments = page.locator(".live-segment:not(.pending)")
    expect(segments).to_have_count(2, timeout=LONG)
    expect(segments.nth(0)).to_contain_text("The first sentence is here.")
    expect(segments.nth(1)).to_contain_text("And a second one follows it.")
    page.wait_for_function("window.__highlighted.length > 0", timeout=LONG)
    shot(page, "19-live-mode")
    page.click("#live-stop")
    expect(field).to_have_attribute("data-live", "off", timeout=LONG)
    expect(page.locator("#live-state")).to_have_text("Finished")

    highlighted = page.evaluate("window.__highlighted")
    spoken = {0: "The first sentence is here.", 1: "And a second one follows it."}
    assert all(spoken[k] in text for k, text in highlighted if k in spoken), highlighted
    live_id = next(m["id"] for m in sent if m["type"] == "stream_open")
    stats = page.evaluate("(id) => window.chorusAudioStats.byJob[id]", live_id)
    assert stats["samples"] > 0

    # What went over the wire: one open, the typed text in pieces, then close.
    kinds = [m["type"] for m in sent if m.get("id") == live_id]
    assert kinds[0] == "stream_open" and kinds[-1] == "stream_close", kinds
    assert kinds.count("stream_append") >= 2, "text was not sent as it was typed"
    opened = next(m for m in sent if m["type"] == "stream_open")
    appended = [m["text"] for m in sent if m["type"] == "stream_append" and m["id"] == live_id]
    typed = opened.get("text", "") + "".join(appended)
    assert typed == TYPED


def test_pasted_text_is_fed_at_a_reading_pace(page: Page, chorus_server: ChorusServer):
    sent = open_live_mode(page, chorus_server)
    page.click("#live-start")
    expect(page.locator("#live-field")).to_have_attribute("data-live", "open", timeout=LONG)
    pasted = "Pasted text arrives word by word. It is spoken as each sentence ends."
    page.locator("#live-text").evaluate(
        """(box, text) => { window.__lengths = [];
                           box.addEventListener("input", () => window.__lengths.push(box.value.length));
                           const data = new DataTransfer(); data.setData("text/plain", text);
                           box.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true,
                                                                          cancelable: true })); }""",
        pasted,
    )
    expect(page.locator("#live-text")).to_have_value(pasted, timeout=LONG)
    # Not all at once: the box grew word by word.
    lengths = page.evaluate("window.__lengths")
    assert len(lengths) == len(pasted.split()) and lengths == sorted(lengths), lengths
    expect(page.locator(".live-segment:not(.pending)")).to_have_count(2, timeout=LONG)
    page.click("#live-stop")
    expect(page.locator("#live-field")).to_have_attribute("data-live", "off", timeout=LONG)
    appends = [m["text"] for m in sent if m["type"] == "stream_append"]
    assert len(appends) >= 3 and "".join(appends) == pasted
