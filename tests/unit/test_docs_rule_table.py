"""docs/architecture.md's table of request-controlled work names a test for each place: every
test it names exists (the file, and the test function where one is named), so the table stays
true as tests move."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _rule_table() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## Request-controlled work"):]
    section = section[:section.index("\n## ", 3)]
    return [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_place_names_a_test_that_exists():
    rows = _rule_table()
    assert len(rows) >= 8, rows
    for row in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", row.split("|")[-2])
        assert named, f"no test named for: {row}"
        for path, function in named:
            assert (REPO / path).is_file(), path
            if function:
                tree = ast.parse((REPO / path).read_text())
                assert function in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, (path, function)


def test_the_rest_of_a_test_name_resolves_within_its_row():
    """A row's later tests named without their folder live beside its first (`tests/integration/`)."""
    for row in _rule_table():
        cell = row.split("|")[-2]
        first = re.search(r"`(tests/[\w/]+)/[\w]+\.py", cell)
        for bare in re.findall(r"`(test_\w+\.py)`", cell):
            assert first is not None and (REPO / first.group(1) / bare).is_file(), (row, bare)
