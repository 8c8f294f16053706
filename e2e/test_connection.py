"""The page against a server with an API key, and across a lost connection (a server restart)."""

from __future__ import annotations

import re

import pytest
from browser_harness import LONG, SENTENCES, ChorusServer, generate, set_knobs, shot, start_server
from playwright.sync_api import Page, expect

KEY = "e2e-secret-key"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, browser_executable, chorus_server: ChorusServer):
    workdir = tmp_path_factory.mktemp("e2e-keyed")
    # Reuse the demo checkpoint the first server made. A short drain: the lost-connection
    # test stops it with a request in flight.
    server = start_server(workdir, "server-keyed", ["--api-key", KEY, "--drain-seconds", "1"],
                          cache_dir=chorus_server.cache_dir)
    yield server
    server.stop()


def test_a_page_with_the_key_embedded_connects_at_once(page: Page, tmp_path_factory, chorus_server: ChorusServer):
    server = start_server(tmp_path_factory.mktemp("e2e-embedded"), "server-embedded",
                          ["--api-key", KEY, "--page-embeds-key"], cache_dir=chorus_server.cache_dir)
    try:
        page.goto(server.url + "/")
        expect(page.locator("#conn-status")).to_have_attribute("data-state", "open", timeout=LONG)
        expect(page.locator("#apikey-panel")).not_to_have_attribute("open", "")
        card, _ = generate(page, "Embedded key.")
        expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    finally:
        page.goto("about:blank")  # leave before the server goes, or the page tries to reconnect
        server.stop()


def test_api_key_is_asked_for_kept_and_sent(page: Page, keyed_server: ChorusServer):
    page.goto(keyed_server.url + "/")
    pill = page.locator("#conn-status")
    expect(pill).to_have_attribute("data-state", "auth", timeout=LONG)
    expect(page.locator("#apikey-panel")).to_have_attribute("open", "")
    expect(page.locator("#api-key-error")).to_contain_text("needs an API key")
    shot(page, "13-api-key-needed")

    page.fill("#api-key", "wrong-key")
    page.click("#apikey-form button[type=submit]")
    expect(page.locator("#api-key-error")).to_contain_text("did not accept", timeout=LONG)

    page.fill("#api-key", KEY)
    page.click("#apikey-form button[type=submit]")
    expect(pill).to_have_attribute("data-state", "open", timeout=LONG)
    # HTTP calls carry it too: the voice library loads.
    page.click("label[for=mode-library]")
    expect(page.locator("#voice-empty")).to_be_visible()
    expect(page.locator("#voices-load-error")).to_be_hidden()
    page.click("label[for=mode-auto]")
    card, _ = generate(page, "Authorised speech.")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)

    # Kept in this browser: a reload connects straight away.
    page.reload()
    expect(pill).to_have_attribute("data-state", "open", timeout=LONG)


@pytest.mark.allow_console_errors  # Chromium logs each refused reconnection attempt
def test_lost_connection_is_shown_and_reestablished(page: Page, keyed_server: ChorusServer):
    page.add_init_script(f"localStorage.setItem('chorus.apiKey', {KEY!r})")
    page.goto(keyed_server.url + "/")
    pill = page.locator("#conn-status")
    expect(pill).to_have_attribute("data-state", "open", timeout=LONG)

    # A long request is in flight when the server goes away.
    set_knobs(page, chunk_threshold=0, chunk_seconds=1, num_step=64)
    card, _ = generate(page, " ".join(SENTENCES * 12))
    expect(card).to_have_attribute("data-state", re.compile("running|streaming"), timeout=LONG)
    keyed_server.stop()

    expect(pill).to_have_attribute("data-state", re.compile("lost|connecting"), timeout=LONG)
    banner = page.locator("#conn-banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Reconnecting")
    expect(card).to_have_attribute("data-state", re.compile("cancelled|error"), timeout=LONG)
    shot(page, "14-connection-lost")

    # The server comes back on the same address; the page reconnects by itself.
    keyed_server.restart()
    expect(pill).to_have_attribute("data-state", "open", timeout=LONG)
    expect(banner).to_be_hidden()
    set_knobs(page, num_step=8, chunk_threshold=30)
    card, _ = generate(page, "Back again.")
    expect(card).to_have_attribute("data-state", "done", timeout=LONG)
    shot(page, "15-reconnected")
