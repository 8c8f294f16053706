"""The client example in docs/protocol.md runs as written against a real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import soundfile as sf

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def test_protocol_doc_client_example_runs(chorus_server, tmp_path):
    section = DOC.read_text().split("## A streaming client", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "stream_client.py"
    script.write_text(code)
    out = tmp_path / "out.wav"
    result = subprocess.run([sys.executable, str(script), chorus_server.ws_url, str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "done:" in result.stdout and "audio chunk 0" in result.stdout
    samples, rate = sf.read(out, dtype="int16")
    assert rate == 24000 and samples.size > 0
