"""Phone numbers spelled digit by digit before English normalisation: the forms a listener hears
as phone numbers, and nothing that only looks like one (decimals, dates, ranges, quantities)."""

from __future__ import annotations

import pytest

from server.text.phone_numbers import spell_phone_numbers


@pytest.mark.parametrize("written, spoken", [
    ("Call 555-1234.", "Call five five five, one two three four."),
    ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
    ("Text 555.123.4567 anytime.", "Text five five five, one two three, four five six seven anytime."),
    ("Dial 1-800-555-0199.", "Dial one, eight zero zero, five five five, zero one nine nine."),
    ("Our number is +1 415 555 2671.", "Our number is plus one, four one five, five five five, two six seven one."),
    ("In an emergency, dial 911.", "In an emergency, dial nine one one."),
])
def test_phone_numbers_are_spelled(written, spoken):
    assert spell_phone_numbers(written) == spoken


@pytest.mark.parametrize("written", [
    "It costs 3.50 dollars.", "Join 1,000 people.", "On 2024-01-05 we met.", "Read pages 10-20.",
    "The ratio is 555.1234.", "We sold 911 cars.", "Flight 555 1234 left.", "Score 12-1234 won.",
])
def test_what_only_looks_like_one_is_left_alone(written):
    assert spell_phone_numbers(written) == written
