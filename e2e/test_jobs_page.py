"""The Jobs tab against a real server: a pasted text and a JSONL file each run as a job to the end,
the progress bar following `GET /v1/jobs/{id}` as the page polls it; an item and the zip download
and are read back by independent readers (libsndfile, zipfile); a job is cancelled; the job list
comes back after a reload; refusals show beside their control; at phone and desktop widths, with
no console errors.

Waits are on conditions, never on elapsed time.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

import pytest
import soundfile as sf
from browser_harness import LONG, ChorusServer, shot
from playwright.sync_api import Page, expect

CHAPTER = ("The rain had not stopped for three days. Mara watched it from the window of the old station, "
           "counting the trains that did not come.\n\n"
           "On the fourth morning the sky cleared. She packed her bag, locked the door behind her and "
           "walked down to the platform, where a single carriage was waiting.")


def open_jobs(page: Page, server: ChorusServer, width: int = 1280) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(server.url + "/#jobs")
    expect(page.locator("#conn-status")).to_have_attribute("data-state", "open", timeout=LONG)
    expect(page.locator("#jobs-panel")).to_be_visible()
    expect(page.locator("#tab-jobs")).to_have_attribute("aria-selected", "true")


def polls(page: Page) -> list[str]:
    """The job routes the page calls, in order."""
    calls: list[str] = []
    page.on("request", lambda r: calls.append(f"{r.method} {r.url.split('/v1/', 1)[1]}") if "/v1/jobs" in r.url
            else None)
    return calls


def card_of(page: Page) -> tuple:
    """The newest job's card (made once the server took the job) and its id."""
    card = page.locator("li.batch-job").first
    expect(card).to_be_visible(timeout=LONG)
    job_id = card.get_attribute("data-job-id")
    assert job_id and job_id.startswith("job-"), job_id
    return page.locator(f'li.batch-job[data-job-id="{job_id}"]'), job_id


@pytest.mark.parametrize("width", [375, 1280])
def test_a_pasted_chapter_runs_to_the_end_and_downloads(page: Page, chorus_server: ChorusServer, width: int):
    calls = polls(page)
    open_jobs(page, chorus_server, width)
    expect(page.locator("#batch-voice")).to_have_value("", timeout=LONG)  # Automatic, until picked
    expect(page.locator("#batch-voice option[value=alloy]")).to_have_count(1, timeout=LONG)
    page.fill("#batch-text", CHAPTER)
    expect(page.locator("#batch-count")).to_have_text(f"{len(CHAPTER)} characters")
    page.select_option("#batch-format", "wav")
    page.fill("#batch-steps", "4")  # no voice: the server keeps the first item's for the rest
    page.click("#batch-submit")
    card, job_id = card_of(page)
    card.locator(".progress").evaluate("""(bar) => {
      window.__progress = [];
      new MutationObserver(() => window.__progress.push(Number(bar.getAttribute("aria-valuenow"))))
        .observe(bar, {attributes: true, attributeFilter: ["aria-valuenow"]});
    }""")
    expect(card).to_have_attribute("data-status", "completed", timeout=LONG)
    shot(page, f"jobs-{width}")

    assert calls[0] == "POST jobs"
    gets = [c for c in calls if c == f"GET jobs/{job_id}"]
    assert gets, calls  # the progress came from polling the job
    view = page.request.get(f"{chorus_server.url}/v1/jobs/{job_id}").json()
    total = view["items_total"]
    assert view["status"] == "completed" and total >= 2 and view["items_done"] == total, view
    expect(card.locator(".progress")).to_have_attribute("aria-valuenow", "100")
    assert page.evaluate("window.__progress")[-1] == 100
    expect(card.locator(".job-progress-text")).to_contain_text(f"{total} items")
    expect(card.locator(".batch-cancel")).to_be_hidden()
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    # one item, decoded by libsndfile
    card.locator(".batch-items > summary").click()
    items = card.locator(".batch-item button")
    expect(items).to_have_count(total)
    # every item said ready by `GET /v1/jobs/{id}/items`: its button on, its file and length named
    expect(card.locator('.batch-item[data-status="done"]')).to_have_count(total, timeout=LONG)
    for k in range(total):
        expect(items.nth(k)).to_be_enabled()
    expect(card.locator(".batch-item-name").nth(1)).to_contain_text(re.compile(r"^0001\.wav · \d+(\.\d)? s$"))
    with page.expect_download(timeout=LONG) as info:
        items.nth(1).click()
    assert info.value.suggested_filename.endswith("0001.wav")
    audio, rate = sf.read(Path(info.value.path()))
    assert rate == 24000 and len(audio) > rate // 4

    # the zip: every item, in order, each a WAV
    with page.expect_download(timeout=LONG) as info:
        card.locator(".batch-archive").click()
    assert info.value.suggested_filename.endswith(".zip")
    with zipfile.ZipFile(info.value.path()) as archive:
        names = archive.namelist()
        assert names == [f"{k:04d}.wav" for k in range(total)]
        for name in names:
            clip, clip_rate = sf.read(io.BytesIO(archive.read(name)))
            assert clip_rate == 24000 and len(clip) > 0
    expect(card.locator(".job-error")).to_be_hidden()


@pytest.mark.allow_console_errors(r"status of 400 ")  # the refused file, logged by Chromium
def test_a_jsonl_file_runs_with_its_own_voices(page: Page, chorus_server: ChorusServer, tmp_path):
    open_jobs(page, chorus_server)
    lines = [{"input": "First line, in one voice.", "voice": "alloy", "num_step": 4},
             {"custom_id": "b", "method": "POST", "url": "/v1/audio/speech",
              "body": {"input": "Second line, in another.", "voice": "echo", "num_step": 4}}]
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    page.set_input_files("#batch-file", str(path))
    expect(page.locator("#batch-file-name")).to_contain_text("batch.jsonl")
    expect(page.locator("#batch-text")).to_be_disabled()
    expect(page.locator("#batch-voice")).to_be_disabled()  # each line says its own
    page.select_option("#batch-format", "flac")
    page.click("#batch-submit")
    card, _ = card_of(page)
    expect(card).to_have_attribute("data-status", "completed", timeout=LONG)
    expect(card.locator(".job-meta")).to_contain_text("JSONL · FLAC")
    expect(card.locator(".job-progress-text")).to_contain_text("2 items")
    card.locator(".batch-items > summary").click()
    with page.expect_download(timeout=LONG) as info:
        card.locator(".batch-item button").first.click()
    audio, rate = sf.read(Path(info.value.path()))
    assert info.value.suggested_filename.endswith("0000.flac") and rate == 24000 and len(audio) > 0

    # a line that is not JSON: refused, said beside the file
    path.write_text(json.dumps(lines[0]) + "\n{not json\n")
    page.click("#batch-file-clear")
    page.set_input_files("#batch-file", str(path))
    page.click("#batch-submit")
    error = page.locator("#batch-file-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("line 2")
    expect(page.locator("li.batch-job")).to_have_count(1)


def test_a_job_is_cancelled_and_the_list_survives_a_reload(page: Page, chorus_server: ChorusServer):
    open_jobs(page, chorus_server)
    # long enough to be running when Cancel is pressed: many items at the full step count
    page.fill("#batch-text", "\n\n".join(f"Paragraph {k}. " + CHAPTER for k in range(30)))
    expect(page.locator("#batch-voice option[value=alloy]")).to_have_count(1, timeout=LONG)
    page.select_option("#batch-voice", "alloy")
    page.click("#batch-submit")
    card, job_id = card_of(page)
    expect(card.locator(".batch-cancel")).to_be_visible()
    # once an item is done it can be fetched; the rest say they are not ready
    expect(card.locator('.batch-item[data-status="done"]').first).to_be_attached(timeout=LONG)
    expect(card.locator('.batch-item[data-status="done"] button').first).to_be_enabled()
    card.locator(".batch-cancel").click()
    expect(card).to_have_attribute("data-status", "cancelled", timeout=LONG)
    cancelled = card.locator('.batch-item[data-status="cancelled"]')
    expect(cancelled.first).to_be_attached(timeout=LONG)
    expect(cancelled.first.locator("button")).to_be_disabled()
    expect(cancelled.first.locator(".batch-item-name")).to_contain_text("cancelled")
    expect(card.locator(".job-progress-text")).to_contain_text("Cancelled after")
    assert page.request.get(f"{chorus_server.url}/v1/jobs/{job_id}").json()["status"] == "cancelled"
    expect(card.locator(".batch-remove")).to_be_visible()

    # the page remembers its jobs: after a reload the card is back, as the server says it is
    page.reload()
    expect(page.locator("#jobs-panel")).to_be_visible()
    again = page.locator(f'li.batch-job[data-job-id="{job_id}"]')
    expect(again).to_have_attribute("data-status", "cancelled", timeout=LONG)
    again.locator(".batch-remove").click()
    expect(again).to_have_count(0)
    page.reload()
    expect(page.locator("#jobs-panel")).to_be_visible()
    expect(page.locator("#batch-empty")).to_be_visible()
    expect(page.locator("li.batch-job")).to_have_count(0)


@pytest.mark.allow_console_errors(r"status of 404 ")  # the refused voice, logged by Chromium
def test_refusals_show_beside_their_control(page: Page, chorus_server: ChorusServer):
    open_jobs(page, chorus_server)
    page.click("#batch-submit")  # nothing to say: the page's own check
    expect(page.locator("#batch-text-error")).to_contain_text("Paste some text")
    expect(page.locator("#batch-text")).to_have_attribute("aria-invalid", "true")
    page.fill("#batch-text", "A fine text.")
    expect(page.locator("#batch-text-error")).to_be_hidden()
    page.fill("#batch-steps", "1000")
    page.click("#batch-submit")
    expect(page.locator("#batch-steps-error")).to_contain_text("1 to 64")
    # the server's refusal names the voice: shown beside the voice picker
    page.fill("#batch-steps", "")
    page.locator("#batch-voice").evaluate("""(select) => {
      select.append(new Option("Nobody", "nobody"));
      select.value = "nobody";
    }""")
    page.click("#batch-submit")
    error = page.locator("#batch-voice-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("nobody")
    expect(page.locator("li.batch-job")).to_have_count(0)
