"""The results' heading at phone and desktop widths: "Results", *Play one at a time* and
*Clear finished* stay apart (side by side or on lines of their own, never drawn over or
against each other), before any result and once one has finished; no console errors.

Waits are on conditions, never on elapsed time.
"""

from __future__ import annotations

import pytest
from browser_harness import ChorusServer, open_page, run_job, shot
from playwright.sync_api import Page, expect

GAP = 4  # px: the least room between two of the heading's controls (touching reads as one)


def apart(a: dict, b: dict, gap: float = GAP) -> bool:
    """Whether two bounding boxes are at least `gap` apart, across or down."""
    return (a["x"] + a["width"] + gap <= b["x"] or b["x"] + b["width"] + gap <= a["x"]
            or a["y"] + a["height"] + gap <= b["y"] or b["y"] + b["height"] + gap <= a["y"])


def check_heading(page: Page, width: int, when: str) -> None:
    boxes = {}
    for name, selector in (("heading", "#jobs-title"), ("toggle", "label[for=play-one-at-a-time]"),
                           ("clear", "#clear-finished")):
        if page.locator(selector).is_visible():
            boxes[name] = page.locator(selector).bounding_box()
    assert {"heading", "toggle"} <= boxes.keys(), f"at {width} px ({when}): shown: {sorted(boxes)}"
    names = sorted(boxes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert apart(boxes[a], boxes[b]), f"at {width} px ({when}): {a} {boxes[a]} against {b} {boxes[b]}"
    head = page.locator(".jobs-head").bounding_box()
    assert head and all(box["x"] + box["width"] <= head["x"] + head["width"] + 0.5 for box in boxes.values()), \
        f"at {width} px ({when}): a control sticks out of the heading's row {head}: {boxes}"


@pytest.mark.parametrize("width", [375, 1280])
def test_results_heading_and_play_one_at_a_time_do_not_overlap(page: Page, chorus_server: ChorusServer,
                                                               console, width: int):
    page.set_viewport_size({"width": width, "height": 900})
    open_page(page, chorus_server)
    check_heading(page, width, "no results yet")
    # A finished result shows *Clear finished* in the same row.
    run_job(page, chorus_server, "Short and sweet.", "done", num_step=4)
    expect(page.locator("#clear-finished")).to_be_visible()
    shot(page, f"results-head-{width}")
    check_heading(page, width, "a result finished")
    assert console.errors == []
