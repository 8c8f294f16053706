"""The README's curl, `openai` and WebSocket snippets run as printed against a real server
(only its address changed), and what they save decodes back with an independent decoder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import av
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
PRINTED_URL = "http://127.0.0.1:8000"


def snippets(language: str) -> list[str]:
    """The README's code blocks in `language` under "## Call it"."""
    section = (ROOT / "README.md").read_text().split("## Call it", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def run(command: list[str], server, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_curl_snippet_saves_a_wav(chorus_server, tmp_path):
    (block,) = snippets("bash")
    run(["bash", "-c", block.replace(PRINTED_URL, chorus_server.url)], chorus_server, tmp_path)
    samples, rate = sf.read(tmp_path / "hello.wav", dtype="int16")
    assert rate == 24000 and samples.size > 0


def test_the_openai_and_websocket_snippets_run(chorus_server, tmp_path):
    openai_block, ws_block = snippets("python")
    script = tmp_path / "openai_snippet.py"
    script.write_text(openai_block.replace(PRINTED_URL, chorus_server.url))
    run([sys.executable, str(script)], chorus_server, tmp_path)
    with av.open(str(tmp_path / "hello.mp3")) as container:
        frames = sum(frame.samples for frame in container.decode(audio=0))
    assert frames > 0

    script = tmp_path / "ws_snippet.py"
    script.write_text(ws_block.replace(PRINTED_URL, chorus_server.url))
    result = run([sys.executable, str(script)], chorus_server, tmp_path, env={"PYTHONPATH": str(ROOT / "client")})
    assert int(re.fullmatch(r"(\d+) samples\n", result.stdout).group(1)) > 0
