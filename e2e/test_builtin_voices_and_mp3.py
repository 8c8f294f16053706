"""The page offers the server's built-in voices, and downloads a result as MP3 (made by
`/v1/audio/speech` from the same request and seed), decoded back here by libsndfile."""

from __future__ import annotations

import io
import json
from pathlib import Path

import soundfile as sf
from browser_harness import LONG, ChorusServer, generate, job_value, open_page, run_job, set_knobs, shot
from playwright.sync_api import Page, expect

BUILTIN = ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
           "marin", "cedar"]


def test_builtin_voices_are_offered_and_used(page: Page, chorus_server: ChorusServer):
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))
                                          if isinstance(payload, str) else None))
    open_page(page, chorus_server)
    page.click("label[for=mode-library]")
    group = page.locator("#builtin-list .voice-item")
    expect(group).to_have_count(len(BUILTIN), timeout=LONG)
    assert sorted(group.evaluate_all("(items) => items.map((i) => i.dataset.voiceId)")) == sorted(BUILTIN)
    expect(page.locator("#builtin-list button")).to_have_count(0)  # not deletable
    page.click("label[for=voice-opt-coral]")
    shot(page, "20-builtin-voices")
    set_knobs(page, num_step=8)
    card, job_id = generate(page, "A built-in voice.")
    expect(card.locator(".job-meta")).to_contain_text("Voice: Coral")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    request = next(m for m in sent if m.get("id") == job_id)
    assert request["voice"] == "coral" and request["reference"] is None


def test_download_as_mp3(page: Page, chorus_server: ChorusServer):
    card, job_id = run_job(page, chorus_server, "Downloaded as an MP3 file.", "done", num_step=8)
    mp3 = card.locator(".job-mp3")
    expect(mp3).to_be_visible()
    with page.expect_download(timeout=LONG) as info:
        mp3.click()
    download = info.value
    assert download.suggested_filename.endswith(".mp3")
    data = Path(download.path()).read_bytes()
    audio, rate = sf.read(io.BytesIO(data))
    assert rate == 24000 and len(audio) > rate // 2
    # The same request and seed: the same length as what was heard, give or take the
    # encoder's padding.
    received = job_value(page, job_id, "job.samples")
    assert abs(len(audio) - received) <= 4800, (len(audio), received)
    expect(card.locator(".job-error")).to_be_hidden()
