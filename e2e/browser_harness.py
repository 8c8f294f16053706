"""Shared by the browser tests: starting a real `chorus serve`, and Chromium's settings."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Locator, Page, expect

from server.cli.launcher import ServerStartError
from tests.support.serverproc import LaunchedServer

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these, Chromium's own background connections on a closed network make
    # it refuse connections many at a time.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Playback starts with the first chunk, without a click on the page first.
    "--autoplay-policy=no-user-gesture-required",
    # A fake microphone (a beep) for the recorder, granted without a prompt.
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
]


class ChorusServer(LaunchedServer):
    """A demo-checkpoint `chorus serve` (the shared launcher, its child forked by
    `tests.support.forkserver`) with its cache folder."""

    def __init__(self, workdir: Path, name: str, extra_args: list[str], cache_dir: Path):
        env = dict(os.environ, CHORUS_CACHE_DIR=str(cache_dir))
        env.pop("CHORUS_MODEL", None)
        env.pop("CHORUS_API_KEY", None)
        super().__init__(["--voices-dir", str(workdir / "voices"), *extra_args], ARTIFACTS / f"{name}.log",
                         env=env, cwd=REPO)
        self.workdir = workdir
        self.cache_dir = cache_dir


def start_server(workdir: Path, name: str, extra_args: list[str] | None = None,
                 cache_dir: Path | None = None) -> ChorusServer:
    """`python -m server serve` on the demo checkpoint, once it listens (`restart` keeps the port)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.log").unlink(missing_ok=True)
    server = ChorusServer(workdir, name, list(extra_args or []), cache_dir or workdir / "cache")
    try:
        return server.start()
    except ServerStartError as exc:
        pytest.fail(str(exc))


# ------------------------------------------------------------------------------ page helpers

LONG = 60_000  # ms: generous limits for a busy 2-core machine
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech arrives one chunk at a time.",
    "Each chunk starts playing as soon as it is ready.",
    "Nothing waits for the whole utterance to finish.",
]


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")  # sticky panels sit where they belong
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_page(page: Page, server: ChorusServer) -> None:
    page.goto(server.url + "/")
    expect(page.locator("#conn-status")).to_have_attribute("data-state", "open", timeout=LONG)


def record_job_events(page: Page) -> None:
    """Log every state change and progress value of every job card, in order."""
    page.evaluate(
        """() => {
      window.__events = [];
      new MutationObserver((records) => {
        for (const r of records) {
          const card = r.target.closest("li.job");
          if (!card) continue;
          if (r.attributeName === "data-state") window.__events.push([card.dataset.jobId, "state", card.dataset.state]);
          if (r.attributeName === "aria-valuenow")
            window.__events.push([card.dataset.jobId, "progress", Number(r.target.getAttribute("aria-valuenow"))]);
        }
      }).observe(document.getElementById("job-list"), {
        subtree: true, attributes: true, attributeFilter: ["data-state", "aria-valuenow"],
      });
    }"""
    )


def events(page: Page) -> list[list]:
    return page.evaluate("window.__events")


def set_knobs(page: Page, **values) -> None:
    advanced = page.locator("#advanced")
    if advanced.get_attribute("open") is None:
        page.click("#advanced > summary")
    for name, value in values.items():
        page.fill(f"#knob-{name}", str(value))


def generate(page: Page, text: str | None = None) -> tuple[Locator, str]:
    """Press Generate; returns the new card and its request id."""
    if text is not None:
        page.fill("#text", text)
    cards = page.locator("li.job")
    before = cards.count()
    page.click("#generate")
    expect(cards).to_have_count(before + 1)
    card = cards.first  # newest first
    job_id = card.get_attribute("data-job-id")
    assert job_id
    return page.locator(f'li.job[data-job-id="{job_id}"]'), job_id


def run_job(page: Page, server: ChorusServer, text: str, state: str, **knobs) -> tuple[Locator, str]:
    """Open the page, set `knobs`, generate `text`; returns the card once it reached `state`."""
    open_page(page, server)
    set_knobs(page, **knobs)
    card, job_id = generate(page, text)
    expect(card).to_have_attribute("data-state", state, timeout=LONG)
    return card, job_id


def expect_knob_error(page: Page, knob: str, text: str) -> None:
    """The error shown beside the knob the server's `field` named, and the knob marked invalid."""
    error = page.locator(f"#knob-{knob}-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(text)
    expect(page.locator(f"#knob-{knob}")).to_have_attribute("aria-invalid", "true")


def job_value(page: Page, job_id: str, expression: str):
    return page.evaluate(f"(id) => {{ const job = window.chorus.jobs.get(id); return {expression}; }}", job_id)


def make_wav(path: Path, seconds: float = 2.0, rate: int = 16000) -> Path:
    """A speech-like clip: a gliding harmonic tone in syllable-rate bursts."""
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    clip = 0.3 * voice * np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    return path
