"""The normalisation scorer (`bench.normalization`): the set's compact readings expand to every
variant, outputs are compared as the docs say (case and punctuation aside), and the set is what
docs/normalization.md describes (at least 60 items, every category the issue names)."""

from __future__ import annotations

from bench.normalization import Item, canonical, expand, is_exact, load_set, score, token_score


def test_patterns_expand_to_every_variant():
    assert sorted(expand("three dollars (and) fifty (cents)")) == sorted([
        "three dollars and fifty cents", "three dollars and fifty ", "three dollars  fifty cents",
        "three dollars  fifty "])
    assert sorted(expand("in {two thousand (and) five|twenty {oh|o} five}")) == sorted([
        "in two thousand and five", "in two thousand  five", "in twenty oh five", "in twenty o five"])
    assert expand("dev {dash|} team") == ["dev dash team", "dev  team"]


def test_outputs_are_compared_without_case_or_punctuation():
    assert canonical("It's 7:05 P.M.,  o'clock — twenty-one!") == "it s 7 05 p m o clock twenty one"
    item = Item("money", "$3.50", tuple(canonical(r) for r in expand("three dollars (and) fifty (cents)")))
    assert is_exact("Three dollars, fifty.", item) and not is_exact("three point five dollars", item)
    assert token_score("three dollars fifty cents", item.accepted) == 1.0
    assert token_score("three point five dollars", item.accepted) == 0.25  # 3 of 4 words wrong
    assert token_score("", item.accepted) == 0.0
    result = score(["three fifty dollars", "three dollars fifty"], [item, item])
    assert (result["exact"], result["by_category"], len(result["misses"])) == (1, {"money": "1/2"}, 1)


def test_the_set_covers_what_a_tts_meets():
    items = load_set()
    assert len(items) >= 60 and len({item.written for item in items}) == len(items)
    assert {item.category for item in items} == {
        "money", "thousands", "decimals", "percentages", "phone", "times", "dates", "years", "ordinals", "units",
        "abbreviations", "ranges", "urls", "email"}
    assert all(item.accepted and all(reading == canonical(reading) for reading in item.accepted) for item in items)
    assert is_exact("One thousand people came.", next(i for i in items if i.written == "1,000 people came."))
