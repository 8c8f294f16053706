"""The page's pronunciation lexicon against a real server: add, see it listed, edit, an error
beside the field the server names, delete."""

from __future__ import annotations

import pytest
from browser_harness import ChorusServer, open_page, shot
from playwright.sync_api import Page, expect


def listed(page: Page) -> list[dict]:
    return page.evaluate("fetch('/v1/pronunciations').then((r) => r.json())")["pronunciations"]


@pytest.mark.allow_console_errors(r"status of 422")  # the refused form, on purpose
def test_lexicon_is_listed_added_edited_and_deleted(page: Page, chorus_server: ChorusServer):
    open_page(page, chorus_server)
    page.click("#lexicon > summary")
    expect(page.locator("#lexicon-empty")).to_be_visible()
    page.fill("#lexicon-text", "Chorus")
    page.fill("#lexicon-say", "[K AO1 R AH0 S]")
    page.click("#lexicon-add")
    item = page.locator(".lexicon-item")
    expect(item).to_have_count(1)
    expect(item).to_contain_text("Chorus")
    expect(item).to_contain_text("[K AO1 R AH0 S]")
    expect(page.locator("#lexicon-note")).to_have_text("1")
    assert [(e["text"], e["say"], e["voice"]) for e in listed(page)] == [("Chorus", "[K AO1 R AH0 S]", None)]

    # A form that is not CMU: the server's message beside "Say", the entry kept as it was.
    item.get_by_role("button", name="Edit the pronunciation of Chorus").click()
    page.fill("#lexicon-say", "[K AO R AH0 S]")
    page.click("#lexicon-add")
    expect(page.locator("#lexicon-say-error")).to_contain_text("not a CMU phone")
    expect(page.locator("#lexicon-say")).to_have_attribute("aria-invalid", "true")
    assert [e["say"] for e in listed(page)] == ["[K AO1 R AH0 S]"]

    page.fill("#lexicon-say", "Koruss")
    page.click("#lexicon-add")
    expect(page.locator(".lexicon-item .lexicon-say")).to_have_text("Koruss")
    assert [e["say"] for e in listed(page)] == ["Koruss"]
    shot(page, "21-pronunciations")

    page.locator(".lexicon-item").get_by_role("button", name="Delete the pronunciation of Chorus").click()
    expect(page.locator(".lexicon-item")).to_have_count(0)
    assert listed(page) == []
