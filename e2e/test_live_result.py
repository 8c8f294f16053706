"""The page's live mode ends in a result card (replay, WAV, captions from the segments), shows
only the settings a stream uses, and "use this clip once" asks for the transcript up front.
A real Chromium against a real `chorus serve`; waits are on conditions."""

from __future__ import annotations

from pathlib import Path

from browser_harness import LONG, ChorusServer, make_wav, open_page, run_job, set_knobs, shot
from playwright.sync_api import Page, expect
from test_page_fixes import open_add_voice

TYPED = "The first sentence is here. And a second one follows it. "
NOT_FOR_STREAMS = ("chunk_seconds", "chunk_threshold", "first_chunk_seconds", "stream")


def test_live_mode_hides_what_streams_do_not_use_and_ends_in_a_result_card(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    set_knobs(page, num_step=8)
    for name in NOT_FOR_STREAMS:
        expect(page.locator(f'#knobs [data-knob="{name}"]')).to_be_visible()
    page.click("label[for=mode-live]")
    for name in NOT_FOR_STREAMS:
        expect(page.locator(f'#knobs [data-knob="{name}"]')).to_be_hidden()
    expect(page.locator("#knob-num_step")).to_be_visible()

    page.click("#live-start")
    expect(page.locator("#live-field")).to_have_attribute("data-live", "open", timeout=LONG)
    page.locator("#live-text").press_sequentially(TYPED, delay=15)
    expect(page.locator(".live-segment:not(.pending)")).to_have_count(2, timeout=LONG)
    page.click("#live-stop")
    expect(page.locator("#live-state")).to_have_text("Finished", timeout=LONG)

    card = page.locator("li.job").first
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    expect(card.locator(".job-title")).to_contain_text("Live · The first sentence is here.")
    expect(card.locator(".job-meta")).to_contain_text("2 segments")
    expect(card.locator(".job-download")).to_be_visible()
    cues = card.locator(".cue-list li")  # word by word: the server's word timings
    expect(cues).to_have_count(len(TYPED.split()))
    expect(cues.nth(len(TYPED.split()) - 1)).to_contain_text("it.")
    with page.expect_download() as caught:
        card.locator(".job-captions").click()
    vtt = Path(caught.value.path()).read_text()
    assert vtt.startswith("WEBVTT") and "00:00:00.000 --> " in vtt and "\nsecond\n" in vtt
    with page.expect_download() as caught:
        card.locator(".job-download").click()
    wav = Path(caught.value.path()).read_bytes()
    assert wav[:4] == b"RIFF" and len(wav) > 44

    card.locator(".job-play").click()  # the stream is over: the card replays it
    expect(card).to_have_attribute("data-playback", "playing", timeout=LONG)
    shot(page, "20-live-result")

    page.click("label[for=mode-text]")  # back to whole texts: every setting again
    for name in NOT_FOR_STREAMS:
        expect(page.locator(f'#knobs [data-knob="{name}"]')).to_be_visible()


def test_a_whole_text_result_has_word_captions(page: Page, chorus_server: ChorusServer):
    card, _ = run_job(page, chorus_server, "Captions come word by word.", "done", num_step=8)
    expect(card.locator(".job-captions")).to_be_visible()
    expect(card.locator(".cue-list li")).to_have_count(5)
    expect(card.locator(".cue-list li").nth(4)).to_contain_text("word.")


def test_clip_used_once_asks_for_its_transcript_up_front(page: Page, chorus_server: ChorusServer, tmp_path: Path):
    open_page(page, chorus_server)
    open_add_voice(page)
    page.set_input_files("#voice-file", str(make_wav(tmp_path / "once.wav")))
    page.click("#use-once")
    error = page.locator("#voice-text-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("needs its transcript")
    expect(page.locator("#voice-text")).to_be_focused()
    expect(page.locator("#voice-text")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#voice-opt-clip-once")).to_have_count(0)  # not taken without it
    page.fill("#voice-text", "This is a short test clip.")
    page.click("#use-once")
    expect(page.locator("#voice-opt-clip-once")).to_be_checked()
    expect(error).to_be_hidden()
