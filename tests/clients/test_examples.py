"""Each program in `examples/` runs as printed against a real `chorus serve` and writes
what it says (a WAV file with audio in it; the audiobook job, a zip of its parts)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import wave
import zipfile

import pytest

from tests.clients.chorus_process import ROOT
from tests.clients.conftest import require_framework

EXAMPLES = {
    "ws_client.py": None,
    "voice_agent.py": None,
    "openai_client.py": "openai",
    "pipecat_agent.py": "pipecat",
    "livekit_agent.py": "livekit.agents",
    "dialogue.py": None,
    "audiobook_job.py": None,
}
OUT = {"audiobook_job.py": "chapter.zip"}  # the others write a WAV


def example_env() -> dict[str, str]:
    paths = [str(ROOT / "client"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs(name, chorus_url, tmp_path):
    if EXAMPLES[name]:
        require_framework(EXAMPLES[name])
    out = tmp_path / OUT.get(name, "out.wav")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / name), chorus_url, "--out", str(out),
                          "--num-step", "4"], capture_output=True, text=True, timeout=300, env=example_env())
    assert run.returncode == 0, run.stdout + run.stderr
    if out.suffix == ".wav":
        with wave.open(str(out)) as w:
            assert w.getnframes() > w.getframerate() // 2  # at least half a second of audio
    assert run.stdout.strip()
    if name == "openai_client.py":  # its instructions map whole: said as used, nothing ignored
        assert "instructions used: whisper, british accent" in run.stdout, run.stdout
        assert "ignored" not in run.stdout, run.stdout
    if name == "voice_agent.py":  # one voice: the first turn keeps it, the later turns name it
        kept = re.findall(r"voice kept as (kept-\S+)", run.stdout)
        assert len(kept) == 1, run.stdout
        assert re.findall(r"^turn \d+ \((.*)\):$", run.stdout, re.M) == ["keep_voice", f"voice {kept[0]}",
                                                                      f"voice {kept[0]}"], run.stdout
    if name == "dialogue.py":  # the script's four lines, in order, two voices taking turns
        assert re.findall(r"^line (\d) at .*?\((\w+)\):", run.stdout, re.M) == [
            ("0", "alloy"), ("1", "echo"), ("2", "alloy"), ("3", "echo")], run.stdout
    if name == "audiobook_job.py":  # every part of the chapter, in order, each an MP3
        submitted = re.search(r"^submitted (job-\w+)", run.stdout, re.M)
        saved = re.search(r"^saved .*: (\d+) of (\d+) parts", run.stdout, re.M)
        assert submitted and saved and saved.group(1) == saved.group(2), run.stdout
        with zipfile.ZipFile(out) as z:
            names = z.namelist()
            assert names == [f"{k:04d}.mp3" for k in range(int(saved.group(2)))] and len(names) >= 2, names
            for part in names:
                data = z.read(part)
                assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0), part
        assert "(completed)" in run.stdout, run.stdout
    if "pip install" in (source := (ROOT / "examples" / name).read_text()):  # as a checkout installs it
        assert "chorus-client" not in " ".join(re.findall(r"pip install (.*)", source)), name


def test_every_example_is_tested():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXAMPLES)
    for name in EXAMPLES:
        spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "examples" / name)
        assert spec is not None
        source = (ROOT / "examples" / name).read_text()
        assert source.startswith('"""') and "python examples/" in source
