"""The demo page in a real headless Chromium against a real `chorus serve` (tiny random checkpoint).

Waits are on conditions (Playwright's auto-waiting `expect`), never on elapsed time.
Screenshots of the main states are written to `e2e/artifacts/`.
"""

from __future__ import annotations

import re
import wave
from itertools import pairwise
from pathlib import Path

import pytest
from browser_harness import (
    LONG,
    SENTENCES,
    ChorusServer,
    events,
    expect_knob_error,
    generate,
    job_value,
    make_wav,
    open_page,
    record_job_events,
    run_job,
    set_knobs,
    shot,
)
from playwright.sync_api import Page, expect

# ---------------------------------------------------------------------------------------------


def test_page_loads_without_errors_and_is_accessible(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    expect(page).to_have_title(re.compile("Chorus"))
    notice = page.locator("#demo-notice")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("its audio is noise")
    ready = page.evaluate("window.chorus.connection.ready")
    assert ready["protocol"] == 1
    limit = ready["limits"]["max_text_chars"]
    expect(page.locator("#char-count")).to_contain_text(f"/ {limit:,}")
    expect(page.locator("#model-name")).to_have_text(ready["model"])

    # Every control has an accessible name.
    unlabeled = page.evaluate(
        """() => [...document.querySelectorAll("input, select, textarea, button, summary, a[href]")]
          .filter((el) => !el.closest("template") && el.getAttribute("type") !== "hidden")
          .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute("aria-label")
                          && !el.getAttribute("aria-labelledby") && !el.textContent.trim())
          .map((el) => el.outerHTML.slice(0, 80))"""
    )
    assert unlabeled == []

    # Keyboard: a skip link first, then the controls in reading order, with a visible focus ring.
    page.locator("body").focus()
    order = []
    for _ in range(12):
        page.keyboard.press("Tab")
        order.append(page.evaluate(
            "document.activeElement.id || document.activeElement.className || document.activeElement.tagName"))
        if order[-1] == "generate":
            break
    assert order[0] == "skip-link"
    wanted = ["text", "mode-auto", "language", "generate"]
    assert [x for x in order if x in wanted] == wanted, order
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    shot(page, "01-page-desktop")

    # Design-voice and advanced panels open; the instruct is composed from the pickers.
    page.click("label[for=mode-design]")
    page.select_option("#design-gender", "female")
    page.select_option("#design-pitch", "low pitch")
    page.select_option("#design-accent", "british accent")
    expect(page.locator("#instruct-preview")).to_have_text("female, low pitch, british accent")
    page.click("#advanced > summary")
    expect(page.locator("#knob-num_step")).to_have_value("32")
    expect(page.locator("#knob-num_step-hint")).to_contain_text("1–64")
    shot(page, "02-design-and-advanced")

    # Phone width: one column, nothing wider than the screen.
    page.set_viewport_size({"width": 375, "height": 812})
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    shot(page, "03-page-phone")
    page.emulate_media(color_scheme="dark")
    shot(page, "04-page-phone-dark")


def test_generate_streams_plays_and_downloads(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    record_job_events(page)
    # Several text chunks, so audio streams in more than one frame.
    set_knobs(page, chunk_threshold=0, chunk_seconds=2)
    card, job_id = generate(page, " ".join(SENTENCES))

    expect(card.locator(".job-state")).to_have_text(re.compile("Streaming|Done"), timeout=LONG)
    stats = page.evaluate("(id) => window.chorusAudioStats.byJob[id]", job_id)
    assert stats["samples"] > 0, "the audio graph received no samples"
    shot(page, "05-generating")

    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    log = [e for e in events(page) if e[0] == job_id]
    progress = [value for _, kind, value in log if kind == "progress"]
    assert any(0 < v < 100 for v in progress), f"the bar never showed partial progress: {progress}"
    assert progress == sorted(progress) and progress[-1] == 100
    states = [value for _, kind, value in log if kind == "state"]
    assert states.index("streaming") < states.index("done"), states

    # Playback: every chunk was scheduled on the audio graph, back to back.
    received = job_value(page, job_id, "job.samples")
    chunks = job_value(page, job_id, "job.chunks.length")
    assert chunks >= 2
    stats = page.evaluate("(id) => window.chorusAudioStats.byJob[id]", job_id)
    assert stats == {"samples": received, "chunks": chunks}
    segments = job_value(page, job_id, "job.player.segments")
    for a, b in pairwise(segments):
        assert b["t0"] >= a["t0"] + a["n"] / a["rate"] - 1e-6, "chunks overlap"

    # The waveform has been drawn.
    drawn = card.locator("canvas.wave").evaluate(
        """(c) => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }""")
    assert drawn > 0

    # Stop the live playback, then play it all again from the start.
    play = card.locator(".job-play")
    if play.get_attribute("aria-pressed") == "true":
        play.click()
    expect(play).to_have_text("Play")
    play.click()
    expect(play).to_have_attribute("aria-pressed", "true")
    replay = page.evaluate("(id) => window.chorusAudioStats.byJob[id + ':replay']", job_id)
    assert replay == {"samples": received, "chunks": 1}

    # Timings from `done`.
    for timing in ("audio", "first_audio", "queue", "total"):
        expect(card.locator(f'dd[data-timing="{timing}"]')).not_to_have_text("–")

    # The WAV download holds exactly the samples received.
    with page.expect_download() as info:
        card.locator(".job-download").click()
    path = info.value.path()
    raw = Path(path).read_bytes()
    assert raw[:4] == b"RIFF" and raw[8:12] == b"WAVE"
    assert len(raw) == 44 + 2 * received
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == received
    shot(page, "06-done")


@pytest.mark.allow_console_errors(r"status of 41[35] ")  # the refused upload, logged by Chromium
def test_upload_a_voice_then_synthesize_with_it(page: Page, chorus_server: ChorusServer, tmp_path: Path):
    open_page(page, chorus_server)
    page.click("label[for=mode-library]")
    add = page.locator("#add-voice")
    if add.get_attribute("open") is None:
        page.click("#add-voice > summary")
    # Something that is not audio: the server's answer shows next to the file control.
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("these are not samples")
    page.set_input_files("#voice-file", str(not_audio))
    page.fill("#voice-text", "Whatever.")
    page.click("#save-voice")
    expect(page.locator("#voice-file-error")).to_be_visible(timeout=LONG)
    shot(page, "07-voice-upload-error")

    page.fill("#voice-name", "Test Narrator")
    page.set_input_files("#voice-file", str(make_wav(tmp_path / "narrator.wav")))
    expect(page.locator("#voice-file-error")).to_be_hidden()
    expect(page.locator("#clip-preview")).to_be_visible()
    page.fill("#voice-text", "This is a short test clip.")
    page.click("#save-voice")

    item = page.locator(".voice-item", has_text="Test Narrator")
    expect(item).to_be_visible(timeout=LONG)
    expect(item.locator('input[type="radio"]')).to_be_checked()
    expect(page.locator("#voice-form-error")).to_be_hidden()
    shot(page, "08-voice-saved")

    card, job_id = generate(page, "Speaking with a saved voice.")
    expect(card.locator(".job-meta")).to_contain_text("Voice: Test Narrator")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    assert page.evaluate("(id) => window.chorusAudioStats.byJob[id].samples", job_id) > 0

    # Delete asks once more, then removes it from the library.
    delete = item.locator("button.icon-button")
    delete.click()
    expect(delete).to_have_class(re.compile("confirming"))
    delete.click()
    expect(item).to_have_count(0, timeout=LONG)


def test_record_a_voice_from_the_microphone(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    page.click("label[for=mode-library]")
    add = page.locator("#add-voice")
    if add.get_attribute("open") is None:
        page.click("#add-voice > summary")
    record = page.locator("#record-button")
    record.click()
    expect(record).to_have_attribute("aria-pressed", "true")
    expect(record).to_contain_text(re.compile(r"Stop · [1-9]"), timeout=LONG)  # a second or more
    record.click()
    expect(page.locator("#clip-status")).to_contain_text("Recorded")
    expect(page.locator("#clip-preview")).to_be_visible()
    page.fill("#voice-name", "Microphone")
    page.fill("#voice-text", "A beep from the fake microphone.")
    page.click("#save-voice")
    item = page.locator(".voice-item", has_text="Microphone")
    expect(item).to_be_visible(timeout=LONG)
    delete = item.locator("button.icon-button")
    delete.click()
    delete.click()
    expect(item).to_have_count(0, timeout=LONG)


def test_designed_voice(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    page.click("label[for=mode-design]")
    page.select_option("#design-gender", "male")
    page.select_option("#design-age", "elderly")
    page.check("#design-whisper")
    page.fill("#text", "A designed voice, speaking softly.")
    page.focus("#text")
    cards = page.locator("li.job")
    page.keyboard.press("Control+Enter")  # the keyboard shortcut generates
    expect(cards).to_have_count(1)
    card = cards.first
    expect(card.locator(".job-meta")).to_contain_text("Designed: male, elderly, whisper")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)


def test_two_jobs_at_once(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    record_job_events(page)
    set_knobs(page, chunk_threshold=0, chunk_seconds=2)
    first, first_id = generate(page, " ".join(SENTENCES))
    second, second_id = generate(page, " ".join(reversed(SENTENCES)))
    expect(first).to_have_attribute("data-state", "done", timeout=LONG)
    expect(second).to_have_attribute("data-state", "done", timeout=LONG)
    shot(page, "09-two-jobs")
    page.set_viewport_size({"width": 375, "height": 812})
    shot(page, "10-two-jobs-phone")

    log = events(page)
    sent_second = next(i for i, e in enumerate(log) if e[0] == second_id and e[1] == "state")
    done_first = next(i for i, e in enumerate(log) if e[0] == first_id and e[2] == "done")
    assert sent_second < done_first, "the second request was not in flight alongside the first"
    # Heard one after the other: the second once the first has played.
    expect(second).to_have_attribute("data-playback", "playing", timeout=LONG)
    for job_id in (first_id, second_id):
        stats = page.evaluate("(id) => window.chorusAudioStats.byJob[id]", job_id)
        assert stats["samples"] == job_value(page, job_id, "job.samples") > 0


def test_out_of_range_knob_shows_the_servers_error(page: Page, chorus_server: ChorusServer):
    card, _ = run_job(page, chorus_server, "This request asks for too many steps.", "error", num_step=100)
    expect_knob_error(page, "num_step", "options.num_step")
    expect(card.locator(".job-error")).to_contain_text("invalid_request")
    shot(page, "11-knob-error")

    # Editing the knob clears its error; a bad seed lands next to the seed.
    page.fill("#knob-num_step", "8")
    expect(page.locator("#knob-num_step-error")).to_be_hidden()
    page.fill("#knob-seed", "not-a-number")
    card, _ = generate(page)
    expect(card).to_have_attribute("data-state", "error", timeout=LONG)
    expect(page.locator("#knob-seed-error")).to_contain_text("seed")

    # A 64-bit seed is sent exactly and accepted.
    page.fill("#knob-seed", "9223372036854775807")
    card, _ = generate(page)
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)


def test_cancel_stops_a_job(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    # Many chunks of many steps: far more work than it takes to cancel.
    set_knobs(page, chunk_threshold=0, chunk_seconds=1, num_step=64)
    card, job_id = generate(page, " ".join(SENTENCES * 12))
    expect(card).to_have_attribute("data-state", re.compile("running|streaming"), timeout=LONG)
    card.locator(".job-cancel").click()
    expect(card).to_have_attribute("data-state", "cancelled", timeout=LONG)
    expect(card.locator(".job-cancel")).to_be_hidden()
    shot(page, "12-cancelled")
    progress = float(card.get_attribute("data-progress") or 0)
    assert progress < 100
    samples_at_cancel = job_value(page, job_id, "job.samples")
    expected_chunks = job_value(page, job_id, "job.expectedChunks")
    assert job_value(page, job_id, "job.chunks.length") < expected_chunks

    # Nothing more arrives for it: a later request on the same socket finishes first.
    set_knobs(page, num_step=8, chunk_threshold=30)
    later, _ = generate(page, "After the cancel.")
    expect(later).to_have_attribute("data-state", "done", timeout=LONG)
    assert job_value(page, job_id, "job.samples") == samples_at_cancel
    expect(card).to_have_attribute("data-state", "cancelled")
