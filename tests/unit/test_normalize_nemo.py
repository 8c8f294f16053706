"""NeMo's grammar cache: built once into `CHORUS_CACHE_DIR` (one builder at a time, the others
wait and load), published whole (a build cut short leaves nothing a later process would load),
readable by another user, the checkout's used where the cache dir has none, compiled in memory
where the cache cannot be written; a server starts a background build only where no cache is
built and nobody builds one. NeMo itself is faked
here (its real build takes a minute or more): what is tested is Chorus's handling of it."""

from __future__ import annotations

import stat
import threading
import time

import pytest

from server.text import normalize_nemo


class _Fake:
    def __init__(self, folder):
        self.folder = folder

    def normalize(self, text, punct_post_process=False):
        return text


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """The cache under `tmp_path`; NeMo's construction faked: with a folder it writes its grammar
    there unless present (as NeMo's `cache_dir` does). Yields the folders it was given."""
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(normalize_nemo, "CHECKOUT_CACHE", tmp_path / "checkout")
    calls = []

    def construct(folder):
        calls.append(folder)
        if folder is not None and not (folder / "grammar.far").exists():
            time.sleep(0.3)  # a build takes a while: a second process meanwhile waits for it
            (folder / "grammar.far").write_text("fst")
        return _Fake(folder)

    monkeypatch.setattr(normalize_nemo, "_construct", construct)
    return calls


def test_built_once_then_loaded_from_the_cache(builds):
    final = normalize_nemo.cache_dir()
    assert not normalize_nemo.is_built()
    threads = [threading.Thread(target=normalize_nemo._load_or_build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert normalize_nemo.is_built() and (final / "grammar.far").read_text() == "fst"
    assert [folder for folder in builds if folder != final] and builds.count(final) == 1  # one built, one loaded
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert [p.name for p in final.parent.iterdir() if p.name.startswith(".nemo-build-")] == []
    assert normalize_nemo._load_or_build().folder == final


def test_a_cache_left_incomplete_is_built_again(builds):
    final = normalize_nemo.cache_dir()
    final.mkdir(parents=True)
    (final / "grammar.far").write_text("half")  # no completion marker: a build was cut short
    normalize_nemo._load_or_build()
    assert normalize_nemo.is_built() and (final / "grammar.far").read_text() == "fst"


def test_a_cache_that_cannot_be_written_compiles_in_memory(builds, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path / "a-file"))
    assert normalize_nemo._load_or_build().folder is None


def test_the_background_build_starts_only_where_needed(builds, monkeypatch):
    started = []

    class Popen:
        def __init__(self, args, **kwargs):
            started.append(args)

        def poll(self):
            return None

    monkeypatch.setattr(normalize_nemo, "available", lambda: True)
    monkeypatch.setattr(normalize_nemo.subprocess, "Popen", Popen)
    monkeypatch.setattr(normalize_nemo, "_builder", None)
    with normalize_nemo._build_lock():  # another process is building it
        normalize_nemo.start_background_build()
    assert started == []
    normalize_nemo.start_background_build()
    normalize_nemo.start_background_build()  # one builder at a time
    assert len(started) == 1 and started[0][-2:] == ["server.text.normalize_nemo", "--low-priority"]
    monkeypatch.setattr(normalize_nemo, "_builder", None)
    normalize_nemo._load_or_build()
    normalize_nemo.start_background_build()  # built: nothing to do
    assert len(started) == 1


def test_the_checkouts_cache_serves_a_server_with_a_cache_dir_of_its_own(builds, monkeypatch, tmp_path):
    monkeypatch.delenv("CHORUS_CACHE_DIR")
    normalize_nemo._load_or_build()
    checkout = normalize_nemo.built_dir()  # built where a plain checkout builds it
    assert checkout == normalize_nemo.cache_dir() and checkout.parent == tmp_path / "checkout"
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path / "own"))
    assert normalize_nemo.built_dir() == checkout and normalize_nemo._load_or_build().folder == checkout
    assert not (tmp_path / "own").exists()  # nothing compiled again
