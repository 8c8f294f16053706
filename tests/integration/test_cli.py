"""The command line: make-checkpoint, the serve announcement, the boot check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import pytest

from server.engine import upstream


def test_make_checkpoint_cli(tmp_path):
    out = tmp_path / "ck"
    result = subprocess.run(
        [sys.executable, "-m", "server", "make-checkpoint", "--size", "tiny", "--out", str(out), "--seed", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "noise" in result.stdout
    assert (out / "config.json").is_file() and (out / "audio_tokenizer" / "config.json").is_file()


def test_serve_demo_announces_and_answers(tmp_path):
    env = dict(os.environ, CHORUS_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    env.pop("CHORUS_MODEL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "serve", "--port", "0", "--voices-dir", str(tmp_path / "voices")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(r"Chorus listening on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line
        with urllib.request.urlopen(match.group(1) + "/healthz", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(match.group(1) + "/readyz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "RANDOM-WEIGHT demo checkpoint" in err
    assert (tmp_path / "cache" / "demo-tiny-seed0" / "config.json").is_file()


def test_boot_check_names_missing(monkeypatch):
    assert upstream.check_upstream().version == "0.2.1"
    monkeypatch.setattr(upstream, "REQUIRED_NAMES", upstream.REQUIRED_NAMES + (("omnivoice.utils.text", "_gone_"),))
    with pytest.raises(upstream.UpstreamMismatch, match=r"omnivoice\.utils\.text\._gone_"):
        upstream.check_upstream()
