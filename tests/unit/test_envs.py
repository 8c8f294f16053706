"""The environment registry: every variable read through `server/envs.py`, parsed at each access,
and the table in docs/deploy.md the registry's own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from server import envs

REPO = Path(__file__).resolve().parents[2]


def test_a_switch_is_read_when_accessed(monkeypatch):
    monkeypatch.delenv("CHORUS_DECODE_GRAPHS", raising=False)
    assert envs.CHORUS_DECODE_GRAPHS is True
    monkeypatch.setenv("CHORUS_DECODE_GRAPHS", "0")
    assert envs.CHORUS_DECODE_GRAPHS is False
    monkeypatch.setenv("CHORUS_SMALL_ATTENTION_ROWS", "512")
    assert envs.CHORUS_SMALL_ATTENTION_ROWS == 512
    monkeypatch.setenv("CHORUS_MODEL", "")
    assert envs.CHORUS_MODEL is None  # empty is unset
    monkeypatch.setenv("CHORUS_PAGE_EMBEDS_KEY", "yes")
    assert envs.CHORUS_PAGE_EMBEDS_KEY is True


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="CHORUS_NOT_A_SWITCH"):
        envs.CHORUS_NOT_A_SWITCH  # noqa: B018


def test_every_switch_is_described_once():
    names = [s.name for s in envs.SWITCHES]
    assert len(names) == len(set(names))
    assert all(s.doc and "\n" not in s.doc for s in envs.SWITCHES)


def test_nothing_but_the_registry_reads_the_environment():
    """`os.environ.get`, `os.environ[...]` reads and `os.getenv` only in `server/envs.py` (writes,
    and a child's copy of the whole environment, are not reads of a switch)."""
    readers = []
    for path in (REPO / "server").rglob("*.py"):
        if path.name == "envs.py" and path.parent.name == "server":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.func if isinstance(node, ast.Call) else None
            if isinstance(call, ast.Attribute) and ast.unparse(call) in ("os.environ.get", "os.getenv"):
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if (isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"
                    and isinstance(node.ctx, ast.Load)):
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not readers, readers


def test_the_deploy_docs_list_the_registry():
    assert envs.markdown_table() in (REPO / "docs" / "deploy.md").read_text()
