"""Browser tests: a real `chorus serve` (tiny random demo checkpoint) driven by headless Chromium.

Chromium is Debian's (`/usr/bin/chromium`, installed by `scripts/test.sh`); Playwright only
drives it. Screenshots of the main states go to `e2e/artifacts/` (ignored by git), with
the server's log.
"""

from __future__ import annotations

import os
import re

import pytest
from browser_harness import CHROMIUM, CHROMIUM_ARGS, ChorusServer, start_server


@pytest.fixture(scope="session")
def browser_executable() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing (scripts/test.sh installs Debian's chromium)"
        if os.environ.get("CHORUS_E2E_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture(scope="session")
def chorus_server(tmp_path_factory, browser_executable) -> ChorusServer:
    server = start_server(tmp_path_factory.mktemp("e2e-server"), "server")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser(browser_executable):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_executable, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class ConsoleLog:
    """Console errors and uncaught exceptions of one page."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_console(self, message) -> None:
        if message.type == "error":
            self.errors.append(f"console.error: {message.text}")

    def on_page_error(self, error) -> None:
        self.errors.append(f"uncaught: {error}")


@pytest.fixture
def console() -> ConsoleLog:
    return ConsoleLog()


@pytest.fixture
def page(request, browser, chorus_server, console):
    """A fresh desktop-sized page; the test fails on console errors or uncaught exceptions
    (tests that expect some mark themselves `allow_console_errors`)."""
    context = browser.new_context(viewport={"width": 1360, "height": 1000}, accept_downloads=True)
    context.grant_permissions(["microphone"], origin=chorus_server.url)
    page = context.new_page()
    page.on("console", console.on_console)
    page.on("pageerror", console.on_page_error)
    page.set_default_timeout(30_000)
    yield page
    context.close()
    marker = request.node.get_closest_marker("allow_console_errors")
    if marker is not None and not marker.args:
        return
    allowed = [re.compile(pattern) for pattern in (marker.args if marker else ())]
    errors = [e for e in console.errors if not any(p.search(e) for p in allowed)]
    assert errors == [], "the page logged errors:\n" + "\n".join(errors)


def pytest_configure(config) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)  # a busy 2-core machine is slow, not broken
    config.addinivalue_line("markers", "allow_console_errors(*patterns): the test expects browser console "
                            "errors (those matching a pattern; all of them without one)")


def pytest_itemcollected(item) -> None:
    """Every test here drives the browser (marker `browser`: out of a plain `pytest`, run by
    `pytest -m browser e2e` in a process of its own, as Playwright's sync API keeps an event
    loop running in it)."""
    item.add_marker(pytest.mark.browser)
