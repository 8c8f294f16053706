"""The Dialogue tab against a real server: a two-speaker script in built-in voices goes out as one
`dialogue` frame, its audio frames arrive and play, the card marks line 1 then line 2 as they are
heard, and its WAV download is the audio received, read back by libsndfile; lines are added and
removed, and errors show beside the line they are about (the page's own and the server's), at
phone and desktop widths, with no console errors.

Waits are on conditions, never on elapsed time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import soundfile as sf
from browser_harness import LONG, ChorusServer, job_value, shot
from playwright.sync_api import Page, expect

LINES = ["Welcome to the show.", "Thanks for having me!"]


def open_dialogue(page: Page, server: ChorusServer, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(server.url + "/")
    expect(page.locator("#conn-status")).to_have_attribute("data-state", "open", timeout=LONG)
    page.click("#tab-dialogue")
    expect(page.locator("#dialogue-panel")).to_be_visible()
    expect(page.locator("#compose-panel")).to_be_hidden()
    # the voices from GET /v1/voices: the starter script's built-in voices are picked once listed
    voices = page.locator("#dialogue-lines select")
    expect(voices.nth(0)).to_have_value("alloy", timeout=LONG)
    expect(voices.nth(1)).to_have_value("echo")


def watch_frames(page: Page) -> dict:
    """The WebSocket's frames as the page sends and receives them."""
    seen: dict = {"sent": [], "audio": [], "text": []}

    def received(payload) -> None:
        if isinstance(payload, (bytes, bytearray)):
            (n,) = struct.unpack(">I", payload[:4])
            seen["audio"].append(json.loads(payload[4:4 + n]))
        else:
            seen["text"].append(json.loads(payload))

    def on_socket(ws) -> None:
        ws.on("framesent", lambda payload: seen["sent"].append(json.loads(payload))
              if isinstance(payload, str) else None)
        ws.on("framereceived", received)

    page.on("websocket", on_socket)
    return seen


def no_sideways_scroll(page: Page, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width, f"the page scrolls sideways at {width} px"
    for selector in ("#dialogue-play", "#dialogue-add", "#dialogue-lines select >> nth=0", "#dialogue-steps"):
        box = page.locator(selector).bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (width, selector, box)


@pytest.mark.parametrize("width", [375, 1280])
def test_two_line_dialogue_plays_marks_lines_and_downloads_a_wav(page: Page, chorus_server: ChorusServer,
                                                                 width: int):
    seen = watch_frames(page)
    open_dialogue(page, chorus_server, width)
    no_sideways_scroll(page, width)
    texts = page.locator("#dialogue-lines textarea")
    for k, text in enumerate(LINES):
        texts.nth(k).fill(text)
    page.fill("#dialogue-steps", "4")
    page.fill("#dialogue-pause", "250")
    # which line is heard, each change in order (watched from before the card exists)
    page.evaluate("""() => {
      window.__speaking = [];
      new MutationObserver((records) => {
        for (const r of records) window.__speaking.push(r.target.dataset.speaking);
      }).observe(document.getElementById("job-list"),
                 {subtree: true, attributes: true, attributeFilter: ["data-speaking"]});
    }""")
    cards = page.locator("li.job")
    before = cards.count()
    page.click("#dialogue-play")
    expect(cards).to_have_count(before + 1)
    job_id = cards.first.get_attribute("data-job-id")
    card = page.locator(f'li.job[data-job-id="{job_id}"]')
    expect(card).to_have_attribute("data-kind", "dialogue")
    expect(card.locator(".script-line")).to_have_count(2)
    expect(card.locator(".script-voice")).to_have_text(["Alloy", "Echo"])

    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    # heard in order: line 1, then (after the pause) line 2
    page.wait_for_function("window.__speaking.includes('1')", timeout=LONG)
    heard = [s for s in page.evaluate("window.__speaking") if s != "none"]
    assert heard[0] == "0" and "1" in heard and heard.index("1") > heard.index("0"), heard
    expect(card.locator('.script-line[data-line="1"]')).to_have_attribute("aria-current", "true")
    shot(page, f"dialogue-{width}")

    # one `dialogue` frame with both lines in their voices
    frame = next(m for m in seen["sent"] if m.get("id") == job_id)
    assert frame["type"] == "dialogue" and frame["pause_ms"] == 250 and frame["options"] == {"num_step": 4}
    assert [(line["voice"], line["text"]) for line in frame["lines"]] == [("alloy", LINES[0]), ("echo", LINES[1])]
    # its audio frames arrived (lines, the pause between them) and were played
    audio = [h for h in seen["audio"] if h["id"] == job_id]
    assert {h["line"] for h in audio if h["samples"]} == {0, 1, -1}, audio
    received = sum(h["samples"] for h in audio)
    assert [m["line"] for m in seen["text"] if m.get("id") == job_id and m["type"] == "line"] == [0, 1]
    stats = page.evaluate("(id) => window.chorusAudioStats.byJob[id]", job_id)
    assert stats["samples"] == received and stats["chunks"] >= 3, (stats, received)
    assert job_value(page, job_id, "job.samples") == received

    # the WAV is the dialogue's audio, decoded by an independent reader
    download_link = card.locator(".job-download")
    expect(download_link).to_be_visible()
    with page.expect_download(timeout=LONG) as info:
        download_link.click()
    assert info.value.suggested_filename.endswith(".wav")
    data, rate = sf.read(Path(info.value.path()), dtype="int16")
    assert rate == audio[0]["sample_rate"] == 24000
    assert data.ndim == 1 and len(data) == received
    pause = next(h for h in audio if h["line"] == -1)  # the pause is silence, where the frames put it
    start = pause["offset_samples"]
    assert pause["samples"] == 250 * 24 and not data[start:start + pause["samples"]].any()
    no_sideways_scroll(page, width)


def test_lines_are_added_removed_and_errors_show_beside_their_line(page: Page, chorus_server: ChorusServer):
    open_dialogue(page, chorus_server, 1280)
    lines = page.locator("#dialogue-lines > li")
    expect(lines).to_have_count(2)
    page.click("#dialogue-add")
    expect(lines).to_have_count(3)
    # a new line takes turns: the voice of the line two above it; the focus is in its text
    expect(lines.nth(2).locator("select")).to_have_value("alloy")
    expect(lines.nth(2).locator("textarea")).to_be_focused()
    select_id = lines.nth(2).locator("select").get_attribute("id")
    expect(page.locator(f"label[for={select_id}]")).to_have_text("Voice of line 3")

    # a line with nothing to say is refused here, beside it
    page.click("#dialogue-play")
    error = lines.nth(2).locator(".field-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Line 3 has nothing to say")
    expect(lines.nth(2).locator("textarea")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("li.job")).to_have_count(0)

    # removed: the others are numbered again
    page.click("button[aria-label='Remove line 2']")
    expect(lines).to_have_count(2)
    expect(lines.locator(".dialogue-line-n")).to_have_text(["1", "2"])
    expect(page.locator("button[aria-label='Remove line 2']")).to_be_enabled()

    # the server's error names the line's voice: shown beside that line and on the card
    lines.nth(1).locator("textarea").fill("Who am I?")
    lines.nth(1).locator("select").evaluate("""(select) => {
      select.append(new Option("Nobody", "nobody"));
      select.value = "nobody";
    }""")
    page.fill("#dialogue-steps", "2")
    page.click("#dialogue-play")
    card = page.locator("li.job").first
    expect(card).to_have_attribute("data-state", "error", timeout=LONG)
    expect(card.locator(".job-error")).to_contain_text("voice_not_found")
    line_error = lines.nth(1).locator(".field-error")
    expect(line_error).to_be_visible()
    expect(line_error).to_contain_text("no voice 'nobody'")
    expect(lines.nth(1).locator("select")).to_have_attribute("aria-invalid", "true")
    expect(lines.nth(0).locator(".field-error")).to_be_hidden()

    # the page's own range checks, beside their control
    page.fill("#dialogue-pause", "20000")
    page.click("#dialogue-play")
    expect(page.locator("#dialogue-pause-error")).to_contain_text("0 to 10000")
    expect(page.locator("#dialogue-pause")).to_have_attribute("aria-invalid", "true")


def test_tabs_follow_the_keyboard_and_the_address(page: Page, chorus_server: ChorusServer):
    page.goto(chorus_server.url + "/#dialogue")
    expect(page.locator("#dialogue-panel")).to_be_visible()
    expect(page.locator("#tab-dialogue")).to_have_attribute("aria-selected", "true")
    page.focus("#tab-dialogue")
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#tab-speak")).to_be_focused()
    expect(page.locator("#compose-panel")).to_be_visible()
    expect(page.locator("#dialogue-panel")).to_be_hidden()
    assert page.evaluate("location.hash") == ""
    page.keyboard.press("End")
    expect(page.locator('[role="tab"][aria-selected="true"]')).to_be_focused()
    assert page.evaluate("location.hash") != ""
