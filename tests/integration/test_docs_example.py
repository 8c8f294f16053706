"""The client example in docs/protocol.md runs as written against a real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import soundfile as sf

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def run_doc_example(heading: str, server, tmp_path) -> tuple[subprocess.CompletedProcess, Path]:
    """The first Python block under `heading` in docs/protocol.md, run against `server`; it
    writes its audio to the returned path."""
    section = DOC.read_text().split(heading, 1)[1]
    script = tmp_path / "example.py"
    script.write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    out = tmp_path / "example.wav"
    result = subprocess.run([sys.executable, str(script), server.ws_url, str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result, out


def test_protocol_doc_client_example_runs(chorus_server, tmp_path):
    result, out = run_doc_example("## A streaming client", chorus_server, tmp_path)
    assert "done:" in result.stdout and "audio chunk 0" in result.stdout
    samples, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and samples.size > 0


def test_protocol_doc_agent_example_runs(chorus_server, tmp_path):
    """The voice-agent example: an LLM-like token stream spoken segment by segment."""
    result, out = run_doc_example("## A voice-agent client (text streamed in)", chorus_server, tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0] == "segment 0 at 0.00 s: Sure!"
    assert lines[1].startswith("segment 1 at ") and lines[1].endswith(
        ": Dr. Lee can see you at 3.5 hours past noon, that is 3:30 p.m.")
    assert lines[2].endswith(": Shall I book it?") and lines[3].endswith(": I will send a reminder the day before.")
    assert lines[4].startswith("done: ") and ", voice kept as kept-" in lines[4]  # the first turn keeps it
    assert lines[5] == "segment 0 at 0.00 s: Done." and lines[6].endswith(": You are booked for tomorrow.")
    assert lines[7].startswith("done: ") and "voice kept" not in lines[7]  # the second names it
    samples, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and samples.size > 0
