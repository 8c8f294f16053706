"""The page's fixes in a real Chromium against a real `chorus serve`: the Record button's
label, overall progress, one result heard at a time, a clip used once, errors placed by the
`field` the server names.

Waits are on conditions, never on elapsed time.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from browser_harness import (
    LONG,
    SENTENCES,
    ChorusServer,
    expect_knob_error,
    generate,
    job_value,
    make_wav,
    open_page,
    run_job,
    set_knobs,
    shot,
)
from playwright.sync_api import Page, expect


def open_add_voice(page: Page) -> None:
    page.click("label[for=mode-library]")
    if page.locator("#add-voice").get_attribute("open") is None:
        page.click("#add-voice > summary")


def test_record_button_says_record_once_stopped(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    open_add_voice(page)
    record = page.locator("#record-button")
    record.click()
    expect(record).to_contain_text(re.compile(r"Stop · [1-9]"), timeout=LONG)
    record.click()
    # The clip is made once the recorder has flushed its last samples: by then any late
    # level report has come and gone, and the button must still offer a new recording.
    expect(page.locator("#clip-status")).to_contain_text("Recorded")
    expect(record).to_have_attribute("aria-pressed", "false")
    expect(record.locator(".rec-text")).to_have_text("Record")
    assert "recording" not in (record.get_attribute("class") or "")


def test_progress_label_tells_the_whole_request(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    page.evaluate(
        """() => {
      window.__labels = [];
      new MutationObserver(() => {
        const card = document.querySelector("li.job");
        if (!card) return;
        const job = window.chorus.jobs.get(card.dataset.jobId);
        window.__labels.push({
          text: card.querySelector(".job-progress-text").textContent,
          value: Number(card.querySelector(".progress").getAttribute("aria-valuenow")),
          received: job ? job.chunks.length : 0,
          state: card.dataset.state,
        });
      }).observe(document.getElementById("job-list"), { subtree: true, childList: true, characterData: true,
                                                        attributes: true, attributeFilter: ["aria-valuenow"] });
    }"""
    )
    set_knobs(page, chunk_threshold=0, chunk_seconds=1)
    card, job_id = generate(page, " ".join(SENTENCES))
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    expected = job_value(page, job_id, "job.expectedChunks")
    assert expected >= 3
    labels = [e for e in page.evaluate("window.__labels") if e["state"] in ("running", "streaming")]
    shaped = [e for e in labels if re.fullmatch(r"\d+% · \d+ of \d+ chunks ready", e["text"])]
    assert shaped, labels
    assert not any("step" in e["text"] for e in labels), labels
    last = -1
    for e in shaped:
        pct, ready, total = map(int, re.findall(r"\d+", e["text"]))
        assert pct == e["value"], e  # the label and the bar say the same
        assert total == expected and ready <= e["received"], e
        assert pct >= last, labels  # overall progress never goes back
        last = pct
    assert any(0 < int(e["text"].split("%")[0]) < 100 for e in shaped)


def playing(page: Page, job_id: str) -> bool:
    return job_value(page, job_id, "job.isPlaying()")


def test_results_play_one_at_a_time_and_play_now_jumps(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    expect(page.locator("#play-one-at-a-time")).to_be_checked()
    set_knobs(page, num_step=8)
    # A long result (some half a minute of audio) is heard while the others arrive.
    first, first_id = generate(page, " ".join(SENTENCES * 3))
    expect(first).to_have_attribute("data-playback", "playing", timeout=LONG)

    second, second_id = generate(page, "A second result waits for its turn.")
    expect(second).to_have_attribute("data-state", "done", timeout=LONG)
    expect(second).to_have_attribute("data-playback", "queued")
    expect(second.locator(".job-queue")).to_have_text("Plays next")
    expect(second.locator(".job-play")).to_have_text("Play now")
    assert page.evaluate("(id) => window.chorusAudioStats.byJob[id]", second_id) is None  # not a sample yet
    assert playing(page, first_id)
    shot(page, "16-queued-result")

    # "Play now" stops the first and plays the second from its start.
    second.locator(".job-play").click()
    expect(second).to_have_attribute("data-playback", "playing")
    assert not playing(page, first_id)
    expect(first).not_to_have_attribute("data-playback", "playing")
    received = job_value(page, second_id, "job.samples")
    assert page.evaluate("(id) => window.chorusAudioStats.byJob[id].samples", second_id) == received

    # A third waits while the second plays, then follows it without overlapping.
    third, third_id = generate(page, "And a third one follows.")
    expect(third).to_have_attribute("data-state", "done", timeout=LONG)
    expect(third).to_have_attribute("data-playback", "playing", timeout=LONG)
    before = job_value(page, second_id, "job.player.segments")
    after = job_value(page, third_id, "job.player.segments")
    end_of_second = max(s["t0"] + s["n"] / s["rate"] for s in before)
    assert min(s["t0"] for s in after) >= end_of_second - 1e-6, "two results overlapped"

    # With "one at a time" off, a new result plays at once, beside the one playing.
    page.uncheck("#play-one-at-a-time")
    fourth, _ = generate(page, " ".join(SENTENCES))
    expect(fourth).to_have_attribute("data-playback", "playing", timeout=LONG)


def test_a_clip_used_once_is_sent_as_the_reference_and_not_saved(page: Page, chorus_server: ChorusServer,
                                                                 tmp_path: Path):
    sent: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(json.loads(payload))
                                          if isinstance(payload, str) else None))
    open_page(page, chorus_server)
    open_add_voice(page)
    page.set_input_files("#voice-file", str(make_wav(tmp_path / "once.wav")))
    page.fill("#voice-text", "This is a short test clip.")
    page.fill("#voice-name", "Just once")
    page.click("#use-once")
    once = page.locator("#voice-opt-clip-once")
    expect(once).to_be_checked()
    expect(page.locator('.voice-item[data-voice-id="__clip_once__"]')).to_contain_text("Unsaved clip · Just once")
    shot(page, "17-clip-once")

    card, job_id = generate(page, "Speaking with a clip that is not saved.")
    expect(card.locator(".job-meta")).to_contain_text("Voice: Unsaved clip")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    request = next(m for m in sent if m.get("type") == "synthesize" and m["id"] == job_id)
    assert request["voice"] is None
    assert request["reference"]["text"] == "This is a short test clip."
    assert request["reference"]["audio"] == base64.b64encode((tmp_path / "once.wav").read_bytes()).decode()
    voices = page.evaluate("fetch('/v1/voices').then((r) => r.json())")
    listed = voices if isinstance(voices, list) else voices.get("voices", voices.get("data", []))
    assert not any(v.get("name") == "Just once" for v in listed)


def test_errors_go_where_the_field_says(page: Page, chorus_server: ChorusServer):
    # The server's error frames pass through a WebSocket route that rewrites the message into
    # one naming another field: the page must go by `field`, never by the words.
    def relay(ws):
        server = ws.connect_to_server()

        def from_server(message):
            if isinstance(message, str):
                frame = json.loads(message)
                if frame.get("type") == "error" and frame.get("field"):
                    frame["message"] = "text: this message names the wrong control on purpose"
                    message = json.dumps(frame)
            ws.send(message)

        server.on_message(from_server)

    page.route_web_socket(re.compile(r"/v1/stream"), relay)
    run_job(page, chorus_server, "Guidance far out of range.", "error", guidance_scale=50)
    expect_knob_error(page, "guidance_scale", "names the wrong control")
    expect(page.locator("#text-error")).to_be_hidden()
    shot(page, "18-field-error")
